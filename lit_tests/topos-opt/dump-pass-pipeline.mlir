// --dump-pass-pipeline prints the parsed pipeline on stderr, as mlir-opt
// does: every option spelled out, nested pipelines indented, a pass
// restricted to func.func nested under it; then the pipeline runs.
// RUN: %topos-opt %s -p 'topos-verify,func.func(cse),canonicalize{max-iterations=3}' --chlo-legalize-to-stablehlo --dump-pass-pipeline 2>%t.err | filecheck %s --check-prefix=RAN
// RUN: filecheck %s --input-file %t.err
// RUN: %topos-opt %s --load-pass-module consumers_pass -topos-count-consumers -dump-pass-pipeline 2>&1 >/dev/null | filecheck %s --check-prefix=OPTIONS
// RUN: not %topos-opt %s -p 'cse,no-such-pass' --dump-pass-pipeline 2>&1 | filecheck %s --check-prefix=BAD

// CHECK:      Pass Manager with 4 passes:
// CHECK-NEXT: builtin.module(
// CHECK-NEXT:   topos-verify,
// CHECK-NEXT:   func.func(
// CHECK-NEXT:     cse
// CHECK-NEXT:   ),
// CHECK-NEXT:   canonicalize{{{.*}}max-iterations=3{{.*}}},
// CHECK-NEXT:   func.func(
// CHECK-NEXT:     chlo-legalize-to-stablehlo
// CHECK-NEXT:   )
// CHECK-NEXT: )

// RAN-NOT: chlo.erf
// RAN:     return

// A topos pass shows its options with their defaults.
// OPTIONS: topos-count-consumers{minimum=0}

// BAD-NOT: Pass Manager
// BAD:     MLIR Textual PassPipeline Parser:1:5: error: 'no-such-pass' does not refer to a registered pass or pass pipeline

func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = chlo.erf %a : tensor<2xf32> -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
