// RUN: %topos-opt %s --split-input-file --topos-lower-to-stablehlo | filecheck %s

// gather copies rows: output = selection.shape + table.shape[1:]. The index vector is an
// explicit trailing axis of one (IREE gathers an implicit one element by element).
// CHECK-LABEL: func.func @gather
// CHECK-NEXT:    %[[I:.+]] = stablehlo.reshape %arg1 : (tensor<2x4xi64>) -> tensor<2x4x1xi64>
// CHECK-NEXT:    %[[R:.+]] = "stablehlo.gather"(%arg0, %[[I]]) <{dimension_numbers = #stablehlo.gather<offset_dims = [2], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 2>, slice_sizes = array<i64: 1, 3>}> : (tensor<5x3xf32>, tensor<2x4x1xi64>) -> tensor<2x4x3xf32>
// CHECK-NEXT:    return %[[R]]
func.func @gather(%arg0: tensor<5x3xf32>, %arg1: tensor<2x4xi64>) -> tensor<2x4x3xf32> {
  %0 = "topos.gather"(%arg0, %arg1) {node = 2 : i64} : (tensor<5x3xf32>, tensor<2x4xi64>) -> tensor<2x4x3xf32>
  return %0 : tensor<2x4x3xf32>
}

// -----

// scatter is stablehlo.scatter adding rows into zeros; StableHLO leaves the order of
// colliding updates to the backend (IREE on llvm-cpu keeps position order: see
// tests/iree/test_conformance.py).
// CHECK-LABEL: func.func @scatter
// CHECK-NEXT:    %[[ROWS:.+]] = stablehlo.reshape %arg0 : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
// CHECK-NEXT:    %[[TARGETS:.+]] = stablehlo.reshape %arg1 : (tensor<2x3xi64>) -> tensor<6x1xi64>
// CHECK-NEXT:    %[[ZEROS:.+]] = stablehlo.constant dense<0.000000e+00> : tensor<5x4xf32>
// CHECK-NEXT:    %[[R:.+]] = "stablehlo.scatter"(%[[ZEROS]], %[[TARGETS]], %[[ROWS]])
// CHECK-SAME:      update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1
// CHECK:           stablehlo.add
// CHECK:         return %[[R]]
func.func @scatter(%arg0: tensor<2x3x4xf32>, %arg1: tensor<2x3xi64>) -> tensor<5x4xf32> {
  %0 = "topos.input"(%arg1) {extent = 5 : i64, node = 1 : i64} : (tensor<2x3xi64>) -> tensor<2x3xi64>
  %1 = "topos.scatter"(%arg0, %0) {extent = 5 : i64, node = 2 : i64} : (tensor<2x3x4xf32>, tensor<2x3xi64>) -> tensor<5x4xf32>
  return %1 : tensor<5x4xf32>
}
