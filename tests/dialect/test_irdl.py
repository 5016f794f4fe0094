"""The generated artifacts are current, and MLIR's verifier uses the IRDL file to accept and reject topos IR."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("iree.compiler.ir")

from topos.dialect import emit_text
from topos.dialect.ir import irdl  # noqa: E402

from . import graphs  # noqa: E402

IREE_OPT = shutil.which("iree-opt") or os.path.join(os.path.dirname(sys.executable), "iree-opt")
needs_iree_opt = pytest.mark.skipif(not os.path.exists(IREE_OPT), reason="iree-opt is not installed")


def test_committed_irdl_file_is_current():
    with open(irdl.IRDL_PATH, encoding="utf-8") as handle:
        assert handle.read() == irdl.irdl_text(), "regenerate with: python -m topos.dialect.ir.irdl"


def test_committed_op_reference_in_docs_is_current():
    with open(irdl.DOC_PATH, encoding="utf-8") as handle:
        document = handle.read()
    assert irdl.document_with_reference(document) == document, "regenerate with: python -m topos.dialect.ir.irdl"


def test_irdl_names_every_op_once():
    text = irdl.irdl_text()
    for name in irdl.OP_CLASSES:
        assert text.count(f"irdl.operation @{name} {{") == 1


def test_guide_example_is_the_tested_pass_module():
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(here, "lit_tests", "Inputs", "consumers_pass.py"), encoding="utf-8") as handle:
        example = handle.read()
    with open(irdl.DOC_PATH, encoding="utf-8") as handle:
        document = handle.read()
    body = example[example.index("from iree.compiler import ir") :]
    assert body in document, "docs/dialect.md must show lit_tests/Inputs/consumers_pass.py as tested"


def _iree_opt(text: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [IREE_OPT, f"--irdl-file={irdl.IRDL_PATH}", *extra, "-"],
        input=text, capture_output=True, text=True, check=False,
    )


@needs_iree_opt
@pytest.mark.parametrize("name", sorted(graphs.GRAPHS))
def test_iree_opt_accepts_emitted_ir(name):
    text = emit_text(*graphs.GRAPHS[name]())
    result = _iree_opt(text)
    assert result.returncode == 0, result.stderr


MALFORMED = {
    "operand count": ('"topos.neg"(%0, %0) {node = 1 : i64} : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>',
                      "expects exactly 1 operands, but got 2"),
    "elementwise types differ": ('"topos.neg"(%0) {node = 1 : i64} : (tensor<2xf32>) -> tensor<3xf32>',
                                 "expected 'tensor<2xf32>' but got 'tensor<3xf32>'"),
    "missing node": ('"topos.neg"(%0) : (tensor<2xf32>) -> tensor<2xf32>', 'attribute "node" is expected'),
    "unknown op": ('"topos.relu"(%0) {node = 1 : i64} : (tensor<2xf32>) -> tensor<2xf32>',
                   "unregistered operation 'topos.relu'"),
    "map function": ('"topos.map"(%0) {node = 1 : i64, function = "relu"} : (tensor<2xf32>) -> tensor<2xf32>',
                     "does not satisfy the constraint"),
}


@needs_iree_opt
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_iree_opt_rejects_malformed_ops(case):
    op, message = MALFORMED[case]
    result_type = "tensor<3xf32>" if "tensor<3xf32>" in op else "tensor<2xf32>"
    text = f"""func.func @main(%a: tensor<2xf32>) -> {result_type} {{
  %0 = "topos.parameter"(%a) {{node = 0 : i64}} : (tensor<2xf32>) -> tensor<2xf32>
  %1 = {op}
  return %1 : {result_type}
}}"""
    result = _iree_opt(text)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
