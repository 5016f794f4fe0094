// Bad input gives mlir-opt style diagnostics on stderr and exit status 1, never a traceback.
// (The Python filecheck has no [[@LINE]] arithmetic: line numbers below are literal.)
// RUN: not %topos-opt %s --split-input-file 2>&1 | filecheck %s

// An op without a location is reported at its position in this file, with
// the line and a caret below.
// CHECK: diagnostic-format.mlir:10:8: error: 'topos.add' op node 1: expects 2 operands (lhs, rhs), got 1
func.func @position_in_this_file(%a: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %1 = "topos.add"(%0) {node = 1 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  return %1 : tensor<2x3xf32>
}
// CHECK-NEXT: {{^}}  %1 = "topos.add"(%0) {node = 1 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
// CHECK-NEXT: {{^}}       ^

// -----

// An op emitted from a recording carries the user's line: the error points there.
// CHECK: model.py:12:0: error: 'topos.sum_along' op node 1: axis 5 is out of range for rank 2 (operands: [2, 3] f32); hint: valid axes are 0..1
func.func @position_of_the_recording(%a: tensor<2x3xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %1 = "topos.sum_along"(%0) {node = 1 : i64, axis = 5 : i64} : (tensor<2x3xf32>) -> tensor<2xf32> loc("%1 sum_along"("model.py":12:0))
  return %1 : tensor<2xf32>
}

// -----

// Syntax errors come from the MLIR parser, at their position in this file.
// CHECK: diagnostic-format.mlir:31:{{[0-9]+}}: error: expected ')' to end operand list
func.func @syntax_error(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "topos.neg"(%a : (tensor<2xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

// Ops of unknown dialects are refused unless --allow-unregistered-dialect.
// CHECK: diagnostic-format.mlir:40:8: error: unregistered operation 'foo.bar' found in dialect ('foo')
func.func @foreign(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "foo.bar"(%a) : (tensor<2xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}

// CHECK-NOT: Traceback
