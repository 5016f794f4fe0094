// MLIR's own verifier, driven by the generated IRDL file, accepts well-formed
// topos IR: every op of the walkthrough, selections, annotations, bf16 and f64.
// RUN: iree-opt --irdl-file=%irdl %s | filecheck %s
// RUN: %python %inputs/emit.py every_opcode | iree-opt --irdl-file=%irdl | filecheck %s --check-prefix=ALL
// RUN: %python %inputs/emit.py mlp | iree-opt --irdl-file=%irdl | filecheck %s --check-prefix=MLP

// CHECK: "topos.gather"(%0, %2) {node = 3 : i64, topos.fusion_group = 1 : i64}
// CHECK: "topos.map"(%3) {function = "erf", node = 4 : i64}

// ALL-DAG: "topos.unfold"
// ALL-DAG: "topos.fold"
// ALL-DAG: "topos.scatter"
// ALL-DAG: tensor<6xbf16>
// ALL-DAG: tensor<6xf64>
// MLP: "topos.log_softmax"

func.func @main(%t: tensor<4x3xbf16>, %s: tensor<2xi64>) -> tensor<2x3xbf16> {
  %0 = "topos.parameter"(%t) {node = 0 : i64} : (tensor<4x3xbf16>) -> tensor<4x3xbf16>
  %1 = "topos.input"(%s) {node = 1 : i64, extent = 4 : i64} : (tensor<2xi64>) -> tensor<2xi64>
  %2 = "topos.leaf"() {node = 2 : i64, extent = 4 : i64, value = dense<[3, 0]> : tensor<2xi64>} : () -> tensor<2xi64>
  %3 = "topos.gather"(%0, %2) {node = 3 : i64, topos.fusion_group = 1 : i64} : (tensor<4x3xbf16>, tensor<2xi64>) -> tensor<2x3xbf16>
  %4 = "topos.map"(%3) {node = 4 : i64, function = "erf"} : (tensor<2x3xbf16>) -> tensor<2x3xbf16>
  return %4 : tensor<2x3xbf16>
}
