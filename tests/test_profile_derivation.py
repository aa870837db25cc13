"""Communication profiles: collectives a profile lacks are derived from those it has, and the
output says which times are measured, derived or from the datasheet (issue 11)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autopar.calibration.profile_io import load_profile
from autopar.cli import app
from tests.conftest import DATA


def _profile(runner, tmp_path, log: str) -> str:
    path = tmp_path / "profile.yaml"
    result = runner.invoke(app, ["calibrate", str(DATA / "nccl" / log), "--output", str(path)])
    assert result.exit_code == 0, result.output
    return str(path)


def test_all_reduce_only_profile_derives_reduce_scatter_and_all_gather(runner, tmp_path) -> None:
    profile = load_profile(_profile(runner, tmp_path, "a100_1n8g_all_reduce_abci.log"))
    sources = profile.provenance()
    assert sources["all_reduce/intra"] == "measured"
    assert sources["reduce_scatter/intra"] == "derived from all_reduce"
    assert sources["all_gather/intra"] == "derived from all_reduce"
    assert sources["all_to_all/intra"] == "datasheet"
    size = np.array([2.0**28])
    all_reduce = profile.time_s("all_reduce", size, num_ranks=8, num_nodes=1)
    scatter = profile.time_s("reduce_scatter", size, num_ranks=8, num_nodes=1)
    assert scatter == pytest.approx(0.5 * all_reduce)


def test_reduce_scatter_profile_derives_all_reduce(runner, tmp_path) -> None:
    profile = load_profile(_profile(runner, tmp_path, "a100_1n8g_reduce_scatter_superbench.log"))
    assert profile.provenance()["all_reduce/intra"] == "derived from reduce_scatter"
    size = np.array([2.0**28])
    scatter = profile.time_s("reduce_scatter", size, num_ranks=8, num_nodes=1)
    assert profile.time_s("all_reduce", size, num_ranks=8, num_nodes=1) == pytest.approx(
        2.0 * scatter
    )


def test_sources_are_in_the_output(runner, tmp_path) -> None:
    path = _profile(runner, tmp_path, "a100_1n8g_all_reduce_abci.log")
    argv = ["evaluate", "-m", "llama-3-8b", "-n", "8", "--gpu", "a100-80gb", "--tp", "8"]
    data = json.loads(runner.invoke(app, [*argv, "--comm-profile", path, "-f", "json"]).output)
    assert data["inputs"]["collective_sources"]["reduce_scatter/intra"] == "derived from all_reduce"
    table = runner.invoke(app, [*argv, "--comm-profile", path]).output
    assert "reduce_scatter/intra derived from all_reduce" in table
    assert "all_to_all/inter datasheet" in table
