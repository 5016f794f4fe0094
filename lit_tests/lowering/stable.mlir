// RUN: %topos-opt %s --split-input-file --topos-lower-to-stablehlo | filecheck %s

// x - peak - log(sum(exp(x - peak))), with a non-finite peak replaced by 0 as in the kernel.
// CHECK-LABEL: func.func @log_softmax
// CHECK-NEXT:    %[[NEG_INF:.+]] = stablehlo.constant dense<0xFF800000> : tensor<f32>
// CHECK-NEXT:    %[[MAX:.+]] = stablehlo.reduce(%arg0 init: %[[NEG_INF]]) applies stablehlo.maximum across dimensions = [1] : (tensor<2x5xf32>, tensor<f32>) -> tensor<2xf32>
// CHECK-NEXT:    %[[FINITE:.+]] = stablehlo.is_finite %[[MAX]] : (tensor<2xf32>) -> tensor<2xi1>
// CHECK-NEXT:    %[[ZERO:.+]] = stablehlo.constant dense<0.000000e+00> : tensor<2xf32>
// CHECK-NEXT:    %[[PEAK:.+]] = stablehlo.select %[[FINITE]], %[[MAX]], %[[ZERO]] : tensor<2xi1>, tensor<2xf32>
// CHECK-NEXT:    %[[PEAKS:.+]] = stablehlo.broadcast_in_dim %[[PEAK]], dims = [0] : (tensor<2xf32>) -> tensor<2x5xf32>
// CHECK-NEXT:    %[[SHIFTED:.+]] = stablehlo.subtract %arg0, %[[PEAKS]] : tensor<2x5xf32>
// CHECK-NEXT:    %[[EXP:.+]] = stablehlo.exponential %[[SHIFTED]] : tensor<2x5xf32>
// CHECK-NEXT:    %[[INIT:.+]] = stablehlo.constant dense<-0.000000e+00> : tensor<f32>
// CHECK-NEXT:    %[[SUM:.+]] = stablehlo.reduce(%[[EXP]] init: %[[INIT]]) applies stablehlo.add across dimensions = [1] : (tensor<2x5xf32>, tensor<f32>) -> tensor<2xf32>
// CHECK-NEXT:    %[[LOG:.+]] = stablehlo.log %[[SUM]] : tensor<2xf32>
// CHECK-NEXT:    %[[LOGS:.+]] = stablehlo.broadcast_in_dim %[[LOG]], dims = [0] : (tensor<2xf32>) -> tensor<2x5xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.subtract %[[SHIFTED]], %[[LOGS]] : tensor<2x5xf32>
// CHECK-NEXT:    return %[[R]]
func.func @log_softmax(%arg0: tensor<2x5xf32>) -> tensor<2x5xf32> {
  %0 = "topos.log_softmax"(%arg0) {axis = 1 : i64, node = 1 : i64} : (tensor<2x5xf32>) -> tensor<2x5xf32>
  return %0 : tensor<2x5xf32>
}

// -----

// peak + log(sum(exp(x - peak))); bfloat16 computes in float32 and rounds once at the end.
// CHECK-LABEL: func.func @logsumexp_bf16
// CHECK-NEXT:    %[[WIDE:.+]] = stablehlo.convert %arg0 : (tensor<4x3xbf16>) -> tensor<4x3xf32>
// CHECK:         %[[MAX:.+]] = stablehlo.reduce(%[[WIDE]] init: %{{.+}}) applies stablehlo.maximum across dimensions = [0] : (tensor<4x3xf32>, tensor<f32>) -> tensor<3xf32>
// CHECK:         %[[PEAK:.+]] = stablehlo.select %{{.+}}, %[[MAX]], %{{.+}} : tensor<3xi1>, tensor<3xf32>
// CHECK:         %[[SUM:.+]] = stablehlo.reduce(%{{.+}} init: %{{.+}}) applies stablehlo.add across dimensions = [0] : (tensor<4x3xf32>, tensor<f32>) -> tensor<3xf32>
// CHECK-NEXT:    %[[LOG:.+]] = stablehlo.log %[[SUM]] : tensor<3xf32>
// CHECK-NEXT:    %[[TOTAL:.+]] = stablehlo.add %[[PEAK]], %[[LOG]] : tensor<3xf32>
// CHECK-NEXT:    %[[ROUNDED:.+]] = stablehlo.reduce_precision %[[TOTAL]], format = e8m7 : tensor<3xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.convert %[[ROUNDED]] : (tensor<3xf32>) -> tensor<3xbf16>
// CHECK-NEXT:    return %[[R]]
func.func @logsumexp_bf16(%arg0: tensor<4x3xbf16>) -> tensor<3xbf16> {
  %0 = "topos.logsumexp"(%arg0) {axis = 0 : i64, node = 1 : i64} : (tensor<4x3xbf16>) -> tensor<3xbf16>
  return %0 : tensor<3xbf16>
}
