// RUN: %topos-opt %s --split-input-file --topos-lower-to-stablehlo | filecheck %s

// Single IEEE operations map one to one, in the element type.
// CHECK-LABEL: func.func @arithmetic
// CHECK-NEXT:    %[[ADD:.+]] = stablehlo.add %arg0, %arg1 : tensor<2x3xf32>
// CHECK-NEXT:    %[[SUB:.+]] = stablehlo.subtract %[[ADD]], %arg1 : tensor<2x3xf32>
// CHECK-NEXT:    %[[MUL:.+]] = stablehlo.multiply %[[SUB]], %arg1 : tensor<2x3xf32>
// CHECK-NEXT:    %[[DIV:.+]] = stablehlo.divide %[[MUL]], %arg1 : tensor<2x3xf32>
// CHECK-NEXT:    %[[NEG:.+]] = stablehlo.negate %[[DIV]] : tensor<2x3xf32>
// CHECK-NEXT:    return %[[NEG]]
// CHECK-NOT:   topos.
func.func @arithmetic(%arg0: tensor<2x3xf32>, %arg1: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = "topos.add"(%arg0, %arg1) {node = 2 : i64} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  %1 = "topos.sub"(%0, %arg1) {node = 3 : i64} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  %2 = "topos.mul"(%1, %arg1) {node = 4 : i64} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  %3 = "topos.div"(%2, %arg1) {node = 5 : i64} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  %4 = "topos.neg"(%3) {node = 6 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  return %4 : tensor<2x3xf32>
}

// -----

// bfloat16 pow computes in float32 and rounds once; C99 pow is spelled out around
// stablehlo.power, which IREE evaluates as exp(b * log(a)) (NaN for a negative base).
// CHECK-LABEL: func.func @pow_bf16
// CHECK-NEXT:    %[[A:.+]] = stablehlo.convert %arg0 : (tensor<4xbf16>) -> tensor<4xf32>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.convert %arg1 : (tensor<4xbf16>) -> tensor<4xf32>
// CHECK-NEXT:    %[[SIZE:.+]] = stablehlo.abs %[[A]] : tensor<4xf32>
// CHECK-NEXT:    %[[P:.+]] = stablehlo.power %[[SIZE]], %[[B]] : tensor<4xf32>
// CHECK:         %[[NEGATED:.+]] = stablehlo.negate %[[P]] : tensor<4xf32>
// CHECK:         %[[R:.+]] = stablehlo.convert %{{.+}} : (tensor<4xf32>) -> tensor<4xbf16>
// CHECK-NEXT:    return %[[R]]
func.func @pow_bf16(%arg0: tensor<4xbf16>, %arg1: tensor<4xbf16>) -> tensor<4xbf16> {
  %0 = "topos.pow"(%arg0, %arg1) {node = 2 : i64} : (tensor<4xbf16>, tensor<4xbf16>) -> tensor<4xbf16>
  return %0 : tensor<4xbf16>
}

// -----

// Ties and a NaN on the left go left: select(a >= b or a != a, a, b), not stablehlo.maximum
// (which would turn maximum(-0.0, +0.0) into +0.0).
// CHECK-LABEL: func.func @maximum
// CHECK-NEXT:    %[[GE:.+]] = stablehlo.compare GE, %arg0, %arg1 : (tensor<3xf64>, tensor<3xf64>) -> tensor<3xi1>
// CHECK-NEXT:    %[[NAN:.+]] = stablehlo.compare NE, %arg0, %arg0 : (tensor<3xf64>, tensor<3xf64>) -> tensor<3xi1>
// CHECK-NEXT:    %[[LEFT:.+]] = stablehlo.or %[[GE]], %[[NAN]] : tensor<3xi1>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.select %[[LEFT]], %arg0, %arg1 : tensor<3xi1>, tensor<3xf64>
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:   stablehlo.maximum
func.func @maximum(%arg0: tensor<3xf64>, %arg1: tensor<3xf64>) -> tensor<3xf64> {
  %0 = "topos.maximum"(%arg0, %arg1) {node = 2 : i64} : (tensor<3xf64>, tensor<3xf64>) -> tensor<3xf64>
  return %0 : tensor<3xf64>
}

// -----

// step(x, t) is 1 where x >= t (a NaN compares false, so 0).
// CHECK-LABEL: func.func @step
// CHECK-NEXT:    %[[GE:.+]] = stablehlo.compare GE, %arg0, %arg1 : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xi1>
// CHECK-NEXT:    %[[ONE:.+]] = stablehlo.constant dense<1.000000e+00> : tensor<2x2xf32>
// CHECK-NEXT:    %[[ZERO:.+]] = stablehlo.constant dense<0.000000e+00> : tensor<2x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.select %[[GE]], %[[ONE]], %[[ZERO]] : tensor<2x2xi1>, tensor<2x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @step(%arg0: tensor<2x2xf32>, %arg1: tensor<2x2xf32>) -> tensor<2x2xf32> {
  %0 = "topos.step"(%arg0, %arg1) {node = 2 : i64} : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}
