"""An answer whatever the load (issue 21): one solve for several formats, a time limit sized
from the problem, and the best uniform layout when a per-stage search runs out of time."""

from __future__ import annotations

import json

import pytest

import autopar
from autopar import api
from autopar.cli import app
from autopar.layout.results import SolveResult
from autopar.search.solver import SIZED_LIMIT_BASE_S, SIZED_LIMIT_MAX_S, sized_time_limit_s
from tests import consumers


@pytest.mark.xdist_group("torch")  # Megatron-LM's parser: one worker imports torch (conftest)
def test_several_formats_come_from_one_solve(runner, tmp_path) -> None:
    """Two calls of one problem on a busy machine once gave two answers; one call with two
    formats writes both from the same solve."""
    out_json, out_sh = tmp_path / "plan.json", tmp_path / "plan.sh"
    argv = ["solve", "-m", "qwen3-30b-a3b", "-n", "256", "-f", "json,megatron"]
    result = runner.invoke(app, [*argv, "-o", f"{out_json},{out_sh}"])
    assert result.exit_code == 0, result.output
    best = json.loads(out_json.read_text())["layouts"][0]["layout"]
    line = out_sh.read_text().splitlines()[-1]
    flags = {k: (v[0] if v else None) for k, v in consumers.megatron_parse(line).items()}
    assert int(flags["--tensor-model-parallel-size"]) == best["tp"]
    assert int(flags["--pipeline-model-parallel-size"]) == best["pp"]
    assert int(flags["--expert-model-parallel-size"]) == best["ep"]


def test_several_formats_need_as_many_files(runner, tmp_path) -> None:
    argv = ["solve", "-m", "llama-8b", "-n", "8", "-f", "json,megatron"]
    result = runner.invoke(app, [*argv, "-o", str(tmp_path / "one.json")])
    assert result.exit_code == 2 and "--output" in result.stderr
    assert not list(tmp_path.iterdir())


def test_the_default_limit_is_sized_from_the_problem() -> None:
    assert sized_time_limit_s(0) == SIZED_LIMIT_BASE_S
    sizes = [sized_time_limit_s(n) for n in (1_000, 100_000, 1_000_000, 10**9)]
    assert sizes == sorted(sizes) and sizes[-1] == SIZED_LIMIT_MAX_S
    assert sized_time_limit_s(890_000) > 2 * SIZED_LIMIT_BASE_S  # DeepSeek-V3 on 2048 H100s


def test_a_limit_left_to_autopar_always_scores_the_whole_space() -> None:
    """Qwen3-30B-A3B on 256 H100s ended 'no layout found' at the old 10 s limit on a busy
    2-core machine; the uniform space is scored to the end whatever the load."""
    result = autopar.solve(model="qwen3-30b-a3b", gpus=256)
    assert result.status == "optimal" and result.proof.method == "enumeration"
    assert result.proof.layouts > 300_000


def test_a_per_stage_search_out_of_time_answers_with_the_uniform_layout(monkeypatch) -> None:
    from autopar.pipeline import result as search

    def out_of_time(problem, ctx, cm, **_):
        return SolveResult(status="unknown", solve_time_s=1.0, layouts=())

    monkeypatch.setattr(search, "solve_result", out_of_time)
    problem = api.make_problem(model="llama-70b", gpus=1024)
    result = api.solve_problem(problem, pipeline_plan="per-stage")
    uniform = api.solve_problem(problem)
    assert result.status == "feasible" and result.best.layout == uniform.best.layout
    assert any("per-stage search" in note for note in result.notes)


@pytest.mark.parametrize("limit", [-1.0, float("nan")])
def test_a_bad_limit_is_still_bad_input(limit) -> None:
    with pytest.raises(autopar.InputError, match="--time-limit"):
        autopar.solve(model="llama-8b", gpus=8, time_limit=limit)
