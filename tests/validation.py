"""The validation of the published runs (``benchmarks/validate_published.py``), computed once
per test process and shared by the validation tests (``test_validate_published``,
``test_validate_moe``, ``test_validate_blackwell``, ``test_error_bands``; each filters its own
rows). Not a test module: pytest imports test modules under their file name
(``test_validate_published``) while the others imported them as ``tests.test_...``, so a cache
held by a test module existed twice and the validation ran twice per process."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks/validate_published.py"
HELDOUT = SCRIPT.with_name("heldout.py")


def _load():
    spec = importlib.util.spec_from_file_location("validate_published", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while decorating
    spec.loader.exec_module(module)
    return module


validate_published = _load()


@functools.cache
def validated():
    """(every modelled run, the skipped rows)."""
    if not validate_published.DEFAULT_CSV.exists():
        pytest.fail(f"published runs missing: {validate_published.DEFAULT_CSV}")
    return validate_published.validate(validate_published.DEFAULT_CSV)


@functools.cache
def heldout_residuals() -> tuple[dict, ...]:
    """The held-out runs' residuals (``benchmarks/heldout.py``: MLPerf and NeMo), which the
    error bands also take."""
    spec = importlib.util.spec_from_file_location("heldout", HELDOUT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)  # imports validate_published: the module loaded above
    return tuple(module.residual_table(module.heldout_cases()))
