// RUN: %topos-opt %s --split-input-file --topos-lower-to-stablehlo | filecheck %s

// CHECK-LABEL: func.func @matmul
// CHECK-NEXT:    %[[R:.+]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT:    return %[[R]]
func.func @matmul(%arg0: tensor<2x3xf32>, %arg1: tensor<3x4xf32>) -> tensor<2x4xf32> {
  %0 = "topos.matmul"(%arg0, %arg1) {node = 2 : i64} : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

// Leading axes are batching dimensions on both sides.
// CHECK-LABEL: func.func @batched
// CHECK-NEXT:    %[[R:.+]] = stablehlo.dot_general %arg0, %arg1, batching_dims = [0, 1] x [0, 1], contracting_dims = [3] x [2] : (tensor<5x2x2x3xf64>, tensor<5x2x3x4xf64>) -> tensor<5x2x2x4xf64>
// CHECK-NEXT:    return %[[R]]
func.func @batched(%arg0: tensor<5x2x2x3xf64>, %arg1: tensor<5x2x3x4xf64>) -> tensor<5x2x2x4xf64> {
  %0 = "topos.matmul"(%arg0, %arg1) {node = 2 : i64} : (tensor<5x2x2x3xf64>, tensor<5x2x3x4xf64>) -> tensor<5x2x2x4xf64>
  return %0 : tensor<5x2x2x4xf64>
}

// -----

// bfloat16 products accumulate in float32 and round once.
// CHECK-LABEL: func.func @matmul_bf16
// CHECK-NEXT:    %[[A:.+]] = stablehlo.convert %arg0 : (tensor<2x3xbf16>) -> tensor<2x3xf32>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.convert %arg1 : (tensor<3x4xbf16>) -> tensor<3x4xf32>
// CHECK-NEXT:    %[[P:.+]] = stablehlo.dot_general %[[A]], %[[B]], contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT:    %[[ROUNDED:.+]] = stablehlo.reduce_precision %[[P]], format = e8m7 : tensor<2x4xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.convert %[[ROUNDED]] : (tensor<2x4xf32>) -> tensor<2x4xbf16>
// CHECK-NEXT:    return %[[R]]
func.func @matmul_bf16(%arg0: tensor<2x3xbf16>, %arg1: tensor<3x4xbf16>) -> tensor<2x4xbf16> {
  %0 = "topos.matmul"(%arg0, %arg1) {node = 2 : i64} : (tensor<2x3xbf16>, tensor<3x4xbf16>) -> tensor<2x4xbf16>
  return %0 : tensor<2x4xbf16>
}

// -----

// A sum to rank 0 reduces a 1-D reshape (GPU targets reject multi-axis full reductions),
// starting from -0.0, the exact additive identity.
// CHECK-LABEL: func.func @sum
// CHECK-NEXT:    %[[FLAT:.+]] = stablehlo.reshape %arg0 : (tensor<2x3x4xf32>) -> tensor<24xf32>
// CHECK-NEXT:    %[[INIT:.+]] = stablehlo.constant dense<-0.000000e+00> : tensor<f32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.reduce(%[[FLAT]] init: %[[INIT]]) applies stablehlo.add across dimensions = [0] : (tensor<24xf32>, tensor<f32>) -> tensor<f32>
// CHECK-NEXT:    return %[[R]]
func.func @sum(%arg0: tensor<2x3x4xf32>) -> tensor<f32> {
  %0 = "topos.sum"(%arg0) {node = 1 : i64} : (tensor<2x3x4xf32>) -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

// The sum of a rank-0 tensor is the tensor itself.
// CHECK-LABEL: func.func @sum_scalar
// CHECK-NEXT:    return %arg0
func.func @sum_scalar(%arg0: tensor<f64>) -> tensor<f64> {
  %0 = "topos.sum"(%arg0) {node = 1 : i64} : (tensor<f64>) -> tensor<f64>
  return %0 : tensor<f64>
}

// -----

// CHECK-LABEL: func.func @sum_along_bf16
// CHECK-NEXT:    %[[WIDE:.+]] = stablehlo.convert %arg0 : (tensor<2x3x4xbf16>) -> tensor<2x3x4xf32>
// CHECK-NEXT:    %[[INIT:.+]] = stablehlo.constant dense<-0.000000e+00> : tensor<f32>
// CHECK-NEXT:    %[[S:.+]] = stablehlo.reduce(%[[WIDE]] init: %[[INIT]]) applies stablehlo.add across dimensions = [1] : (tensor<2x3x4xf32>, tensor<f32>) -> tensor<2x4xf32>
// CHECK-NEXT:    %[[ROUNDED:.+]] = stablehlo.reduce_precision %[[S]], format = e8m7 : tensor<2x4xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.convert %[[ROUNDED]] : (tensor<2x4xf32>) -> tensor<2x4xbf16>
// CHECK-NEXT:    return %[[R]]
func.func @sum_along_bf16(%arg0: tensor<2x3x4xbf16>) -> tensor<2x4xbf16> {
  %0 = "topos.sum_along"(%arg0) {axis = 1 : i64, node = 1 : i64} : (tensor<2x3x4xbf16>) -> tensor<2x4xbf16>
  return %0 : tensor<2x4xbf16>
}
