"""topos-opt's contract: output and exit 0, or ``file:line:col: error:`` diagnostics and exit 1.

One table of inputs a user can type (bytes, a command line) with the exit
status and the diagnostic each must give. Exit 2 (an internal error) is
kept for bugs of topos-opt itself; no row may reach it, nor print a
Python traceback.
"""

from __future__ import annotations

import io
import os
import re
import sys
from dataclasses import dataclass

import pytest

pytest.importorskip("iree.compiler.ir")

from topos.dialect.opt import EXIT_FAILURE, main  # noqa: E402
from topos.dialect.passes import registry as pass_registry  # noqa: E402

PARAMETER = '  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>\n'


def function(body: str, result: str = "tensor<2x3xf32>", arguments: str = "%a: tensor<2x3xf32>") -> str:
    return f"func.func @main({arguments}) -> {result} {{\n{body}}}\n"


VALID = function(PARAMETER + "  return %0 : tensor<2x3xf32>\n")
HUGE = "tensor<99999999999x99999999999xf32>"
MODULES = {  # Python modules the --load-pass-module rows load from the test's folder
    "raises_on_import": 'raise RuntimeError("no GPU found")\n',
    "exits_on_import": "import sys\nsys.exit(3)\n",
    "bad_syntax": "def broken(:\n",
    "imports_a_missing_module": "import no_such_dependency\n",
    "registers_a_broken_pass": (
        "from topos.dialect.passes.registry import register_pass\n\n"
        '@register_pass("test-contract-broken", "Divide by zero")\n'
        "def broken(module):\n"
        "    return 1 / 0\n"
    ),
}


@dataclass(frozen=True)
class Case:
    input: bytes  # written to {in}; "-" in argv reads it from stdin instead
    argv: tuple[str, ...]
    status: int
    stderr: str  # a regex the whole of stderr must match (re.search)


