// topos-verify reports malformed topos ops at their location, naming the node.
// RUN: %topos-opt %s --split-input-file --verify-diagnostics --topos-verify
// Without the pass flag the same checks run after parsing, as in mlir-opt.
// RUN: %topos-opt %s --split-input-file --verify-diagnostics

func.func @wrong_operand_count(%a: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  // expected-error @+1 {{'topos.add' op node 1: expects 2 operands (lhs, rhs), got 1}}
  %1 = "topos.add"(%0) {node = 1 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  return %1 : tensor<2x3xf32>
}

// -----

func.func @bad_shapes(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>) -> tensor<2x3xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %1 = "topos.parameter"(%b) {node = 1 : i64} : (tensor<3x2xf32>) -> tensor<3x2xf32>
  // expected-error @+1 {{'topos.add' op node 2: shapes [2, 3] and [3, 2] differ}}
  %2 = "topos.add"(%0, %1) {node = 2 : i64} : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x3xf32>
  return %2 : tensor<2x3xf32>
}

// -----

func.func @axis_out_of_range(%a: tensor<2x3xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  // expected-error @+1 {{'topos.sum_along' op node 1: axis 2 is out of range for rank 2}}
  %1 = "topos.sum_along"(%0) {node = 1 : i64, axis = 2 : i64} : (tensor<2x3xf32>) -> tensor<2xf32>
  return %1 : tensor<2xf32>
}

// -----

func.func @attribute_of_the_wrong_kind(%a: tensor<2x3xf32>) -> tensor<3x2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  // expected-error @+1 {{attribute 'order' must be an i64 array}}
  %1 = "topos.permute"(%0) {node = 1 : i64, order = [1, 0]} : (tensor<2x3xf32>) -> tensor<3x2xf32>
  return %1 : tensor<3x2xf32>
}

// -----

func.func @result_type_disagrees_with_the_shape_rule(%a: tensor<2x3xf32>) -> tensor<3x3xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  // expected-error @+1 {{result type tensor<3x3xf32> differs from tensor<2x2xf32>}}
  %1 = "topos.narrow"(%0) {node = 1 : i64, axis = 1 : i64, start = 1 : i64, length = 2 : i64} : (tensor<2x3xf32>) -> tensor<3x3xf32>
  return %1 : tensor<3x3xf32>
}

// -----

func.func @unknown_map_function(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  // expected-error @+1 {{attribute 'function' is "relu", expected one of exp}}
  %1 = "topos.map"(%0) {node = 1 : i64, function = "relu"} : (tensor<2xf32>) -> tensor<2xf32>
  return %1 : tensor<2xf32>
}

// -----

func.func @unknown_op(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  // expected-error @+1 {{unknown op 'topos.relu'}}
  %1 = "topos.relu"(%0) {node = 1 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  return %1 : tensor<2xf32>
}

// -----

func.func @selection_out_of_range(%t: tensor<3x2xf32>) -> tensor<2x2xf32> {
  %0 = "topos.parameter"(%t) {node = 0 : i64} : (tensor<3x2xf32>) -> tensor<3x2xf32>
  // expected-error @+1 {{selection index 3 at (1,) is outside [0, 3)}}
  %1 = "topos.leaf"() {node = 1 : i64, extent = 3 : i64, value = dense<[0, 3]> : tensor<2xi64>} : () -> tensor<2xi64>
  %2 = "topos.gather"(%0, %1) {node = 2 : i64} : (tensor<3x2xf32>, tensor<2xi64>) -> tensor<2x2xf32>
  return %2 : tensor<2x2xf32>
}

// -----

func.func @gather_extent_differs_from_table_rows(%t: tensor<3x2xf32>) -> tensor<2x2xf32> {
  %0 = "topos.parameter"(%t) {node = 0 : i64} : (tensor<3x2xf32>) -> tensor<3x2xf32>
  %1 = "topos.leaf"() {node = 1 : i64, extent = 4 : i64, value = dense<[0, 3]> : tensor<2xi64>} : () -> tensor<2xi64>
  // expected-error @+1 {{table [3, 2] has 3 rows but the selection indexes 4}}
  %2 = "topos.gather"(%0, %1) {node = 2 : i64} : (tensor<3x2xf32>, tensor<2xi64>) -> tensor<2x2xf32>
  return %2 : tensor<2x2xf32>
}

// -----

func.func @node_index_used_twice(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  // expected-error @+1 {{node index 0 is already used by topos.parameter}}
  %1 = "topos.neg"(%0) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  return %1 : tensor<2xf32>
}

// -----

func.func @missing_node_index(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  // expected-error @+1 {{'topos.neg' op node ?: needs the attribute `node = <index> : i64`}}
  %1 = "topos.neg"(%0) : (tensor<2xf32>) -> tensor<2xf32>
  return %1 : tensor<2xf32>
}
