// RUN: %topos-opt %s --split-input-file --topos-lower-to-stablehlo | filecheck %s

// Each map function is one StableHLO op; erf is chlo.erf, which IREE's input pipeline legalizes.
// float32 sin is mirrored for negative arguments (IREE's approximation loses small negative x),
// and a zero argument is its own sine (IREE's gives +0 for -0).
// CHECK-LABEL: func.func @functions
// CHECK-NEXT:    %[[EXP:.+]] = stablehlo.exponential %arg0 : tensor<3xf32>
// CHECK-NEXT:    %[[LOG:.+]] = stablehlo.log %[[EXP]] : tensor<3xf32>
// CHECK-NEXT:    %[[SQRT:.+]] = stablehlo.sqrt %[[LOG]] : tensor<3xf32>
// CHECK-NEXT:    %[[TANH:.+]] = stablehlo.tanh %[[SQRT]] : tensor<3xf32>
// CHECK-NEXT:    %[[ZERO:.+]] = stablehlo.constant dense<0.000000e+00> : tensor<3xf32>
// CHECK-NEXT:    %[[NEGATIVE:.+]] = stablehlo.compare LT, %[[TANH]], %[[ZERO]]
// CHECK-NEXT:    %[[FLIPPED:.+]] = stablehlo.negate %[[TANH]] : tensor<3xf32>
// CHECK-NEXT:    %[[SINE:.+]] = stablehlo.sine %[[FLIPPED]] : tensor<3xf32>
// CHECK-NEXT:    %[[MIRRORED:.+]] = stablehlo.negate %[[SINE]] : tensor<3xf32>
// CHECK-NEXT:    %[[DIRECT:.+]] = stablehlo.sine %[[TANH]] : tensor<3xf32>
// CHECK-NEXT:    %[[VALUE:.+]] = stablehlo.select %[[NEGATIVE]], %[[MIRRORED]], %[[DIRECT]]
// CHECK-NEXT:    %[[ISZERO:.+]] = stablehlo.compare EQ, %[[TANH]], %[[ZERO]]
// CHECK-NEXT:    %[[SIN:.+]] = stablehlo.select %[[ISZERO]], %[[TANH]], %[[VALUE]]
// CHECK-NEXT:    %[[COS:.+]] = stablehlo.cosine %[[SIN]] : tensor<3xf32>
// CHECK-NEXT:    %[[LOG1P:.+]] = stablehlo.log_plus_one %[[COS]] : tensor<3xf32>
// CHECK-NEXT:    %[[EXPM1:.+]] = stablehlo.exponential_minus_one %[[LOG1P]] : tensor<3xf32>
// CHECK-NEXT:    %[[ERF:.+]] = chlo.erf %[[EXPM1]] : tensor<3xf32> -> tensor<3xf32>
// CHECK-NEXT:    return %[[ERF]]
func.func @functions(%arg0: tensor<3xf32>) -> tensor<3xf32> {
  %0 = "topos.map"(%arg0) {function = "exp", node = 1 : i64} : (tensor<3xf32>) -> tensor<3xf32>
  %1 = "topos.map"(%0) {function = "log", node = 2 : i64} : (tensor<3xf32>) -> tensor<3xf32>
  %2 = "topos.map"(%1) {function = "sqrt", node = 3 : i64} : (tensor<3xf32>) -> tensor<3xf32>
  %3 = "topos.map"(%2) {function = "tanh", node = 4 : i64} : (tensor<3xf32>) -> tensor<3xf32>
  %4 = "topos.map"(%3) {function = "sin", node = 5 : i64} : (tensor<3xf32>) -> tensor<3xf32>
  %5 = "topos.map"(%4) {function = "cos", node = 6 : i64} : (tensor<3xf32>) -> tensor<3xf32>
  %6 = "topos.map"(%5) {function = "log1p", node = 7 : i64} : (tensor<3xf32>) -> tensor<3xf32>
  %7 = "topos.map"(%6) {function = "expm1", node = 8 : i64} : (tensor<3xf32>) -> tensor<3xf32>
  %8 = "topos.map"(%7) {function = "erf", node = 9 : i64} : (tensor<3xf32>) -> tensor<3xf32>
  return %8 : tensor<3xf32>
}

