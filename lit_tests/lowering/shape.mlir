// RUN: %topos-opt %s --split-input-file --topos-lower-to-stablehlo | filecheck %s

// A volume-1 operand is reshaped to rank 0, then broadcast.
// CHECK-LABEL: func.func @broadcast
// CHECK-NEXT:    %[[S:.+]] = stablehlo.reshape %arg0 : (tensor<1x1xf32>) -> tensor<f32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.broadcast_in_dim %[[S]], dims = [] : (tensor<f32>) -> tensor<2x3xf32>
// CHECK-NEXT:    return %[[R]]
func.func @broadcast(%arg0: tensor<1x1xf32>) -> tensor<2x3xf32> {
  %0 = "topos.broadcast"(%arg0) {node = 1 : i64, shape = array<i64: 2, 3>} : (tensor<1x1xf32>) -> tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}

// -----

// CHECK-LABEL: func.func @broadcast_along
// CHECK-NEXT:    %[[R:.+]] = stablehlo.broadcast_in_dim %arg0, dims = [0, 2] : (tensor<2x3xf32>) -> tensor<2x4x3xf32>
// CHECK-NEXT:    return %[[R]]
func.func @broadcast_along(%arg0: tensor<2x3xf32>) -> tensor<2x4x3xf32> {
  %0 = "topos.broadcast_along"(%arg0) {axis = 1 : i64, extent = 4 : i64, node = 1 : i64} : (tensor<2x3xf32>) -> tensor<2x4x3xf32>
  return %0 : tensor<2x4x3xf32>
}

// -----

// CHECK-LABEL: func.func @reshape_permute
// CHECK-NEXT:    %[[A:.+]] = stablehlo.reshape %arg0 : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.transpose %[[A]], dims = [1, 0] : (tensor<6x4xf32>) -> tensor<4x6xf32>
// CHECK-NEXT:    return %[[B]]
func.func @reshape_permute(%arg0: tensor<2x3x4xf32>) -> tensor<4x6xf32> {
  %0 = "topos.reshape"(%arg0) {node = 1 : i64, shape = array<i64: 6, 4>} : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
  %1 = "topos.permute"(%0) {node = 2 : i64, order = array<i64: 1, 0>} : (tensor<6x4xf32>) -> tensor<4x6xf32>
  return %1 : tensor<4x6xf32>
}

// -----

// narrow is a slice; pad places the operand inside +0.0 along one axis.
// CHECK-LABEL: func.func @narrow_pad
// CHECK-NEXT:    %[[N:.+]] = stablehlo.slice %arg0 [0:3, 2:5] : (tensor<3x6xf32>) -> tensor<3x3xf32>
// CHECK-NEXT:    %[[ZERO:.+]] = stablehlo.constant dense<0.000000e+00> : tensor<f32>
// CHECK-NEXT:    %[[P:.+]] = stablehlo.pad %[[N]], %[[ZERO]], low = [1, 0], high = [2, 0], interior = [0, 0] : (tensor<3x3xf32>, tensor<f32>) -> tensor<6x3xf32>
// CHECK-NEXT:    return %[[P]]
func.func @narrow_pad(%arg0: tensor<3x6xf32>) -> tensor<6x3xf32> {
  %0 = "topos.narrow"(%arg0) {axis = 1 : i64, length = 3 : i64, node = 1 : i64, start = 2 : i64} : (tensor<3x6xf32>) -> tensor<3x3xf32>
  %1 = "topos.pad"(%0) {axis = 0 : i64, extent = 6 : i64, node = 2 : i64, start = 1 : i64} : (tensor<3x3xf32>) -> tensor<6x3xf32>
  return %1 : tensor<6x3xf32>
}

// -----

