// The generated IRDL file makes iree-opt reject malformed topos ops.
// RUN: iree-opt --irdl-file=%irdl --split-input-file --verify-diagnostics %s

func.func @wrong_operand_count(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  // expected-error @+1 {{expects exactly 2 operands, but got 1}}
  %1 = "topos.add"(%0) {node = 1 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  return %1 : tensor<2xf32>
}

// -----

func.func @elementwise_types_differ(%a: tensor<2xf32>, %b: tensor<3xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  %1 = "topos.parameter"(%b) {node = 1 : i64} : (tensor<3xf32>) -> tensor<3xf32>
  // expected-error @+1 {{expected 'tensor<2xf32>' but got 'tensor<3xf32>'}}
  %2 = "topos.mul"(%0, %1) {node = 2 : i64} : (tensor<2xf32>, tensor<3xf32>) -> tensor<2xf32>
  return %2 : tensor<2xf32>
}

// -----

func.func @missing_node(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  // expected-error @+1 {{attribute "node" is expected but not provided}}
  %1 = "topos.neg"(%0) : (tensor<2xf32>) -> tensor<2xf32>
  return %1 : tensor<2xf32>
}

// -----

func.func @attribute_of_the_wrong_kind(%a: tensor<2x3xf32>) -> tensor<3x2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  // expected-error @+1 {{expected base attribute 'builtin.dense_array' but got 'builtin.array'}}
  %1 = "topos.permute"(%0) {node = 1 : i64, order = [1, 0]} : (tensor<2x3xf32>) -> tensor<3x2xf32>
  return %1 : tensor<3x2xf32>
}

// -----

func.func @unknown_map_function(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  // expected-error @+1 {{'"relu"' does not satisfy the constraint}}
  %1 = "topos.map"(%0) {node = 1 : i64, function = "relu"} : (tensor<2xf32>) -> tensor<2xf32>
  return %1 : tensor<2xf32>
}

// -----

func.func @unknown_op(%a: tensor<2xf32>) -> tensor<2xf32> {
  // expected-error @+1 {{unregistered operation 'topos.relu' found in dialect ('topos') that does not allow unknown operations}}
  %0 = "topos.relu"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