// -----

// erf_derivative is 2/sqrt(pi) * exp(-(x * x)).
// CHECK-LABEL: func.func @erf_derivative
// CHECK-NEXT:    %[[SQUARE:.+]] = stablehlo.multiply %arg0, %arg0 : tensor<3xf64>
// CHECK-NEXT:    %[[NEG:.+]] = stablehlo.negate %[[SQUARE]] : tensor<3xf64>
// CHECK-NEXT:    %[[BELL:.+]] = stablehlo.exponential %[[NEG]] : tensor<3xf64>
// CHECK-NEXT:    %[[SCALE:.+]] = stablehlo.constant dense<1.1283791670955126> : tensor<3xf64>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.multiply %[[SCALE]], %[[BELL]] : tensor<3xf64>
// CHECK-NEXT:    return %[[R]]
func.func @erf_derivative(%arg0: tensor<3xf64>) -> tensor<3xf64> {
  %0 = "topos.map"(%arg0) {function = "erf_derivative", node = 1 : i64} : (tensor<3xf64>) -> tensor<3xf64>
  return %0 : tensor<3xf64>
}

// -----

// erf_derivative of y * c (GELU's x / sqrt 2) rebuilds its input from y as (y * 2c) * 0.5:
// the same bits, and not the forward's product, so the backward need not read a stored copy.
// CHECK-LABEL: func.func @erf_derivative_of_a_scaled_input
// CHECK:         %[[C:.+]] = stablehlo.constant dense<0.707106769> : tensor<3xf32>
// CHECK-NEXT:    %[[X:.+]] = stablehlo.multiply %arg0, %[[C]] : tensor<3xf32>
// CHECK-NEXT:    %[[TWICE:.+]] = stablehlo.constant dense<1.41421354> : tensor<3xf32>
// CHECK-NEXT:    %[[DOUBLED:.+]] = stablehlo.multiply %arg0, %[[TWICE]] : tensor<3xf32>
// CHECK-NEXT:    %[[HALF:.+]] = stablehlo.constant dense<5.000000e-01> : tensor<3xf32>
// CHECK-NEXT:    %[[REBUILT:.+]] = stablehlo.multiply %[[DOUBLED]], %[[HALF]] : tensor<3xf32>
// CHECK-NEXT:    %[[SQUARE:.+]] = stablehlo.multiply %[[REBUILT]], %[[REBUILT]] : tensor<3xf32>
// CHECK-NOT:     %[[X]]
// CHECK:         return
func.func @erf_derivative_of_a_scaled_input(%arg0: tensor<3xf32>) -> tensor<3xf32> {
  %0 = "topos.leaf"() {node = 1 : i64, value = dense<0.707106769> : tensor<3xf32>} : () -> tensor<3xf32>
  %1 = "topos.mul"(%arg0, %0) {node = 2 : i64} : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
  %2 = "topos.map"(%1) {function = "erf_derivative", node = 3 : i64} : (tensor<3xf32>) -> tensor<3xf32>
  return %2 : tensor<3xf32>
}

// -----

// bfloat16 functions compute in float32 and round once.
// CHECK-LABEL: func.func @tanh_bf16
// CHECK-NEXT:    %[[WIDE:.+]] = stablehlo.convert %arg0 : (tensor<2xbf16>) -> tensor<2xf32>
// CHECK-NEXT:    %[[TANH:.+]] = stablehlo.tanh %[[WIDE]] : tensor<2xf32>
// CHECK-NEXT:    %[[ROUNDED:.+]] = stablehlo.reduce_precision %[[TANH]], format = e8m7 : tensor<2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.convert %[[ROUNDED]] : (tensor<2xf32>) -> tensor<2xbf16>
// CHECK-NEXT:    return %[[R]]
func.func @tanh_bf16(%arg0: tensor<2xbf16>) -> tensor<2xbf16> {
  %0 = "topos.map"(%arg0) {function = "tanh", node = 1 : i64} : (tensor<2xbf16>) -> tensor<2xbf16>
  return %0 : tensor<2xbf16>
}
