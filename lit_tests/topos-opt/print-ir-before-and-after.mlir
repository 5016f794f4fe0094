// --mlir-print-ir-before-all prints the module before each pass;
// --mlir-print-ir-after-change after each pass that changed it (alone, or
// narrowing --mlir-print-ir-after-all, as in mlir-opt);
// --mlir-print-ir-after-failure after the pass that failed. All on stderr,
// headed like --mlir-print-ir-after-all.
// RUN: %topos-opt %s -p 'topos-verify,cse' --mlir-print-ir-before-all 2>&1 >/dev/null | filecheck %s --check-prefix=BEFORE
// RUN: %topos-opt %s -p 'topos-verify,cse,canonicalize' --mlir-print-ir-after-change 2>&1 >/dev/null | filecheck %s --check-prefix=CHANGE
// RUN: %topos-opt %s -p 'topos-verify,cse' -mlir-print-ir-after-all -mlir-print-ir-after-change 2>&1 >/dev/null | filecheck %s --check-prefix=CHANGE
// RUN: not %topos-opt %s --load-pass-module consumers_pass -p 'cse,topos-count-consumers{minimum=2}' --mlir-print-ir-after-failure 2>&1 | filecheck %s --check-prefix=FAILURE
// RUN: %topos-opt %s -p cse -mlir-print-ir-after-failure 2>&1 >/dev/null | filecheck %s --check-prefix=NOFAILURE --allow-empty

// BEFORE:      // -----// IR Dump Before topos-verify //----- //
// BEFORE-NEXT: module {
// BEFORE-COUNT-2: stablehlo.multiply
// BEFORE:      // -----// IR Dump Before cse //----- //
// BEFORE-COUNT-2: stablehlo.multiply
// BEFORE-NOT:  IR Dump

// topos-verify and canonicalize change nothing here; cse removes a multiply.
// CHANGE-NOT:  IR Dump After topos-verify
// CHANGE:      // -----// IR Dump After cse //----- //
// CHANGE-NEXT: module {
// CHANGE:      stablehlo.multiply
// CHANGE-NOT:  stablehlo.multiply
// CHANGE-NOT:  IR Dump

// FAILURE:      // -----// IR Dump After topos-count-consumers{minimum=2} Failed //----- //
// FAILURE-NEXT: module {
// FAILURE:      return %0, %1, %1
// FAILURE:      print-ir-before-and-after.mlir:{{[0-9]+}}:8: error: node 0 has 1 readers, fewer than 2
// NOFAILURE-NOT: IR Dump

func.func @main(%a: tensor<2xf32>, %b: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  %1 = stablehlo.multiply %b, %b : tensor<2xf32>
  %2 = stablehlo.multiply %b, %b : tensor<2xf32>
  return %0, %1, %2 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
}
