// The whole pipeline (lowering, canonicalize, cse) yields StableHLO that IREE compiles for llvm-cpu.
// RUN: %topos-opt %s -p 'topos-lower-to-stablehlo,canonicalize,cse' | filecheck %s
// RUN: %topos-opt %s -p 'topos-lower-to-stablehlo,canonicalize,cse' | iree-compile - --iree-hal-target-device=local --iree-hal-local-target-device-backends=llvm-cpu --iree-input-type=stablehlo --iree-llvmcpu-target-cpu=generic -o /dev/null

// CHECK-LABEL: func.func @main
// CHECK-DAG:     stablehlo.dot_general %arg2, %arg0
// CHECK-DAG:     stablehlo.tanh
// CHECK-DAG:     "stablehlo.gather"(%arg1, %{{.+}}) {{.*}} (tensor<4x2xf32>, tensor<3x1xi64>)
// CHECK-DAG:     chlo.erf
// CHECK-DAG:     "stablehlo.scatter"
// CHECK-DAG:     stablehlo.reduce({{.*}}) applies stablehlo.add across dimensions = [0] : (tensor<6xf32>, tensor<f32>) -> tensor<f32>
// CHECK:         return
// CHECK-NOT:   topos.
module @topos {
  func.func @main(%arg0: tensor<3x2xf32>, %arg1: tensor<4x2xf32>, %arg2: tensor<3x3xf32>, %arg3: tensor<3xi64>) -> (tensor<f32>, tensor<4x2xf32>) {
    %0 = "topos.parameter"(%arg0) {node = 0 : i64} : (tensor<3x2xf32>) -> tensor<3x2xf32>
    %1 = "topos.parameter"(%arg1) {node = 1 : i64} : (tensor<4x2xf32>) -> tensor<4x2xf32>
    %2 = "topos.input"(%arg2) {node = 2 : i64} : (tensor<3x3xf32>) -> tensor<3x3xf32>
    %3 = "topos.input"(%arg3) {extent = 4 : i64, node = 3 : i64} : (tensor<3xi64>) -> tensor<3xi64>
    %4 = "topos.matmul"(%2, %0) {node = 4 : i64} : (tensor<3x3xf32>, tensor<3x2xf32>) -> tensor<3x2xf32>
    %5 = "topos.gather"(%1, %3) {node = 5 : i64} : (tensor<4x2xf32>, tensor<3xi64>) -> tensor<3x2xf32>
    %6 = "topos.add"(%4, %5) {node = 6 : i64} : (tensor<3x2xf32>, tensor<3x2xf32>) -> tensor<3x2xf32>
    %7 = "topos.map"(%6) {function = "tanh", node = 7 : i64} : (tensor<3x2xf32>) -> tensor<3x2xf32>
    %8 = "topos.map"(%7) {function = "erf", node = 8 : i64} : (tensor<3x2xf32>) -> tensor<3x2xf32>
    %9 = "topos.log_softmax"(%8) {axis = 1 : i64, node = 9 : i64} : (tensor<3x2xf32>) -> tensor<3x2xf32>
    %10 = "topos.sum"(%9) {node = 10 : i64} : (tensor<3x2xf32>) -> tensor<f32>
    %11 = "topos.scatter"(%9, %3) {extent = 4 : i64, node = 11 : i64} : (tensor<3x2xf32>, tensor<3xi64>) -> tensor<4x2xf32>
    return %10, %11 : tensor<f32>, tensor<4x2xf32>
  }
}
