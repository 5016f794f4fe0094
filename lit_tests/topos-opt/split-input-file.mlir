// Each chunk between `// -----` lines is parsed and processed on its own; the
// outputs are separated by the same marker, and a failing chunk does not stop
// the others (the exit status still says one failed).
// RUN: not %topos-opt %s --split-input-file 2>%t.err | filecheck %s
// RUN: filecheck %s --check-prefix=ERR --input-file %t.err
// RUN: not %topos-opt %s 2>&1 | filecheck %s --check-prefix=WHOLE

// CHECK-LABEL: func.func @first
// CHECK:       "topos.neg"
// CHECK:       // -----
// CHECK-LABEL: func.func @second
// CHECK:       "topos.neg"
// CHECK-NOT:   // -----
// CHECK-NOT:   @third

// Errors keep their line numbers in the whole file.
// ERR: split-input-file.mlir:32:8: error: 'topos.neg' op node 1: result type tensor<3xf32> differs from tensor<2xf32>

// Without splitting, the functions all define node 0 and 1.
// WHOLE: error: 'topos.parameter' op node 0: node index 0 is already used by topos.parameter

func.func @first(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  %1 = "topos.neg"(%0) {node = 1 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  return %1 : tensor<2xf32>
}

// -----

func.func @third(%a: tensor<2xf32>) -> tensor<3xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  %1 = "topos.neg"(%0) {node = 1 : i64} : (tensor<2xf32>) -> tensor<3xf32>
  return %1 : tensor<3xf32>
}

// -----

func.func @second(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  %1 = "topos.neg"(%0) {node = 1 : i64} : (tensor<2xf32>) -> tensor<2xf32>
  return %1 : tensor<2xf32>
}
