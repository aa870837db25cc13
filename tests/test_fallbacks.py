"""Fallback layouts for lost servers (issue 22) against brute force: every GPU count and batch
allowed, every layout of each, enumerated in numpy."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from typer.testing import CliRunner

from autopar.api import make_context, make_problem
from autopar.base.axes import GRID_AXES
from autopar.cli import app
from autopar.costs.plugin import load_cost_model
from autopar.costs.terms import memory_bytes, step_time_s
from autopar.layout.space import build_space
from autopar.sweeps.fallbacks import _batches, candidates, fallbacks_problem
from tests.test_solver import random_problem

TOLERANCE = 1e-4  # CP-SAT's integer microseconds against the oracle's floats


@functools.cache
def _best_tokens(problem) -> float:
    """The oracle: the highest tokens/s over every layout that fits (0 when none). Cached: each
    row's brute force covers every GPU count up to its own, so the rows (and the tests on one
    seed) ask again for the same problems."""
    ctx, cost_model = make_context(problem), load_cost_model(None)
    grid = build_space(problem).pruned_grid(GRID_AXES)
    if not len(grid["tp"]):
        return 0.0
    times = step_time_s(cost_model, grid, ctx)
    fits = memory_bytes(cost_model, grid, ctx) <= ctx.cluster.usable_memory_bytes
    if not fits.any():
        return 0.0
    return problem.training.global_batch_tokens / float(times[fits].min())


def _brute_force(problem, limit: int, tolerance: float) -> float:
    """Every GPU count up to ``limit`` and every batch in the window, each solved by the oracle."""
    best = 0.0
    for gpus in range(1, limit + 1):
        for batch in _batches(problem.training.global_batch_sequences, tolerance):
            training = dataclasses.replace(
                problem.training, num_gpus=gpus, global_batch_sequences=batch
            )
            best = max(best, _best_tokens(dataclasses.replace(problem, training=training)))
    return best


def _small(seed: int):
    """A random small problem on 2-GPU servers (so that several can be lost)."""
    problem = random_problem(seed)
    gpu = dataclasses.replace(problem.cluster.gpu, gpus_per_server=2)
    return dataclasses.replace(problem, cluster=dataclasses.replace(problem.cluster, gpu=gpu))


EXACT = (301, 302, 305, 335)
LOOSE = (301, 310, 326)
"""Random problems with at least two 2-GPU servers, small enough for the brute force."""


@pytest.mark.parametrize(
    ("seed", "tolerance"), [(s, 0.0) for s in EXACT] + [(s, 0.1) for s in LOOSE] + [(303, 0.0)]
)
def test_fallbacks_match_brute_force(seed: int, tolerance: float) -> None:
    """Each row's throughput is the best over every GPU count and batch allowed (rows with
    none are infeasible and say why); the layout it returns is one of those it claims."""
    problem = _small(seed)
    gpus = problem.training.num_gpus
    lost = min(3, (gpus - 1) // 2)
    result = fallbacks_problem(problem, lost_servers=lost, batch_tolerance=tolerance, num_workers=1)
    for row in result.rows:
        expected = _brute_force(problem, row.remaining_gpus, tolerance)
        if expected == 0.0:
            assert row.status == "infeasible" and row.explanation.summary
            continue
        assert row.status == "optimal"
        assert row.tokens_per_s == pytest.approx(expected, rel=TOLERANCE)
        assert row.gpus <= row.remaining_gpus
        layout = row.estimate.layout
        assert layout.num_gpus == row.gpus
        assert layout.mbs * layout.dp * layout.grad_accum == row.global_batch
        window = _batches(problem.training.global_batch_sequences, tolerance)
        assert row.global_batch in window
        assert row.estimate.fits


def test_candidates_cover_every_factorisation() -> None:
    """A candidate for every GPU count with a layout, and only counts within the limit."""
    problem = _small(300)
    pairs = set(candidates(problem, problem.training.num_gpus, 0.0))
    batch = problem.training.global_batch_sequences
    for gpus in range(1, problem.training.num_gpus + 1):
        training = dataclasses.replace(problem.training, num_gpus=gpus)
        if _best_tokens(dataclasses.replace(problem, training=training)) > 0:
            assert (gpus, batch) in pairs


def test_lost_node_of_a_power_of_two_job_idles_gpus() -> None:
    """Llama-3 8B on 32 H100s, batch 256, even splits only (``--even-pipeline``; by default PP 3
    splits its 32 layers 11 / 11 / 10): 24 GPUs admit no layout of that batch, so the fallback
    leaves some idle; a batch tolerance uses more of them."""
    problem = make_problem(
        model="llama-8b", gpus=32, seq_len=4096, global_batch=256, uneven_pipeline=False
    )
    exact = fallbacks_problem(problem, lost_servers=1)
    row = exact.rows[0]
    assert row.status == "optimal" and row.remaining_gpus == 24
    assert row.gpus < 24 and row.global_batch == 256 and row.note is None
    assert 0 < row.throughput_lost < 1
    loose = fallbacks_problem(problem, lost_servers=1, batch_tolerance=0.1, baseline=exact.baseline)
    assert loose.rows[0].tokens_per_s >= row.tokens_per_s
    assert loose.rows[0].global_batch != 256 and loose.rows[0].gpus > row.gpus
    assert "sqrt" in loose.rows[0].note


def test_trays_of_gb200_are_the_unit_lost() -> None:
    problem = make_problem(model="llama-8b", gpus=144, gpu="gb200", global_batch=288)
    result = fallbacks_problem(problem, lost_servers=2)
    assert result.gpus_per_server == 4
    assert [row.remaining_gpus for row in result.rows] == [140, 136]


def test_cli_fallbacks_rows_and_bad_input() -> None:
    runner = CliRunner()
    base = ["solve", "--gpus", "16", "--model", "llama-8b", "--global-batch", "64", "--top", "1"]
    out = runner.invoke(app, [*base, "--fallback-nodes", "1"])
    assert out.exit_code == 0, out.output
    assert "fallbacks    losing servers of 8 GPUs" in out.output
    assert "proof" in out.output
    for flags, flag in (
        (["--fallback-nodes", "2"], "--fallback-nodes"),  # 2 servers of 8: no GPU left
        (["--fallback-nodes", "1", "--batch-tolerance", "0.7"], "--batch-tolerance"),
        (["--fallback-nodes", "1", "--batch-tolerance", "nan"], "--batch-tolerance"),
        (["--fallback-nodes", "0"], "--fallback-nodes"),
        (["--fallback-nodes", "1", "--format", "megatron"], "--fallback-nodes"),
        (["--emit-fallback", "1"], "--emit-fallback"),
    ):
        out = runner.invoke(app, [*base, *flags])
        assert out.exit_code == 2, (flags, out.output)
        assert flag in out.output, out.output


def test_cli_emits_a_fallback_in_a_launcher_format() -> None:
    runner = CliRunner()
    args = ["solve", "--gpus", "16", "--model", "llama-8b", "--global-batch", "64", "--top", "1",
            "--fallback-nodes", "1", "--emit-fallback", "1", "--format", "megatron"]  # fmt: skip
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    assert "--global-batch-size 64" in out.output
    sizes = [int(out.output.split(f"--{name} ")[1].split()[0]) for name in (
        "tensor-model-parallel-size", "pipeline-model-parallel-size")]  # fmt: skip
    assert 8 % (sizes[0] * sizes[1]) == 0 or sizes[0] * sizes[1] <= 8


def test_fallbacks_json_follows_the_solve_schema() -> None:
    """JSON: the solve, then its fallbacks, each row's layout an evaluate object, each field
    in autopar/schemas/solve.schema.json; CSV: one row per lost-server count."""
    import json

    from tests.test_formats_cli import _validator

    args = ["solve", "--gpus", "16", "--model", "llama-8b", "--global-batch", "64", "--top", "1",
            "--fallback-nodes", "1"]  # fmt: skip
    out = CliRunner().invoke(app, [*args, "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    _validator("solve").validate(data)
    row = data["fallbacks"]["fallbacks"][0]
    assert row["lost_servers"] == 1 and row["remaining_gpus"] == 8
    assert row["layout"]["goodput"]["goodput"] > 0
    csv = CliRunner().invoke(app, [*args, "--format", "csv"])
    assert csv.exit_code == 0 and csv.output.splitlines()[0].startswith("lost_servers,")
    assert len(csv.output.strip().splitlines()) == 2
