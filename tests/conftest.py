"""Shared fixtures: the repo's paths and a CLI runner."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import typer.testing
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"

# typer's CliRunner.invoke builds the click command from the Typer app on every call: 30-100 ms
# of CPU for autopar's whole app (about 300 options, each type hint evaluated), a fifth of the
# suite's CPU over its ~700 invocations. No test changes an app once it runs it, so each app is
# built once (the running command line builds it once per process too).
typer.testing._get_command = functools.cache(typer.testing._get_command)

# The tests that build the consumers' own config classes (megatron-core, torchtitan, DeepSpeed)
# or run torch.distributed are marked ``xdist_group("torch")``: with ``--dist loadgroup``
# (pyproject.toml) they run in one worker, so one process pays torch's import (2-6 s of CPU
# each: torch, megatron-core, DeepSpeed), not both. The tests that read the validation of the
# published runs (``tests/test_validate_published.validated``, cached per process) share
# ``xdist_group("validation")``: it is computed once (about 2 s), not in each worker.


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()
