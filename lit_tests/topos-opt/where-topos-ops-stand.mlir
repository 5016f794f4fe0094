// Topos IR is `func.func @main(...) { <topos ops> return ... }`. MLIR cannot
// check unregistered ops for this, so topos-opt does: an op outside a function
// body, a body that lost its `return`, a tensor too big for a 64-bit size.
// RUN: %topos-opt %s --split-input-file --verify-diagnostics
// RUN: not %topos-opt %s --split-input-file 2>&1 | filecheck %s

// CHECK: where-topos-ops-stand.mlir:12:6: error: 'topos.leaf' op node 0: topos ops belong in the body of a func.func, not in 'builtin.module'
// CHECK-NOT: Traceback

// A bare op at the top level: parsing wraps it in a module, as mlir-opt does.
// expected-error @below {{topos ops belong in the body of a func.func, not in 'builtin.module'}}
%0 = "topos.leaf"() {node = 0 : i64, value = dense<1.0> : tensor<2xf32>} : () -> tensor<2xf32>

// -----

func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  // expected-error @below {{block with no terminator: 'topos.parameter' ends the body of a func.func}}
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
}

// -----

func.func @main(%a: tensor<99999999999x99999999999xf32>) -> tensor<f32> {
  // expected-error @below {{tensor<99999999999x99999999999xf32> would hold 4e+22 bytes, more than a 64-bit size can count}}
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<99999999999x99999999999xf32>) -> tensor<99999999999x99999999999xf32>
  // expected-error @below {{'topos.sum' op node 1: tensor<99999999999x99999999999xf32> would hold}}
  %1 = "topos.sum"(%0) {node = 1 : i64} : (tensor<99999999999x99999999999xf32>) -> tensor<f32>
  return %1 : tensor<f32>
}