CASES = {
    # ---- bytes that are not UTF-8 text
    "non-UTF-8 byte in a file": Case(
        b"func.func @main() {\n  // caf\xe9\n  return\n}\n", ("{in}",), 1,
        r"^\S*in\.mlir:2:9: error: invalid UTF-8 byte 0xe9 at byte offset 28 \(invalid continuation byte\)",
    ),
    "non-UTF-8 byte on stdin": Case(
        b"\xff", ("-",), 1, r"^<stdin>:1:1: error: invalid UTF-8 byte 0xff at byte offset 0",
    ),
    # ---- output files
    "-o names a directory": Case(
        VALID.encode(), ("{in}", "-o", "{tmp}"), 1,
        r"^topos-opt: error: could not write output file '\S+': Is a directory\n$",
    ),
    "-o into a missing folder": Case(
        VALID.encode(), ("{in}", "-o", "{tmp}/missing/out.mlir"), 1,
        r"^topos-opt: error: could not write output file '\S+/missing/out\.mlir': No such file or directory\n$",
    ),
    "-o below a file": Case(
        VALID.encode(), ("{in}", "-o", "{in}/out.mlir"), 1,
        r"^topos-opt: error: could not write output file '\S+': Not a directory\n$",
    ),
    # ---- --load-pass-module
    "pass module raises on import": Case(
        VALID.encode(), ("{in}", "--load-pass-module", "raises_on_import"), 1,
        r"^\S+raises_on_import\.py:1:0: error: cannot load pass module 'raises_on_import': "
        r"RuntimeError: no GPU found\n$",
    ),
    "pass module calls sys.exit on import": Case(
        VALID.encode(), ("{in}", "--load-pass-module", "exits_on_import"), 1,
        r"^\S+exits_on_import\.py:2:0: error: cannot load pass module 'exits_on_import': SystemExit: 3\n$",
    ),
    "pass module name is empty": Case(
        VALID.encode(), ("{in}", "--load-pass-module="), 1,
        r"^topos-opt: error: cannot load pass module '': ValueError: Empty module name\n$",
    ),
    "pass module is missing": Case(
        VALID.encode(), ("{in}", "--load-pass-module", "no_such_module"), 1,
        r"^topos-opt: error: cannot load pass module 'no_such_module': ModuleNotFoundError: "
        r"No module named 'no_such_module'\n$",
    ),
    "pass module has a syntax error": Case(
        VALID.encode(), ("{in}", "--load-pass-module=bad_syntax"), 1,
        r"^\S+bad_syntax\.py:1:\d+: error: cannot load pass module 'bad_syntax': SyntaxError: ",
    ),
    "pass module imports a missing module": Case(
        VALID.encode(), ("{in}", "--load-pass-module", "imports_a_missing_module"), 1,
        r"^\S+imports_a_missing_module\.py:1:0: error: cannot load pass module 'imports_a_missing_module': "
        r"ModuleNotFoundError: No module named 'no_such_dependency'",
    ),
    "pass module registers a pass that raises": Case(
        VALID.encode(), ("{in}", "--load-pass-module", "registers_a_broken_pass", "--test-contract-broken"), 1,
        r"^\S+registers_a_broken_pass\.py:5:0: error: pass 'test-contract-broken' crashed: "
        r"ZeroDivisionError: division by zero\n$",
    ),
    # ---- tensors too big to count
    "huge static shape": Case(
        function(f'  %0 = "topos.parameter"(%a) {{node = 0 : i64}} : ({HUGE}) -> {HUGE}\n'
                 f"  return %0 : {HUGE}\n", HUGE, f"%a: {HUGE}").encode(),
        ("{in}", "-p", "topos-fuse"), 1,
        r"^\S*in\.mlir:2:8: error: 'topos.parameter' op node 0: tensor<99999999999x99999999999xf32> "
        r"would hold 4e\+22 bytes, more than a 64-bit size can count",
    ),
    "volume overflows int64": Case(
        function('  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<9223372036854775807x2xf32>) '
                 "-> tensor<9223372036854775807x2xf32>\n"
                 '  %1 = "topos.sum"(%0) {node = 1 : i64} : (tensor<9223372036854775807x2xf32>) -> tensor<f32>\n'
                 "  return %1 : tensor<f32>\n", "tensor<f32>", "%a: tensor<9223372036854775807x2xf32>").encode(),
        ("{in}", "-p", "topos-lower-to-stablehlo"), 1,
        r"^\S*in\.mlir:2:8: error: 'topos.parameter' op node 0: tensor<9223372036854775807x2xf32> would hold",
    ),
    # 2**62 bytes: below the size limit, above any RAM. A source reads back as one stored zero, so
    # planning it allocates nothing (it was a "does not fit in memory" error while sources were zeros).
    "source too big for memory, read as a spec": Case(
        function('  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<1152921504606846976xf32>) '
                 "-> tensor<1152921504606846976xf32>\n  return %0 : tensor<1152921504606846976xf32>\n",
                 "tensor<1152921504606846976xf32>", "%a: tensor<1152921504606846976xf32>").encode(),
        ("{in}", "--topos-plan"), 0, r"^$",
    ),
    # ---- pass options
    "option value that is no integer": Case(
        VALID.encode(), ("{in}", "--topos-differentiate=target=abc"), 1,
        r"^MLIR Textual PassPipeline Parser:1:1: error: pass 'topos-differentiate': target must be a node "
        r"index, as in target=<node>; got 'abc'\n$",
    ),
    "option naming no node": Case(
        VALID.encode(), ("{in}", "-p", "topos-verify,topos-differentiate{target=7}"), 1,
        r"^MLIR Textual PassPipeline Parser:1:14: error: pass 'topos-differentiate': target=7 names no op "
        r"of @main \(its nodes: 0\)\n$",
    ),
    "unknown option name": Case(
        VALID.encode(), ("{in}", "--topos-differentiate=nope=1"), 1,
        r"^MLIR Textual PassPipeline Parser:1:1: error: pass 'topos-differentiate' has no option 'nope'",
    ),
    "option of a pass that takes none": Case(
        VALID.encode(), ("{in}", "-p", "topos-fuse{nope=1}"), 1,
        r"^MLIR Textual PassPipeline Parser:1:1: error: pass 'topos-fuse' has no option 'nope' \(it takes no options\)",
    ),
    "unknown fusion kind": Case(
        VALID.encode(), ("{in}", "-p", "topos-fuse,topos-elect{kinds=conv}"), 1,
        r"^MLIR Textual PassPipeline Parser:1:12: error: pass 'topos-elect': kinds names 'conv', which is "
        r"no fusion kind",
    ),
    "unknown fusion kind before the offers it needs": Case(
        VALID.encode(), ("{in}", "--topos-elect=kinds=warp_drive"), 1,
        r"^MLIR Textual PassPipeline Parser:1:1: error: pass 'topos-elect': kinds names 'warp_drive', which is "
        r"no fusion kind \(kinds: convolution, ",
    ),
    "upstream option value LLVM refuses": Case(
        VALID.encode(), ("{in}", "--canonicalize=max-iterations=banana"), 1,
        r"^MLIR Textual PassPipeline Parser:1:1: error: failed to add `canonicalize` with options "
        r"`max-iterations=banana`: for the --max-iterations option: 'banana' value invalid for long argument!\n$",
    ),
    # ---- the pipeline and the command line
    "empty pass name after a comma": Case(
        VALID.encode(), ("{in}", "-p", "topos-verify,"), 1,
        r"^MLIR Textual PassPipeline Parser:1:14: error: '' does not refer to a registered pass or pass "
        r"pipeline \(an empty pass name: drop the extra ','\)\n$",
    ),
    "empty pass name between commas": Case(
        VALID.encode(), ("{in}", "-p", "builtin.module(cse,,cse)"), 1,
        r"^MLIR Textual PassPipeline Parser:1:20: error: '' does not refer to a registered pass",
    ),
    "a second input file": Case(
        VALID.encode(), ("{in}", "{in}"), 1,
        r"^topos-opt: error: too many positional arguments: '\S+in\.mlir' after the input file '\S+in\.mlir'; "
        r"topos-opt reads one input file\n$",
    ),
    "empty argument after --split-input-file": Case(
        VALID.encode(), ("{in}", "--split-input-file", ""), 1,
        r"^topos-opt: error: too many positional arguments: '' after the input file '\S+'; topos-opt reads one "
        r"input file \(--split-input-file takes its marker as --split-input-file=MARKER\)\n$",
    ),
    "empty input file name": Case(
        VALID.encode(), ("",), 1, r"^topos-opt: error: could not open input file '': No such file or directory\n$",
    ),
    # ---- where topos ops stand
    "function without a return": Case(
        function(PARAMETER).encode(), ("{in}",), 1,
        r"^\S*in\.mlir:2:8: error: block with no terminator: 'topos.parameter' ends the body of a func.func",
    ),
    "bare op at the top level": Case(
        b'%0 = "topos.leaf"() {node = 0 : i64, value = dense<1.0> : tensor<2xf32>} : () -> tensor<2xf32>\n',
        ("{in}",), 1,
        r"^\S*in\.mlir:1:6: error: 'topos.leaf' op node 0: topos ops belong in the body of a func.func, "
        r"not in 'builtin.module'",
    ),
    "op inside another op's region": Case(
        function("  %zero = stablehlo.constant dense<0.0> : tensor<f32>\n"
                 '  %0 = "stablehlo.reduce"(%a, %zero) ({\n'
                 "  ^bb0(%x: tensor<f32>, %y: tensor<f32>):\n"
                 '    %1 = "topos.add"(%x, %y) {node = 1 : i64} : (tensor<f32>, tensor<f32>) -> tensor<f32>\n'
                 "    stablehlo.return %1 : tensor<f32>\n"
                 "  }) {dimensions = array<i64: 0>} : (tensor<2x3xf32>, tensor<f32>) -> tensor<3xf32>\n"
                 "  return %0 : tensor<3xf32>\n", "tensor<3xf32>").encode(),
        ("{in}",), 1,
        r"^\S*in\.mlir:5:10: error: 'topos.add' op node 1: topos ops belong in the body of a func.func, "
        r"not in 'stablehlo.reduce'",
    ),
    "declaration as @main": Case(
        b"func.func private @main(tensor<2xf32>) -> tensor<2xf32>\n", ("{in}", "-p", "topos-raise"), 1,
        r"^\S*in\.mlir:1:1: error: the spec function is a declaration; it needs a body",
    ),
    "duplicate @main": Case(
        (VALID + VALID).encode(), ("{in}",), 1, r"^\S*in\.mlir:5:1: error: redefinition of symbol named 'main'",
    ),
    # ---- empty input and specs with nothing in them
    "empty input": Case(b"", ("{in}",), 0, r"^$"),
    "only comments": Case(b"// nothing here\n// -----\n", ("{in}", "--topos-verify"), 0, r"^$"),
    "empty input read as a spec": Case(
        b"", ("{in}", "-p", "topos-fuse"), 1,
        r"^\S*in\.mlir:0:0: error: expected one func.func @main holding the spec, found 0 functions",
    ),
    "spec without results": Case(
        b"func.func @main() {\n  return\n}\n", ("{in}", "-p", "topos-fuse"), 1,
        r"^\S*in\.mlir:1:1: error: an entry needs at least one root\n",
    ),
    "result that is a block argument": Case(
        function("  return %a : tensor<2x3xf32>\n").encode(), ("{in}", "--topos-plan"), 1,
        r"^\S*in\.mlir:2:3: error: result #0 is not computed by a topos op",
    ),
    # ---- ops and attributes
    "block argument of an unsupported type": Case(
        function('  %0 = "topos.parameter"(%a) {node = 0 : i64} : (i32) -> i32\n  return %0 : i32\n', "i32",
                 "%a: i32").encode(),
        ("{in}",), 1, r"^\S*in\.mlir:2:8: error: 'topos.parameter' op node 0: result: i32 is not a tensor",
    ),
    "unknown attribute": Case(
        VALID.replace("{node = 0 : i64}", "{node = 0 : i64, colour = 1 : i64}").encode(), ("{in}",), 1,
        r"^\S*in\.mlir:2:8: error: 'topos.parameter' op node 0: has no attribute 'colour'",
    ),
    "attribute of the wrong type": Case(
        function(PARAMETER + '  %1 = "topos.sum_along"(%0) {node = 1 : i64, axis = "x"} : (tensor<2x3xf32>) '
                 "-> tensor<2xf32>\n  return %1 : tensor<2xf32>\n", "tensor<2xf32>").encode(),
        ("{in}",), 1,
        r"^\S*in\.mlir:3:8: error: 'topos.sum_along' op node 1: attribute 'axis' must be an i64 integer",
    ),
    "negative axis": Case(
        function(PARAMETER + '  %1 = "topos.sum_along"(%0) {node = 1 : i64, axis = -1 : i64} : '
                 "(tensor<2x3xf32>) -> tensor<2xf32>\n  return %1 : tensor<2xf32>\n", "tensor<2xf32>").encode(),
        ("{in}",), 1, r"^\S*in\.mlir:3:8: error: 'topos.sum_along' op node 1: axis -1 is out of range for rank 2",
    ),
    "permute order with a repeat": Case(
        function(PARAMETER + '  %1 = "topos.permute"(%0) {node = 1 : i64, order = array<i64: 0, 0>} : '
                 "(tensor<2x3xf32>) -> tensor<3x2xf32>\n  return %1 : tensor<3x2xf32>\n",
                 "tensor<3x2xf32>").encode(),
        ("{in}",), 1, r"^\S*in\.mlir:3:8: error: 'topos.permute' op node 1: order \[0, 0\] is not a permutation",
    ),
    "annotation of the wrong type": Case(
        function(PARAMETER.replace("{node = 0 : i64}", "{node = 0 : i64, topos.fusion_kind = 5 : i64}")
                 + "  return %0 : tensor<2x3xf32>\n", "tensor<2x3xf32>").replace(
                     "{\n", "attributes {topos.fusions = 1 : i64} {\n", 1).encode(),
        ("{in}", "-p", "topos-raise"), 1,
        r"^\S*in\.mlir:2:8: error: 'topos.parameter' op: annotation 'topos.fusion_kind' must be a string",
    ),
}


