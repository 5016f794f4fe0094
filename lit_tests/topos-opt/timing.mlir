// --mlir-timing reports each pass's wall time on stderr, in mlir-opt's
// "Execution time report" shape: the parser, each pipeline element (its
// verification included), the output, the rest, the total. A failing pass
// still gets its report, and the run still fails.
// RUN: %topos-opt %s -p 'topos-verify,func.func(cse)' --mlir-timing 2>&1 >/dev/null | filecheck %s
// RUN: %topos-opt %s -topos-verify -mlir-timing -split-input-file 2>&1 >/dev/null | filecheck %s --check-prefix=SPLIT
// RUN: not %topos-opt %s --load-pass-module consumers_pass -p 'topos-count-consumers{minimum=2}' --mlir-timing 2>&1 | filecheck %s --check-prefix=FAIL

// CHECK:      ===-------------------------------------------------------------------------===
// CHECK-NEXT:                          ... Execution time report ...
// CHECK-NEXT: ===-------------------------------------------------------------------------===
// CHECK-NEXT:   Total Execution Time: {{[0-9]+\.[0-9]+}} seconds
// CHECK-EMPTY:
// CHECK-NEXT:   ----Wall Time----  ----Name----
// CHECK-NEXT:     {{[0-9]+\.[0-9]+}} ({{ *[0-9]+\.[0-9]}}%)  Parser
// CHECK-NEXT:     {{[0-9]+\.[0-9]+}} ({{ *[0-9]+\.[0-9]}}%)  topos-verify
// CHECK-NEXT:     {{[0-9]+\.[0-9]+}} ({{ *[0-9]+\.[0-9]}}%)  func.func(cse)
// CHECK-NEXT:     {{[0-9]+\.[0-9]+}} ({{ *[0-9]+\.[0-9]}}%)  Output
// CHECK-NEXT:     {{[0-9]+\.[0-9]+}} ({{ *[0-9]+\.[0-9]}}%)  Rest
// CHECK-NEXT:     {{[0-9]+\.[0-9]+}} (100.0%)  Total

// One report per chunk, as mlir-opt.
// SPLIT-COUNT-2: Execution time report

// FAIL: error: node 0 has 1 readers, fewer than 2
// FAIL: Execution time report
// FAIL: topos-count-consumers{minimum=2}
// FAIL-NOT: Output

func.func @main(%a: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  %1 = stablehlo.multiply %a, %a : tensor<2xf32>
  return %0, %1 : tensor<2xf32>, tensor<2xf32>
}

// -----

func.func @second(%a: tensor<2xf32>) -> tensor<2xf32> {
  return %a : tensor<2xf32>
}