// Lane j of window i reads element i*step + j*dilation: one strided slice per lane.
// Extent 9, size 3, step 2, dilation 2: count 3; lane j starts at 2j.
// CHECK-LABEL: func.func @unfold
// CHECK-NEXT:    %[[L0:.+]] = stablehlo.slice %arg0 [0:2, 0:5:2] : (tensor<2x9xf32>) -> tensor<2x3xf32>
// CHECK-NEXT:    %[[R0:.+]] = stablehlo.reshape %[[L0]] : (tensor<2x3xf32>) -> tensor<2x3x1xf32>
// CHECK-NEXT:    %[[L1:.+]] = stablehlo.slice %arg0 [0:2, 2:7:2] : (tensor<2x9xf32>) -> tensor<2x3xf32>
// CHECK-NEXT:    %[[R1:.+]] = stablehlo.reshape %[[L1]] : (tensor<2x3xf32>) -> tensor<2x3x1xf32>
// CHECK-NEXT:    %[[L2:.+]] = stablehlo.slice %arg0 [0:2, 4:9:2] : (tensor<2x9xf32>) -> tensor<2x3xf32>
// CHECK-NEXT:    %[[R2:.+]] = stablehlo.reshape %[[L2]] : (tensor<2x3xf32>) -> tensor<2x3x1xf32>
// CHECK-NEXT:    %[[W:.+]] = stablehlo.concatenate %[[R0]], %[[R1]], %[[R2]], dim = 2 : (tensor<2x3x1xf32>, tensor<2x3x1xf32>, tensor<2x3x1xf32>) -> tensor<2x3x3xf32>
// CHECK-NEXT:    return %[[W]]
func.func @unfold(%arg0: tensor<2x9xf32>) -> tensor<2x3x3xf32> {
  %0 = "topos.unfold"(%arg0) {axis = 1 : i64, dilation = 2 : i64, node = 1 : i64, size = 3 : i64, step = 2 : i64} : (tensor<2x9xf32>) -> tensor<2x3x3xf32>
  return %0 : tensor<2x3x3xf32>
}

// -----

// fold adds lane after lane onto +0.0, the reference's order: each lane is a slice
// spread by padding its unit lane axis to the step and merging it into the window
// axis (edge padding only: IREE 3.13 miscompiles interior padding of a padded value,
// iree-pad-of-pad), then placed by an edge pad and added to the running total.
// Extent 6, size 2, step 2, dilation 1: count 3; lane j lands on 2i + j.
// CHECK-LABEL: func.func @fold
// CHECK-NEXT:    %[[TOTAL:.+]] = stablehlo.constant dense<0.000000e+00> : tensor<6xf64>
// CHECK-NEXT:    %[[S0:.+]] = stablehlo.slice %arg0 [0:3, 0:1] : (tensor<3x2xf64>) -> tensor<3x1xf64>
// CHECK-NEXT:    %[[Z0:.+]] = stablehlo.constant dense<0.000000e+00> : tensor<f64>
// CHECK-NEXT:    %[[W0:.+]] = stablehlo.pad %[[S0]], %[[Z0]], low = [0, 0], high = [0, 1], interior = [0, 0] : (tensor<3x1xf64>, tensor<f64>) -> tensor<3x2xf64>
// CHECK-NEXT:    %[[P0:.+]] = stablehlo.reshape %[[W0]] : (tensor<3x2xf64>) -> tensor<6xf64>
// CHECK-NEXT:    %[[T0:.+]] = stablehlo.add %[[TOTAL]], %[[P0]] : tensor<6xf64>
// CHECK-NEXT:    %[[S1:.+]] = stablehlo.slice %arg0 [0:3, 1:2] : (tensor<3x2xf64>) -> tensor<3x1xf64>
// CHECK-NEXT:    %[[Z1:.+]] = stablehlo.constant dense<0.000000e+00> : tensor<f64>
// CHECK-NEXT:    %[[W1:.+]] = stablehlo.pad %[[S1]], %[[Z1]], low = [0, 0], high = [0, 1], interior = [0, 0] : (tensor<3x1xf64>, tensor<f64>) -> tensor<3x2xf64>
// CHECK-NEXT:    %[[M1:.+]] = stablehlo.reshape %[[W1]] : (tensor<3x2xf64>) -> tensor<6xf64>
// CHECK-NEXT:    %[[C1:.+]] = stablehlo.slice %[[M1]] [0:5] : (tensor<6xf64>) -> tensor<5xf64>
// CHECK-NEXT:    %[[Z2:.+]] = stablehlo.constant dense<0.000000e+00> : tensor<f64>
// CHECK-NEXT:    %[[P1:.+]] = stablehlo.pad %[[C1]], %[[Z2]], low = [1], high = [0], interior = [0] : (tensor<5xf64>, tensor<f64>) -> tensor<6xf64>
// CHECK-NEXT:    %[[T1:.+]] = stablehlo.add %[[T0]], %[[P1]] : tensor<6xf64>
// CHECK-NEXT:    return %[[T1]]
func.func @fold(%arg0: tensor<3x2xf64>) -> tensor<6xf64> {
  %0 = "topos.fold"(%arg0) {axis = 0 : i64, dilation = 1 : i64, extent = 6 : i64, node = 1 : i64, size = 2 : i64, step = 2 : i64} : (tensor<3x2xf64>) -> tensor<6xf64>
  return %0 : tensor<6xf64>
}
