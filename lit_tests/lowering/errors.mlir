// RUN: %topos-opt %s --no-verify-each --verify-diagnostics --topos-lower-to-stablehlo

// An op with no lowering rule is reported at its own location, not guessed at.
func.func @unknown(%arg0: tensor<2xf32>) -> tensor<2xf32> {
  // expected-error @below {{topos.frobnicate has no StableHLO lowering}}
  %0 = "topos.frobnicate"(%arg0) {node = 1 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
