// RUN: %topos-opt %s --topos-lower-to-stablehlo | filecheck %s

// parameter and input become their function arguments; a leaf becomes a constant with its bits.
// CHECK-LABEL: func.func @main(%arg0: tensor<2xf32>, %arg1: tensor<2xf32>)
// CHECK-NEXT:    %[[LEAF:.+]] = stablehlo.constant dense<[1.500000e+00, -0.000000e+00]> : tensor<2xf32>
// CHECK-NEXT:    %[[A:.+]] = stablehlo.add %arg0, %arg1 : tensor<2xf32>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.add %[[A]], %[[LEAF]] : tensor<2xf32>
// CHECK-NEXT:    %[[PICKS:.+]] = stablehlo.constant dense<[1, 0]> : tensor<2xi64>
// CHECK-NEXT:    return %[[B]], %[[PICKS]], %arg0
// CHECK-NOT:   topos.
module @topos {
  func.func @main(%arg0: tensor<2xf32>, %arg1: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xi64>, tensor<2xf32>) {
    %0 = "topos.parameter"(%arg0) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
    %1 = "topos.input"(%arg1) {node = 1 : i64} : (tensor<2xf32>) -> tensor<2xf32>
    %2 = "topos.leaf"() {node = 2 : i64, value = dense<[1.5, -0.0]> : tensor<2xf32>} : () -> tensor<2xf32>
    %3 = "topos.add"(%0, %1) {node = 3 : i64} : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %4 = "topos.add"(%3, %2) {node = 4 : i64} : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %5 = "topos.leaf"() {extent = 3 : i64, node = 5 : i64, value = dense<[1, 0]> : tensor<2xi64>} : () -> tensor<2xi64>
    return %4, %5, %0 : tensor<2xf32>, tensor<2xi64>, tensor<2xf32>
  }
}
