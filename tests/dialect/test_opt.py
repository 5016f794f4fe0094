"""topos-opt and the pass registry: mlir-opt conventions, diagnostics instead of tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import topos

ir = pytest.importorskip("iree.compiler.ir")

from topos.dialect import emit_module, emit_text  # noqa: E402
from topos.dialect.ir.diagnostics import check_expected, expectations, malformed_expectations  # noqa: E402
from topos.dialect.opt import main, split_chunks  # noqa: E402
from topos.dialect.passes import registry as pass_registry  # noqa: E402
from topos.dialect.passes.registry import (  # noqa: E402
    PassFailure,
    parse_options,
    register_pass,
    run_pipeline,
    split_pipeline,
)

from . import graphs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "topos-opt")

VALID = """func.func @main(%a: tensor<2x3xf32>) -> tensor<2xf32> {
  %0 = "topos.parameter"(%a) {node = 0 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %1 = "topos.sum_along"(%0) {node = 1 : i64, axis = 1 : i64} : (tensor<2x3xf32>) -> tensor<2xf32>
  return %1 : tensor<2xf32>
}
"""

MALFORMED = {
    "syntax": (VALID.replace("(%0) {node = 1", "(%0 {node = 1"), "error: expected ')' to end operand list"),
    "operand count": (
        VALID.replace('"topos.sum_along"(%0)', '"topos.sum_along"(%0, %0)').replace(
            "(tensor<2x3xf32>) -> tensor<2xf32>", "(tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2xf32>"
        ),
        "error: 'topos.sum_along' op node 1: expects 1 operand (input), got 2",
    ),
    "bad shapes": (
        VALID.replace("tensor<2xf32>", "tensor<3xf32>"),
        "error: 'topos.sum_along' op node 1: result type tensor<3xf32> differs from tensor<2xf32>",
    ),
    "axis out of range": (VALID.replace("axis = 1", "axis = 4"), "axis 4 is out of range for rank 2"),
    "unknown op": (VALID.replace("topos.sum_along", "topos.frobnicate"), "error: unknown op 'topos.frobnicate'"),
}


def run_tool(capsys, *argv, stdin: str | None = None, monkeypatch=None):
    if stdin is not None:
        import io

        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture
def valid_file(tmp_path):
    path = tmp_path / "valid.mlir"
    path.write_text(VALID)
    return str(path)


def test_valid_input_prints_back_unchanged(capsys, valid_file, tmp_path):
    status, out, err = run_tool(capsys, valid_file, "--topos-verify")
    assert status == 0 and err == ""
    assert '%1 = "topos.sum_along"(%0) {axis = 1 : i64, node = 1 : i64} : (tensor<2x3xf32>) -> tensor<2xf32>' in out
    again = tmp_path / "again.mlir"
    again.write_text(out)
    assert run_tool(capsys, str(again))[1] == out


def test_stdin_and_output_file(capsys, monkeypatch, tmp_path):
    target = tmp_path / "out.mlir"
    status, out, _err = run_tool(capsys, "-", "-o", str(target), stdin=VALID, monkeypatch=monkeypatch)
    assert status == 0 and out == "" and '"topos.sum_along"' in target.read_text()


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_input_gives_a_located_error_and_status_1(capsys, tmp_path, case):
    text, message = MALFORMED[case]
    path = tmp_path / "bad.mlir"
    path.write_text(text)
    status, out, err = run_tool(capsys, str(path))
    assert status == 1 and out == ""
    assert err.startswith(f"{path}:"), err
    assert message in err
    assert "Traceback" not in err


def test_unknown_pass_is_an_error_not_a_traceback(capsys, valid_file):
    status, _, err = run_tool(capsys, valid_file, "-p", "canonicalize,no-such-pass")
    assert status == 1
    assert err.startswith("MLIR Textual PassPipeline Parser:1:14: error: 'no-such-pass' does not refer")
    status, _, err = run_tool(capsys, valid_file, "--no-such-pass")
    assert status == 1 and "unknown option or pass '--no-such-pass'" in err


def test_the_installed_script_never_prints_a_traceback_on_bad_input(tmp_path):
    for name, (text, message) in MALFORMED.items():
        path = tmp_path / "bad.mlir"
        path.write_text(text)
        result = subprocess.run(
            [sys.executable, TOOL, str(path), "-p", "topos-verify"], capture_output=True, text=True, check=False
        )
        assert result.returncode == 1, name
        assert message in result.stderr and "Traceback" not in result.stderr, (name, result.stderr)


def test_list_passes_names_the_registered_passes(capsys):
    status, out, _ = run_tool(capsys, "--list-passes")
    assert status == 0
    assert "--topos-verify" in out and "Check every topos op" in out
    assert "--canonicalize" in out


def test_pass_flags_run_in_command_line_order(capsys, valid_file):
    status, _, err = run_tool(
        capsys, valid_file, "--cse", "--topos-verify", "-p", "canonicalize", "--mlir-print-ir-after-all"
    )
    assert status == 0
    headers = [line for line in err.splitlines() if line.startswith("// -----// IR Dump After")]
    assert headers == [f"// -----// IR Dump After {p} //----- //" for p in ("cse", "topos-verify", "canonicalize")]


def test_split_input_file_keeps_file_line_numbers(capsys, tmp_path):
    bad = MALFORMED["axis out of range"][0]
    path = tmp_path / "split.mlir"
    path.write_text(VALID + "// -----\n" + bad)
    status, out, err = run_tool(capsys, str(path), "--split-input-file")
    assert status == 1
    assert out.count("module {") == 1
    line = VALID.count("\n") + 1 + 3  # the marker line, then the op on the chunk's third line
    assert err.startswith(f"{path}:{line}:8: error: 'topos.sum_along' op node 1: axis 4")


def test_split_chunks_counts_lines_before_each_chunk():
    assert split_chunks("a\n// -----\nb\nc\n// -----\nd", "// -----") == [("a\n", 0), ("b\nc\n", 2), ("d", 5)]


def test_verify_diagnostics_matches_expected_errors(capsys, tmp_path):
    bad = MALFORMED["axis out of range"][0].replace(
        '  %1 = "topos.sum_along"', '  // expected-error @+1 {{axis 4 is out of range}}\n  %1 = "topos.sum_along"'
    )
    path = tmp_path / "expected.mlir"
    path.write_text(bad)
    assert run_tool(capsys, str(path), "--verify-diagnostics")[0] == 0
    # An expectation that is not met, and an error nobody expected, both fail.
    path.write_text(bad.replace("axis 4 is", "axis 9 is"))
    status, _, err = run_tool(capsys, str(path), "--verify-diagnostics")
    assert status == 1
    assert 'error: expected error "axis 9 is out of range" was not produced' in err
    assert "error: unexpected error: 'topos.sum_along' op node 1: axis 4" in err


def test_expectation_offsets():
    text = ("a // expected-error {{here}}\n// expected-warning @+2 {{two below}}\n\nx\n"
            "y // expected-error @-1 {{above}}\n// expected-note @below {{next}}\n")
    found = [(e.severity, e.line, e.message) for e in expectations(text)]
    assert found == [
        ("error", 1, "here"), ("warning", 4, "two below"), ("error", 4, "above"), ("note", 7, "next")
    ]
    assert check_expected("", [], "x.mlir") == []


# mlir-opt skips an expectation it cannot read, so a typo passes a test that checks nothing.
UNREADABLE_EXPECTATIONS = {
    "no end": ("// expected-error @+1 {{unterminated", "found start of the expected-error message with no end '}}'"),
    "single closing brace": ("// expected-warning {{almost}", "found start of the expected-warning message"),
    "line that is no number": ("// expected-error @+x {{foo}}", "'@+x' is no line of expected-error; write @+N, @-N"),
    "message without braces": ("// expected-error @+1 unterminated}}", "expected '{{' to start the message"),
    "regex form": ("// expected-error-re @+1 {{a{{.*}}}}", "expected-error-re is not supported by topos-opt"),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE_EXPECTATIONS))
def test_verify_diagnostics_refuses_an_expectation_it_cannot_read(capsys, tmp_path, case):
    comment, message = UNREADABLE_EXPECTATIONS[case]
    path = tmp_path / "expected.mlir"
    path.write_text(f"{comment}\nmodule {{\n}}\n")
    status, _, err = run_tool(capsys, str(path), "--verify-diagnostics")
    assert status == 1
    assert err.startswith(f"{path}:1:4: error: {message}"), err
    assert "Traceback" not in err


def test_readable_expectations_and_prose_are_not_refused():
    text = ("// expected-error@+1{{packed}} expected-note @above {{words expected-error @+q {{inside}}\n"
            "// a sentence that names expected-error without an expectation\n")
    assert malformed_expectations(text) == []
    assert [(e.severity, e.message) for e in expectations(text)] == [
        ("error", "packed"), ("note", "words expected-error @+q {{inside")
    ]


# ---- the registry and pipelines --------------------------------------------------------


def test_split_pipeline_and_options():
    assert split_pipeline("a, b{x=1 y=2},func.func(cse, canonicalize)") == [
        ("a", 0), ("b{x=1 y=2}", 3), ("func.func(cse, canonicalize)", 14)
    ]
    assert split_pipeline("builtin.module(a,b)") == [("a", 15), ("b", 17)]
    assert parse_options('p{a=1 b="x y" c={1,2} flag}') == ("p", {"a": "1", "b": "x y", "c": "1,2", "flag": "true"})
    with pytest.raises(PassFailure, match="unbalanced"):
        split_pipeline("a{x=1")
    assert split_pipeline("builtin.module()") == [] and split_pipeline("") == []
    for pipeline, column in (("cse,", 5), (",cse", 1), ("cse, ,cse", 6)):
        with pytest.raises(PassFailure, match=f"Parser:1:{column}: error: '' does not refer to a registered pass"):
            split_pipeline(pipeline)


def test_run_pipeline_takes_a_module_and_names_the_text_entry_point():
    for given, kind in (("module {}", "a str"), (None, "None"), (b"module {}", "bytes")):
        with pytest.raises(topos.ArgumentError, match=f"run_pipeline takes a module .*, not {kind}") as caught:
            run_pipeline(given, "topos-verify")
        assert isinstance(caught.value, TypeError)
    with pytest.raises(topos.ArgumentError, match=r"transform\(text, pipeline\)"):
        run_pipeline("module {}", "topos-verify")
    with pytest.raises(topos.ArgumentError, match="run_pipeline takes the pipeline as text"):
        run_pipeline(emit_module(*graphs.walkthrough()), None)
    with pytest.raises(topos.ArgumentError, match="transform takes topos IR text \\(a str\\), not bytes; decode"):
        pass_registry.transform(b"module {}", "cse")


def test_an_unknown_fusion_kind_is_named_before_the_missing_offers():
    module = emit_module(*graphs.walkthrough())
    with pytest.raises(PassFailure, match="kinds names 'warp', which is no fusion kind \\(kinds: convolution"):
        run_pipeline(module, "topos-elect{kinds=warp}")
    with pytest.raises(PassFailure, match="topos-elect needs the offers of topos-fuse"):
        run_pipeline(module, "topos-elect{kinds=max_pool}")


def test_an_option_value_llvm_refuses_is_one_line_on_stderr(valid_file):
    # LLVM's option parser writes its complaint on file descriptor 2 itself; it joins the pipeline error.
    result = subprocess.run([sys.executable, TOOL, valid_file, "--canonicalize=max-iterations=banana"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "MLIR Textual PassPipeline Parser:1:1: error: failed to add `canonicalize` with options "
        "`max-iterations=banana`: for the --max-iterations option: 'banana' value invalid for long argument!"
    ]


@pytest.fixture
def test_passes():
    """Register two throwaway passes, and remove them afterwards."""
    calls = []

    @register_pass("test-record-options", "Record the options it ran with")
    def record(module, *, size="3", name="x"):
        calls.append((size, name))

    @register_pass("test-fail", "Fail at the first topos op")
    def fail(module):
        from topos.dialect.ir.ops import topos_operations

        raise PassFailure.at(topos_operations(module)[0], "this op is not welcome")

    @register_pass("test-crash", "Raise a Python error")
    def crash(module):
        raise KeyError("oops")

    yield calls
    for name in ("test-record-options", "test-fail", "test-crash"):
        pass_registry._REGISTRY.pop(name)


def test_python_passes_receive_their_options_as_strings(test_passes):
    module = emit_module(*graphs.walkthrough())
    run_pipeline(module, "test-record-options{size=5},test-record-options,canonicalize,cse")
    assert test_passes == [("5", "x"), ("3", "x")]
    listed = {p.name: p for p in pass_registry.registered_passes()}
    assert listed["test-record-options"].options == (("size", "3"), ("name", "x"))


def test_unknown_options_of_python_passes_are_refused(test_passes):
    module = emit_module(*graphs.walkthrough())
    with pytest.raises(PassFailure, match="pass 'test-record-options' has no option 'colour'"):
        run_pipeline(module, "test-record-options{colour=red}")


def test_pass_failures_point_at_the_op(test_passes):
    network, roots, observes = graphs.walkthrough()
    module = emit_module(network, roots, observes)
    with pytest.raises(PassFailure) as caught:
        run_pipeline(module, ["topos-verify", "test-fail"])
    first = network.nodes()[0]
    assert str(caught.value) == f"{first.site.file}:{first.site.line}:0: error: this op is not welcome"


def test_a_crashing_pass_becomes_a_diagnostic_with_the_cause_chained(test_passes):
    module = emit_module(*graphs.walkthrough())
    with pytest.raises(PassFailure, match="pass 'test-crash' crashed: KeyError: 'oops'") as caught:
        run_pipeline(module, "test-crash")
    assert isinstance(caught.value.__cause__, KeyError)
    # It points at the line that raised, so the pass's author can look there.
    lines = open(__file__, encoding="utf-8").read().splitlines()
    raising_line = next(i for i, line in enumerate(lines, 1) if 'raise KeyError("oops")' in line)
    assert caught.value.diagnostics[0].position() == (__file__, raising_line, 0)


def test_an_option_value_a_pass_refuses_points_at_the_pass_in_the_pipeline():
    @register_pass("test-refuse-option", "Refuse every value of its option")
    def refuse(module, *, size="1"):
        raise pass_registry.OptionError(f"size must be even, got {size}")

    try:
        module = emit_module(*graphs.walkthrough())
        with pytest.raises(PassFailure) as caught:
            run_pipeline(module, "topos-verify, test-refuse-option{size=3}")
        assert str(caught.value) == (
            "MLIR Textual PassPipeline Parser:1:15: error: pass 'test-refuse-option': size must be even, got 3"
        )
    finally:
        pass_registry._REGISTRY.pop("test-refuse-option")


def test_a_bug_of_topos_opt_is_an_internal_error_on_one_line(capsys, valid_file, monkeypatch):
    def broken(module, after=None):  # as an exception raised inside an MLIR walk callback arrives
        raise RuntimeError("Exception raised in callback: Traceback (most recent call last):\n"
                           '  File "x.py", line 1, in visit\nAttributeError: no such thing')

    monkeypatch.setattr(pass_registry, "verify_or_raise", broken)
    monkeypatch.delenv("TOPOS_OPT_TRACEBACK", raising=False)
    status, out, err = run_tool(capsys, valid_file)
    assert (status, out) == (2, "")
    assert err.splitlines() == [
        "topos-opt: internal error: AttributeError: no such thing",
        "topos-opt: set TOPOS_OPT_TRACEBACK=1 to see the Python traceback",
    ]


def test_verify_each_catches_a_pass_that_breaks_the_ir(test_passes):
    @register_pass("test-break", "Set an out-of-range axis")
    def breaker(module):
        from topos.dialect.ir.ops import topos_operations

        for op in topos_operations(module):
            if op.name == "topos.map":
                op.attributes["function"] = ir.StringAttr.get("relu")

    try:
        module = emit_module(*graphs.walkthrough())
        with pytest.raises(PassFailure, match="'topos.map' op node 3: attribute 'function' is \"relu\""):
            run_pipeline(module, "test-break")
        module = emit_module(*graphs.walkthrough())
        run_pipeline(module, "test-break", verify_each=False)
    finally:
        pass_registry._REGISTRY.pop("test-break")


def test_registering_a_second_pass_under_a_taken_name_fails():
    with pytest.raises(ValueError, match="already registered"):
        register_pass("topos-verify", "again")(lambda module: None)


def test_emitted_text_passes_topos_opt_unchanged(capsys, tmp_path):
    network, roots, observes = graphs.every_opcode()
    text = emit_text(network, roots, observes)
    path = tmp_path / "every.mlir"
    path.write_text(text)
    status, out, err = run_tool(capsys, str(path), "--topos-verify", "--mlir-print-debuginfo")
    assert status == 0 and err == ""
    assert out == text
