// topos-plan writes the plan's liveness on every op and its memory summary on @main.
// RUN: %topos-opt %s --topos-plan | filecheck %s

// CHECK-LABEL: func.func @main
// CHECK-SAME:    topos.peak_bytes = 16 : i64, topos.peak_node = 5 : i64
// CHECK-SAME:    topos.retain_all_bytes = 28 : i64
// CHECK:       "topos.parameter"(%arg0) {node = 0 : i64, topos.freed_after = 2 : i64}
// The tanh runs inside the pow's elementwise group, so the matmul lives until the group's root.
// CHECK:       "topos.matmul"(%1, %0) {node = 2 : i64, topos.freed_after = 5 : i64}
// CHECK:       "topos.map"(%2) {function = "tanh", node = 3 : i64, topos.fused_into = 5 : i64}
// CHECK:       "topos.sum"(%5) {node = 6 : i64, topos.kept}
func.func @main(%arg0: tensor<2x2xf32>, %arg1: tensor<1x2xf32>) -> tensor<f32> {
  %0 = "topos.parameter"(%arg0) {node = 0 : i64} : (tensor<2x2xf32>) -> tensor<2x2xf32>
  %1 = "topos.input"(%arg1) {node = 1 : i64} : (tensor<1x2xf32>) -> tensor<1x2xf32>
  %2 = "topos.matmul"(%1, %0) {node = 2 : i64} : (tensor<1x2xf32>, tensor<2x2xf32>) -> tensor<1x2xf32>
  %3 = "topos.map"(%2) {function = "tanh", node = 3 : i64} : (tensor<1x2xf32>) -> tensor<1x2xf32>
  %4 = "topos.leaf"() {node = 4 : i64, value = dense<2.000000e+00> : tensor<1x2xf32>} : () -> tensor<1x2xf32>
  %5 = "topos.pow"(%3, %4) {node = 5 : i64} : (tensor<1x2xf32>, tensor<1x2xf32>) -> tensor<1x2xf32>
  %6 = "topos.sum"(%5) {node = 6 : i64} : (tensor<1x2xf32>) -> tensor<f32>
  return %6 : tensor<f32>
}
