"""Explanations that help (issue 21): what binds, the nearest layouts worth training with, the
nearest GPU counts that work (below and above), only changes that are not already the default,
every flag as autopar spells it, and the default batch named when it is the trouble."""

from __future__ import annotations

import json
import re

import pytest

import autopar
from autopar.base.errors import InputError
from autopar.cli import app
from autopar.search.explain import SENSIBLE_SLOWDOWN


@pytest.fixture
def solve_flags(runner) -> set[str]:
    text = runner.invoke(app, ["solve", "--help"], terminal_width=400).output
    return set(re.findall(r"--[a-z0-9-]+", text))


def _flags(text: str) -> list[str]:
    return re.findall(r"(?<![\w-])--[a-z0-9-]+", text)


def test_nearby_gpu_counts_below_and_above_that_work(runner) -> None:
    """1,000 GPUs = 2^3 x 5^3: no TP, CP, PP and DP sizes split it for Llama-3 70B at the
    default batch; 992 (PP 31) is the nearest below, and every count offered solves."""
    out = runner.invoke(app, ["solve", "--model", "llama-70b", "--gpus", "1000", "-f", "json"])
    assert out.exit_code == 1, out.output
    suggestions = json.loads(out.stdout)["explanation"]["suggestions"]
    counts = [int(m) for s in suggestions for m in re.findall(r"--gpus (\d+)", s)]
    assert counts[0] == 992
    assert any(c < 1000 for c in counts[1:]) and any(c > 1000 for c in counts)
    for count in counts:
        assert autopar.solve(model="llama-70b", gpus=count).status == "optimal"


def test_changes_offered_are_autopar_flags_and_not_defaults(runner, solve_flags) -> None:
    """Llama-3.1 405B on 2,048 H100s with even splits only: memory binds. Every flag offered is
    one of `autopar solve`'s, none repeats what is already allowed (recompute is any), and
    lifting --even-pipeline is among them."""
    args = ["solve", "--model", "llama-3.1-405b", "--gpus", "2048", "--seq-len", "8192"]
    out = runner.invoke(app, [*args, "--global-batch", "1024", "--even-pipeline", "-f", "json"])
    assert out.exit_code == 1, out.output
    explanation = json.loads(out.stdout)["explanation"]
    suggestions = explanation["suggestions"]
    assert suggestions and any(s.startswith("--uneven-pipeline") for s in suggestions)
    assert not any("--recompute any" in s for s in suggestions)
    for suggestion in suggestions:
        assert set(_flags(suggestion)) <= solve_flags, suggestion


def test_the_nearest_miss_is_one_worth_training_with() -> None:
    """The least memory at any speed splits 8k tokens over 128 CP ranks and runs 30x slower;
    the nearest miss stays within SENSIBLE_SLOWDOWN of the fastest layout, and the least at any
    speed is said beside it."""
    result = autopar.solve(
        model="llama-3.1-405b", gpus=2048, seq_len=8192, global_batch=1024, uneven_pipeline=False
    )
    miss = result.explanation.nearest_miss
    assert result.status == "infeasible" and miss.min_memory_bytes > miss.capacity_bytes
    assert miss.least_memory_bytes <= miss.min_memory_bytes
    assert miss.least_step_time_s > SENSIBLE_SLOWDOWN * miss.step_time_s
    assert miss.layout["cp"] < miss.least_layout["cp"]
    capacity_free = autopar.solve(
        model="llama-3.1-405b",
        gpus=2048,
        gpu="b200",
        seq_len=8192,
        global_batch=1024,
        uneven_pipeline=False,
    )
    assert miss.step_time_s <= SENSIBLE_SLOWDOWN * 10 * capacity_free.best.step_time_s


def test_only_the_families_that_bind() -> None:
    """1,000 GPUs for Llama-3 70B at 1,024 sequences: 5^3 fits in no TP (64 heads), CP (4,096
    tokens), DP (the batch) or PP (80 layers); each of those families binds and no other is
    named."""
    result = autopar.solve(model="llama-70b", gpus=1000)
    families = {f.family for f in result.explanation.families}
    expected = {"GPU count", "global batch", "attention heads vs TP", "layers vs PP"}
    assert families == expected | {"sequence vs CP"}


def test_the_default_batch_is_named_when_it_is_the_trouble() -> None:
    """4 Mi tokens on 1,024 GPUs: one micro-batch per replica for Llama-3 8B. A batch the
    user gives is never flagged."""
    default = autopar.solve(model="llama-8b", gpus=1024)
    assert any("autopar's default" in note for note in default.notes)
    given = autopar.solve(model="llama-8b", gpus=1024, global_batch=1024)
    assert not any("autopar's default" in note for note in given.notes)
    assert given.best.layout == default.best.layout


def test_prefer_must_be_known() -> None:
    with pytest.raises(InputError, match="--prefer"):
        autopar.solve(model="llama-8b", gpus=8, prefer="cheapest")


def test_a_shorter_sequence_changes_the_sequence_alone() -> None:
    """The sequence suggestion halves --seq-len and leaves every other part of the problem as
    it was; an odd length gets none."""
    import dataclasses

    from autopar.search.nearby import nearby_sequences

    problem = autopar.make_problem(model="llama-8b", gpus=16, seq_len=6144, global_batch=64)
    ((change, changed),) = nearby_sequences(problem)
    assert _flags(change) == ["--seq-len"] and "3072 tokens" in change
    assert changed.training.seq_len == problem.training.seq_len // 2
    assert dataclasses.replace(changed.training, seq_len=6144) == problem.training
    assert (changed.model, changed.cluster, changed.options) == (
        problem.model,
        problem.cluster,
        problem.options,
    )
    odd = autopar.make_problem(model="llama-8b", gpus=16, seq_len=4097, global_batch=64)
    assert nearby_sequences(odd) == []
