"""The ```python blocks of README.md and docs/python.md run as written (each in a fresh
namespace, in a temporary folder), so the package's docs do not drift from its code."""

import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "python.md", ROOT / "python" / "README.md"]


def _blocks():
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.M | re.S):
            line = text.count("\n", 0, m.start()) + 2
            yield pytest.param(doc, line, m.group(1), id=f"{doc.relative_to(ROOT)}:{line}")


BLOCKS = list(_blocks())


def test_the_docs_have_python_examples():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("doc,line,code", BLOCKS)
def test_a_python_block_of_the_docs_runs(doc, line, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile("\n" * (line - 1) + code, str(doc), "exec"), {"__name__": "__doc_example__"})
