"""Shared fixtures: the repo's paths and a CLI runner."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()
