// RUN: %topos-opt %s --split-input-file --topos-lower-to-stablehlo | filecheck %s

// gather copies rows: output = selection.shape + table.shape[1:].
// CHECK-LABEL: func.func @gather
// CHECK-NEXT:    %[[R:.+]] = "stablehlo.gather"(%arg0, %arg1) <{dimension_numbers = #stablehlo.gather<offset_dims = [2], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 2>, slice_sizes = array<i64: 1, 3>}> : (tensor<5x3xf32>, tensor<2x4xi64>) -> tensor<2x4x3xf32>
// CHECK-NEXT:    return %[[R]]
func.func @gather(%arg0: tensor<5x3xf32>, %arg1: tensor<2x4xi64>) -> tensor<2x4x3xf32> {
  %0 = "topos.gather"(%arg0, %arg1) {node = 2 : i64} : (tensor<5x3xf32>, tensor<2x4xi64>) -> tensor<2x4x3xf32>
  return %0 : tensor<2x4x3xf32>
}

// -----

// scatter adds rows in ascending position order (a while loop over positions), so
// repeated indices accumulate exactly as the reference does; stablehlo.scatter
// leaves the order of colliding updates unspecified.
// CHECK-LABEL: func.func @scatter
// CHECK:         %[[ROWS:.+]] = stablehlo.reshape %arg0 : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
// CHECK-NEXT:    %[[TARGETS:.+]] = stablehlo.reshape %arg1 : (tensor<2x3xi64>) -> tensor<6xi64>
// CHECK-NEXT:    %[[FIRST:.+]] = stablehlo.constant dense<0> : tensor<i64>
// CHECK-NEXT:    %[[ZEROS:.+]] = stablehlo.constant dense<0.000000e+00> : tensor<5x4xf32>
// CHECK-NEXT:    %[[LOOP:.+]]:2 = stablehlo.while(%[[I:.+]] = %[[FIRST]], %[[T:.+]] = %[[ZEROS]]) : tensor<i64>, tensor<5x4xf32>
// CHECK:         stablehlo.compare LT, %[[I]], %{{.+}} : (tensor<i64>, tensor<i64>) -> tensor<i1>
// CHECK:       do {
// CHECK:         %[[TARGET:.+]] = stablehlo.dynamic_slice %[[TARGETS]], %[[I]], sizes = [1] : (tensor<6xi64>, tensor<i64>) -> tensor<1xi64>
// CHECK:         %[[ROW:.+]] = stablehlo.dynamic_slice %[[ROWS]], %[[I]], %{{.+}}, sizes = [1, 4]
// CHECK:         %[[OLD:.+]] = stablehlo.dynamic_slice %[[T]], %{{.+}}, %{{.+}}, sizes = [1, 4]
// CHECK-NEXT:    %[[NEW:.+]] = stablehlo.add %[[OLD]], %[[ROW]] : tensor<1x4xf32>
// CHECK-NEXT:    %[[UPDATED:.+]] = stablehlo.dynamic_update_slice %[[T]], %[[NEW]]
// CHECK:         stablehlo.return %{{.+}}, %[[UPDATED]] : tensor<i64>, tensor<5x4xf32>
// CHECK:       return %[[LOOP]]#1
// CHECK-NOT:   stablehlo.scatter
func.func @scatter(%arg0: tensor<2x3x4xf32>, %arg1: tensor<2x3xi64>) -> tensor<5x4xf32> {
  %0 = "topos.input"(%arg1) {extent = 5 : i64, node = 1 : i64} : (tensor<2x3xi64>) -> tensor<2x3xi64>
  %1 = "topos.scatter"(%arg0, %0) {extent = 5 : i64, node = 2 : i64} : (tensor<2x3x4xf32>, tensor<2x3xi64>) -> tensor<5x4xf32>
  return %1 : tensor<5x4xf32>
}
