// Upstream passes run by name. They leave unregistered topos ops alone (no CSE,
// no dead-code removal: MLIR cannot know they are pure), and clean up
// registered ops beside them.
// RUN: %topos-opt %s -p 'builtin.module(canonicalize,cse)' | filecheck %s
// RUN: %topos-opt %s --canonicalize --cse | filecheck %s

// CHECK-LABEL: func.func @main
// CHECK-COUNT-2: "topos.neg"(%0)
// CHECK:         "topos.neg"(%arg1)
// CHECK:         stablehlo.multiply
// CHECK-NOT:     stablehlo.multiply
// CHECK:         return

func.func @main(%a: tensor<2xf32>, %b: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  %1 = "topos.neg"(%0) {node = 1 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  %2 = "topos.neg"(%0) {node = 2 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  %3 = "topos.neg"(%b) {node = 3 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  %4 = stablehlo.multiply %b, %b : tensor<2xf32>
  %5 = stablehlo.multiply %b, %b : tensor<2xf32>
  %6 = stablehlo.add %4, %5 : tensor<2xf32>
  return %1, %2, %6, %3 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
}
