// --irdl-file=FILE loads IRDL dialect definitions: their ops are known (no
// --allow-unregistered-dialect needed) and verified against them, by the
// iree-opt of the bundled compiler (the Python bindings cannot load IRDL),
// after parsing and after each pass. The topos definitions reject what
// MLIR's own IRDL verifier rejects, at the user's line.
// RUN: %topos-opt %s --irdl-file=%S/Inputs/toy.irdl.mlir -split-input-file -verify-diagnostics
// RUN: %topos-opt %s -irdl-file %S/Inputs/toy.irdl.mlir -split-input-file -verify-diagnostics -p cse
// RUN: not %topos-opt %s --split-input-file 2>&1 | filecheck %s --check-prefix=WITHOUT
// RUN: %topos-opt %S/../irdl/rejects.mlir --irdl-file=%irdl --split-input-file --verify-diagnostics
// RUN: %topos-opt %S/../irdl/accepts.mlir --irdl-file=%irdl -topos-verify | filecheck %s --check-prefix=TOPOS
// RUN: not %topos-opt %s --irdl-file=%S/Inputs/no-such.irdl.mlir 2>&1 | filecheck %s --check-prefix=MISSING
// RUN: not %topos-opt %s --irdl-file=%S/Inputs/not-irdl.mlir 2>&1 | filecheck %s --check-prefix=BROKEN

// WITHOUT: irdl-file.mlir:21:8: error: unregistered operation 'toy.twice' found in dialect ('toy')
// TOPOS: "topos.map"(%3) {function = "erf", node = 4 : i64}
// MISSING: topos-opt: error: could not open IRDL file '{{.*}}no-such.irdl.mlir': No such file or directory
// BROKEN: not-irdl.mlir:4:10: error:
// BROKEN-NOT: Traceback

func.func @accepted(%a: i32) -> i32 {
  %0 = "toy.twice"(%a) : (i32) -> i32
  return %0 : i32
}

// -----

func.func @refused(%a: i32) -> i32 {
  // expected-error @+2 {{expects exactly 1 operands, but got 2}}
  // expected-note @+1 {{see current operation}}
  %0 = "toy.twice"(%a, %a) : (i32, i32) -> i32
  return %0 : i32
}
