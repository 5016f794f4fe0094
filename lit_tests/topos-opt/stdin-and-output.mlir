// Input from stdin (`-` or nothing) and output to a file with -o.
// RUN: %topos-opt - < %s | filecheck %s
// RUN: %topos-opt < %s | filecheck %s
// RUN: %topos-opt %s -o %t.out
// RUN: filecheck %s --input-file %t.out
// RUN: not %topos-opt - --mlir-print-debuginfo < %inputs/bad-operand.mlir 2>&1 | filecheck %s --check-prefix=STDIN

// CHECK: "topos.parameter"(%arg0) {node = 0 : i64}
// STDIN: <stdin>:3:8: error: 'topos.neg' op node 1: expects 1 operand (input), got 2

func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
