"""Every ```python block of README.md runs (in order, sharing one namespace)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks() -> list[str]:
    return BLOCK.findall(README.read_text(encoding="utf-8")) if README.exists() else []


def test_readme_has_python_examples():
    assert README.exists(), f"{README} is missing"
    assert _blocks(), "README.md has no ```python block to check"


def test_readme_python_blocks_run():
    blocks = _blocks()
    assert blocks, "README.md has no ```python block to run"
    namespace: dict = {"__name__": "__readme__"}
    for i, code in enumerate(blocks, 1):
        try:
            exec(compile(code, f"README.md:python-block-{i}", "exec"), namespace)
        except Exception as err:  # name the block in the failure
            pytest.fail(f"README.md python block {i} failed: {type(err).__name__}: {err}")
