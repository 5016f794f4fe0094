// The worked example of docs/dialect.md: a pass in a Python module, loaded
// into topos-opt with --load-pass-module, with an option.
// RUN: %topos-opt %s --load-pass-module consumers_pass --topos-count-consumers | filecheck %s
// RUN: %topos-opt %s --load-pass-module consumers_pass -p 'topos-count-consumers{minimum=0},topos-verify' | filecheck %s
// RUN: not %topos-opt %s --load-pass-module consumers_pass --topos-count-consumers=minimum=2 2>&1 | filecheck %s --check-prefix=FAIL

// CHECK: "topos.parameter"(%arg0) {node = 0 : i64, topos.consumers = 2 : i64}
// CHECK: "topos.neg"(%0) {node = 1 : i64, topos.consumers = 1 : i64}
// CHECK: "topos.add"(%1, %0) {node = 2 : i64, topos.consumers = 1 : i64}
// FAIL: example-pass.mlir:14:8: error: node 1 has 1 readers, fewer than 2

func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  %1 = "topos.neg"(%0) {node = 1 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  %2 = "topos.add"(%1, %0) {node = 2 : i64} : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  return %2 : tensor<2xf32>
}
