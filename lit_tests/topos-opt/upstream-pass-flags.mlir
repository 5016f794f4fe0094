// Every pass the bundled MLIR registers runs, by flag (one dash or two, with
// options after '=') or inside -p, not only the few topos-opt describes; a
// pass restricted to func.func is nested under it, as mlir-opt's implicit
// nesting does. A pass the bundled MLIR lacks (it does not register sccp,
// mem2reg or symbol-privatize) is an error in mlir-opt's words.
// RUN: %topos-opt %s --loop-invariant-code-motion -symbol-dce --inline | filecheck %s
// RUN: %topos-opt %s -p 'builtin.module(loop-invariant-code-motion,symbol-dce,inline)' | filecheck %s
// RUN: %topos-opt %s --chlo-legalize-to-stablehlo -p 'func.func(canonicalize{max-iterations=3})' | filecheck %s --check-prefix=NESTED
// RUN: %topos-opt %s --canonicalize=max-iterations=3 -strip-debuginfo --mlir-print-debuginfo | filecheck %s --check-prefix=OPTIONS
// RUN: not %topos-opt %s -p 'cse,sccp' 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not %topos-opt %s --mem2reg 2>&1 | filecheck %s --check-prefix=FLAG
// RUN: not %topos-opt %s -p 'loop-invariant-code-motion{bogus=1}' 2>&1 | filecheck %s --check-prefix=OPTION

// Inlined and dead: @helper is gone, its call replaced by its body.
// CHECK-NOT:   func.func private @helper
// CHECK-LABEL: func.func @main
// CHECK-NOT:   call
// CHECK:       stablehlo.multiply
// NESTED-LABEL: func.func @main
// NESTED-NOT:   chlo.erf
// OPTIONS:      chlo.erf %0 : tensor<2xf32> -> tensor<2xf32> loc(#loc)
// OPTIONS-NOT:  upstream-pass-flags.mlir
// UNKNOWN: MLIR Textual PassPipeline Parser:1:5: error: 'sccp' does not refer to a registered pass or pass pipeline
// UNKNOWN-NOT: Traceback
// FLAG: topos-opt: error: unknown option or pass '--mem2reg'
// OPTION: MLIR Textual PassPipeline Parser:1:1: error: <Pass-Options-Parser>: no such option bogus

func.func private @helper(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.multiply %a, %a : tensor<2xf32>
  return %0 : tensor<2xf32>
}

func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = func.call @helper(%a) : (tensor<2xf32>) -> tensor<2xf32>
  %1 = chlo.erf %0 : tensor<2xf32> -> tensor<2xf32>
  return %1 : tensor<2xf32>
}