def run(case: Case, tmp_path) -> tuple[int, str, str]:
    path = tmp_path / "in.mlir"
    path.write_bytes(case.input)
    argv = [a.replace("{in}", str(path)).replace("{tmp}", str(tmp_path)) for a in case.argv]
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, stdin=io.BytesIO(case.input), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture
def pass_modules(tmp_path, monkeypatch):
    """The test's folder on sys.path with MODULES in it; what they register is removed afterwards."""
    for name, text in MODULES.items():
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    pass_registry._REGISTRY.pop("test-contract-broken", None)
    for name in MODULES:
        sys.modules.pop(name, None)


@pytest.mark.parametrize("name", list(CASES))
def test_every_input_ends_in_output_or_a_located_diagnostic(name, tmp_path, pass_modules):
    case = CASES[name]
    status, out, err = run(case, tmp_path)
    assert "Traceback" not in err and "internal error" not in err, err
    assert status == case.status, err
    assert re.search(case.stderr, err), err
    if status == 0:
        assert out.startswith("module")
    else:
        assert out == ""


def test_a_failed_run_leaves_an_existing_output_file_as_it_was(tmp_path):
    target = tmp_path / "out.mlir"
    target.write_text("the previous output\n")
    case = CASES["function without a return"]
    status, _, _ = run(Case(case.input, (*case.argv, "-o", str(target)), 1, ""), tmp_path)
    assert status == EXIT_FAILURE
    assert target.read_text() == "the previous output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.mlir", "out.mlir"]  # no temporary left


