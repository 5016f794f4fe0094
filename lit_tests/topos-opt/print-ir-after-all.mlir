// --mlir-print-ir-after-all prints the module after every pass, in command-line
// order, on stderr; Python and upstream passes mix in one pipeline.
// RUN: %topos-opt %s --topos-verify -p 'canonicalize,cse' --mlir-print-ir-after-all 2>&1 >/dev/null | filecheck %s

// CHECK:      // -----// IR Dump After topos-verify //----- //
// CHECK-NEXT: module {
// CHECK:      // -----// IR Dump After canonicalize //----- //
// CHECK:      // -----// IR Dump After cse //----- //
// CHECK:      stablehlo.add %arg1, %arg1
// CHECK-NOT:  stablehlo.add

func.func @main(%a: tensor<2xf32>, %b: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  %1 = stablehlo.add %b, %b : tensor<2xf32>
  %2 = stablehlo.add %b, %b : tensor<2xf32>
  return %0, %1, %2 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
}
