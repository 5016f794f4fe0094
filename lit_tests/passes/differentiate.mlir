// topos-differentiate appends the gradient of node 6 with respect to every parameter,
// recorded by the core's reverse mode, and returns it after the original results.
// RUN: %topos-opt %s --pass-pipeline="topos-differentiate{target=6}" | filecheck %s
// RUN: not %topos-opt %s --pass-pipeline="topos-differentiate{target=2}" 2>&1 | filecheck %s --check-prefix=RANK

// CHECK-LABEL: func.func @main
// CHECK-SAME:    -> (tensor<f32>, tensor<2x2xf32>)
// CHECK:       %[[SEED:.+]] = "topos.leaf"() {node = 7 : i64, value = dense<1.000000e+00> : tensor<f32>}
// CHECK:       "topos.broadcast"(%[[SEED]])
// CHECK:       %[[T:.+]] = "topos.permute"(%1)
// CHECK:       %[[G:.+]] = "topos.matmul"(%[[T]], %{{.+}})
// CHECK:       return %6, %[[G]] : tensor<f32>, tensor<2x2xf32>

// RANK: error: target node 2 has shape [1, 2]; differentiate needs a rank-0 target
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