def test_output_replaces_the_file_whole_and_keeps_its_mode(tmp_path):
    target = tmp_path / "out.mlir"
    target.write_text("x" * 10_000)
    os.chmod(target, 0o640)
    status, _, err = run(Case(VALID.encode(), ("{in}", "-o", str(target)), 0, ""), tmp_path)
    assert (status, err) == (0, "")
    assert target.read_text().startswith("module {") and "xxx" not in target.read_text()
    assert os.stat(target).st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.mlir", "out.mlir"]


def test_output_to_a_device_is_written_in_place(tmp_path):
    status, _, err = run(Case(VALID.encode(), ("{in}", "-o", os.devnull), 0, ""), tmp_path)
    assert (status, err) == (0, "")
    assert not os.path.isfile(os.devnull)  # still the device, not a file renamed over it


def test_a_file_name_that_is_not_utf8_is_shown_escaped(tmp_path):
    name = os.fsdecode(b"caf\xe9.mlir")
    try:
        (tmp_path / name).write_text(function('  %0 = "topos.neg"() {node = 0 : i64} : () -> tensor<2xf32>\n'
                                              "  return %0 : tensor<2xf32>\n", "tensor<2xf32>", ""))
    except (OSError, UnicodeError):
        pytest.skip("this file system takes only UTF-8 names")
    out, err = io.StringIO(), io.StringIO()
    status = main([str(tmp_path / name)], stdout=out, stderr=err)
    assert status == 1, err.getvalue()
    assert re.search(r"caf\\xe9\.mlir:2:8: error: 'topos.neg' op node 0: expects 1 operand", err.getvalue())
