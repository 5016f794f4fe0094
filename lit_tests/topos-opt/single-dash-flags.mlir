// Every long flag takes one dash or two, as in mlir-opt; -p stays the short
// --pass-pipeline, and pass flags take one dash too.
// RUN: %topos-opt %s -pass-pipeline='builtin.module(topos-verify,cse)' | filecheck %s
// RUN: %topos-opt %s -pass-pipeline cse | filecheck %s
// RUN: %topos-opt %s --pass-pipeline=cse | filecheck %s
// RUN: %topos-opt %s -p cse | filecheck %s
// RUN: %topos-opt %s -p=cse | filecheck %s
// RUN: %topos-opt %s -pcse | filecheck %s
// RUN: %topos-opt %s -cse -topos-verify | filecheck %s
// RUN: %topos-opt %s -o %t.out -cse
// RUN: filecheck %s --input-file %t.out
// RUN: %topos-opt %s -o=%t.again -cse
// RUN: filecheck %s --input-file %t.again
// RUN: %topos-opt %s -split-input-file -verify-diagnostics -mlir-print-ir-after-all -cse 2>&1 | filecheck %s --check-prefix=DUMP
// RUN: %topos-opt -split-input-file %s -cse | filecheck %s --check-prefix=SPLIT
// RUN: not %topos-opt %s -frobnicate 2>&1 | filecheck %s --check-prefix=UNKNOWN

// CHECK-LABEL: func.func @main
// CHECK:         stablehlo.multiply %arg0, %arg0
// CHECK-NOT:     stablehlo.multiply
// CHECK:         return

// DUMP: // -----// IR Dump After cse //----- //
// DUMP: // -----// IR Dump After cse //----- //

// The marker of -split-input-file comes only after '=', so the input file
// that follows the flag stays the input.
// SPLIT: @main
// SPLIT: // -----
// SPLIT: @second

// UNKNOWN: topos-opt: error: unknown option or pass '-frobnicate'

func.func @main(%a: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
  %0 = stablehlo.multiply %a, %a : tensor<2xf32>
  %1 = stablehlo.multiply %a, %a : tensor<2xf32>
  return %0, %1 : tensor<2xf32>, tensor<2xf32>
}

// -----

func.func @second(%a: tensor<2xf32>) -> tensor<2xf32> {
  return %a : tensor<2xf32>
}
