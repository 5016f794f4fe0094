// --mlir-pass-statistics reports, for each pipeline element, the ops it
// added and removed (counted by topos-opt: by name, attributes and types),
// and under an upstream element the statistics MLIR's pass manager keeps.
// RUN: %topos-opt %s -p 'topos-verify,func.func(cse),canonicalize' --mlir-pass-statistics 2>&1 >/dev/null | filecheck %s
// RUN: %topos-opt %s -mlir-pass-statistics --load-pass-module consumers_pass -topos-count-consumers 2>&1 >/dev/null | filecheck %s --check-prefix=PYTHON
// RUN: not %topos-opt %s -p 'cse,topos-frobnicate' --mlir-pass-statistics 2>&1 | filecheck %s --check-prefix=BAD

// CHECK:      ===-------------------------------------------------------------------------===
// CHECK-NEXT:                          ... Pass statistics report ...
// CHECK-NEXT: ===-------------------------------------------------------------------------===
// CHECK-NEXT: topos-verify
// CHECK-NEXT:   (S) 0 ops-added - Operations after the pass that were not before
// CHECK-NEXT:   (S) 0 ops-removed - Operations before the pass that are not after
// CHECK-NEXT: func.func(cse)
// CHECK-NEXT:   (S) 0 ops-added
// CHECK-NEXT:   (S) 1 ops-removed
// CHECK-NEXT:   CSEPass
// CHECK-NEXT:     (S) 1 num-cse'd - Number of operations CSE'd
// CHECK-NEXT:     (S) 0 num-dce'd - Number of operations DCE'd
// CHECK-NEXT: canonicalize
// CHECK-NEXT:   (S) 0 ops-added
// CHECK-NEXT:   (S) 0 ops-removed
// CHECK-NOT:  ... Pass statistics report ...

// An op changed in place (an attribute added) counts as removed and added.
// PYTHON:      topos-count-consumers
// PYTHON-NEXT:   (S) 1 ops-added
// PYTHON-NEXT:   (S) 1 ops-removed

// The pipeline is checked before anything runs: no report, one error.
// BAD-NOT: Pass statistics report
// BAD: MLIR Textual PassPipeline Parser:1:5: error: 'topos-frobnicate' does not refer to a registered pass
// BAD-NOT: Pass statistics report

func.func @main(%a: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  %1 = stablehlo.multiply %a, %a : tensor<2xf32>
  %2 = stablehlo.multiply %a, %a : tensor<2xf32>
  %3 = stablehlo.add %1, %2 : tensor<2xf32>
  return %0, %3 : tensor<2xf32>, tensor<2xf32>
}
