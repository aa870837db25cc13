"""Goodput under failures (issue 22): the checkpoint interval against its closed forms, the
wall-time model against an event simulation that shares none of its code, and the checkpoint
bytes against the memory model's weight and optimizer shards."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autopar.api import make_context, make_problem
from autopar.base.axes import GRID_AXES
from autopar.costs.goodput import (
    checkpoint_cost,
    daly_interval_s,
    goodput_fraction,
    optimal_interval_s,
    young_interval_s,
)
from autopar.costs.plugin import load_cost_model
from autopar.layout.plan import Layout
from cost_models.checkpoint import CheckpointBytes
from cost_models.memory import DenseParamMemory, ExpertParamMemory
from cost_models.shapes import dense_layer_params

RATIOS = np.array([1e-8, 1e-6, 1e-4, 1e-3, 0.01, 0.05, 0.2, 0.5, 1.0, 1.9, 3.0, 10.0])
"""delta / M: checkpoint cost over the job's mean time between failures."""


def test_optimal_interval_solves_the_stationary_condition() -> None:
    """tau = M (1 + W0(-e^{-d-1})) is the root of (1 - tau/M) e^{(tau+delta)/M} = 1: the zero
    of d/dtau of Daly's wall time (module docstring of autopar.costs.goodput)."""
    mtbf = 10_000.0
    u = optimal_interval_s(RATIOS * mtbf, mtbf) / mtbf
    assert np.all((u > 0) & (u < 1))
    # w = u - 1 is W0(x) for x = -e^{-d-1}: w e^w == x (Lambert W's definition)
    w = u - 1.0
    x = -np.exp(-RATIOS - 1.0)
    np.testing.assert_allclose(w * np.exp(w), x, rtol=1e-11)


@pytest.mark.parametrize("ratio", [1e-5, 1e-3, 0.02, 0.3, 1.5])
def test_optimal_interval_minimises_the_wall_time(ratio: float) -> None:
    """No interval on a fine grid around it gives a higher goodput (for any restart time)."""
    mtbf, restart = 7_200.0, 900.0
    delta = ratio * mtbf
    best = float(optimal_interval_s(delta, mtbf))
    taus = np.linspace(best * 0.2, best * 5.0, 400_001)
    fractions = goodput_fraction(taus, delta, mtbf, restart)
    grid_best = taus[np.argmax(fractions)]
    assert abs(grid_best - best) <= (taus[1] - taus[0]) * 1.5
    assert float(goodput_fraction(best, delta, mtbf, restart)) >= fractions.max() * (1 - 1e-12)


def test_daly_and_young_approximate_the_exact_optimum() -> None:
    """Daly's perturbation estimate is within 0.05 d^1.5 of the exact optimum (relative; his
    series is in sqrt(d), its error measured here is 0.0104 d^1.5) for d <= 0.5, and Young's
    sqrt(2 delta M) within sqrt(d); both agree with it as d -> 0."""
    mtbf = 3_600.0
    delta = RATIOS * mtbf
    exact = optimal_interval_s(delta, mtbf)
    small = RATIOS <= 0.5
    daly_error = np.abs(daly_interval_s(delta, mtbf) / exact - 1.0)
    young_error = np.abs(young_interval_s(delta, mtbf) / exact - 1.0)
    assert np.all(daly_error[small] <= 0.05 * RATIOS[small] ** 1.5)
    assert np.all(young_error[small] <= np.sqrt(RATIOS[small]))
    assert daly_error[0] < 1e-9 and young_error[0] < 1e-4
    # Daly's estimate is the M cap for delta >= 2M (his eq.); the exact optimum stays below M
    assert daly_interval_s(3.0 * mtbf, mtbf) == mtbf
    assert np.all(exact < mtbf)


def test_goodput_first_order_is_youngs() -> None:
    """For small delta and R the lost fraction is sqrt(2 delta / M) + R / M (Young's overhead)."""
    mtbf, delta, restart = 1e6, 10.0, 50.0
    tau = optimal_interval_s(delta, mtbf)
    lost = 1.0 - float(goodput_fraction(tau, delta, mtbf, restart))
    first_order = np.sqrt(2 * delta / mtbf) + restart / mtbf
    assert lost == pytest.approx(first_order, rel=0.01)


def _simulate_goodput(*, mtbf, interval, blocking, lag, restart, seed) -> float:
    """Simulated fraction of wall time whose training was kept (a long horizon)."""
    rng = np.random.default_rng(seed)
    now = kept = 0.0
    trained_since_durable = 0.0  # training seconds after the last durable checkpoint
    in_flight: tuple[float, float] | None = None  # (durable at, training seconds it covers)
    horizon = 4_000.0 * mtbf
    failure = rng.exponential(mtbf)
    while now < horizon:
        # one segment: train `interval`, then block `blocking` for the snapshot
        end_train = now + interval
        if in_flight is not None and in_flight[0] <= min(failure, end_train):
            kept += in_flight[1]
            trained_since_durable -= in_flight[1]
            in_flight = None
        if failure < end_train:
            now = failure
        else:
            trained_since_durable += interval
            now = end_train
            if failure >= now + blocking:
                now += blocking
                if (
                    in_flight is not None
                ):  # the writer was still busy: cannot happen if lag <= interval
                    raise AssertionError("checkpoint started before the previous one was durable")
                covered = trained_since_durable
                if lag == 0.0:
                    kept += covered
                    trained_since_durable = 0.0
                else:
                    in_flight = (now + lag, covered)
                continue
            now = failure
        # failure: lose everything not durable, then restart (failures during it restart it)
        if in_flight is not None and in_flight[0] <= now:
            kept += in_flight[1]
        in_flight, trained_since_durable = None, 0.0
        while True:
            failure = now + rng.exponential(mtbf)
            if failure >= now + restart:
                now += restart
                break
            now = failure
    return kept / now


@pytest.mark.parametrize(
    ("blocking", "lag", "restart"),
    [(30.0, 0.0, 120.0), (5.0, 60.0, 300.0), (200.0, 0.0, 0.0)],
)
def test_wall_time_model_matches_an_event_simulation(blocking, lag, restart) -> None:
    """Daly's goodput (with the async write lag counted as lost time per failure) against a
    simulation of failures, checkpoints and restarts: within 2% (the lag term is first order)."""
    mtbf = 3_600.0
    interval = max(float(optimal_interval_s(blocking, mtbf)), lag)
    model = float(goodput_fraction(interval, blocking, mtbf, restart + lag))
    simulated = _simulate_goodput(
        mtbf=mtbf, interval=interval, blocking=blocking, lag=lag, restart=restart, seed=7
    )
    assert simulated == pytest.approx(model, rel=0.02)


# ---------------------------------------------------------------------------------------------
# checkpoint bytes: the memory model's weight and optimizer shards


def _figures(problem, layout: Layout):
    ctx = make_context(problem)
    grid = {k: np.array([v]) for k, v in layout.grid_row().items()}
    return ctx, grid


def _layout(problem, **values) -> Layout:
    from autopar.api import layout_of

    return layout_of(problem, **values)


@pytest.mark.parametrize(
    ("model", "gpus", "values"),
    [
        ("llama-70b", 64, dict(tp=8, pp=4, zero=1)),
        ("llama-70b", 64, dict(tp=4, pp=2, cp=2, zero=1)),
        ("llama-8b", 16, dict(tp=2, pp=1, zero=1)),
        ("llama-70b", 64, dict(tp=8, pp=8, vpp=5, zero=1)),
    ],
)
def test_dense_checkpoint_is_the_weight_shard_at_zero3_plus_the_optimizer_shard(
    model, gpus, values
) -> None:
    """A dense model's checkpoint per rank equals the memory model's weights sharded as ZeRO-3
    shards them (less its two prefetched layers) plus its distributed-optimizer shard: the same
    parameters, the same 2 + 12 bytes, the same DP x CP sharding."""
    problem = make_problem(model=model, gpus=gpus, seq_len=4096, global_batch=256)
    layout = _layout(problem, **values)
    ctx, grid = _figures(problem, layout)
    ckpt = float(CheckpointBytes().rank_bytes(grid, ctx)[0])
    zero3 = {**grid, "zero": np.array([3])}
    weights = float(DenseParamMemory(part="weights").evaluate(zero3, ctx)[0])
    prefetch = 2.0 * dense_layer_params(ctx.model) / layout.tp * 2.0
    optimizer = float(DenseParamMemory(part="optimizer").evaluate(grid, ctx)[0])
    assert ckpt == pytest.approx(weights - prefetch + optimizer, rel=1e-12)


def _grid(**columns) -> dict[str, np.ndarray]:
    base = {"tp": 1, "pp": 1, "cp": 1, "zero": 1, "ep": 1, "etp": 1}
    size = max(len(v) if isinstance(v, list) else 1 for v in columns.values())
    out = {}
    for axis, default in base.items():
        value = columns.get(axis, default)
        out[axis] = np.array(value if isinstance(value, list) else [value] * size)
    return out


def test_checkpoint_bytes_do_not_depend_on_zero_or_cp() -> None:
    """Fully parallel save: every shard is written once whoever holds it, spread evenly, so
    ZeRO and CP move no checkpoint bytes, and a server writes its GPUs' shares."""
    problem = make_problem(model="llama-70b", gpus=64, seq_len=8192, global_batch=256)
    ctx = make_context(problem)
    grid = _grid(tp=8, pp=4, cp=[1, 2, 1, 2], zero=[0, 0, 1, 3])
    rank = CheckpointBytes().rank_bytes(grid, ctx)
    assert np.all(rank == rank[0])
    assert np.all(CheckpointBytes().evaluate(grid, ctx) == rank * 8)


def _server_by_ranks(ctx, layout: Layout) -> float:
    """What the first server of a stage writes without the fully parallel save,
    summed rank by rank (Megatron order: TP fastest, then CP, then DP): a first replica (CP and
    DP rank 0) writes its whole model-parallel shard of a replicated part; every rank writes
    its own shard of a ZeRO-sharded part."""
    from cost_models.memory import stage_dense_params

    stages = stage_dense_params(ctx.model, np.array([float(layout.tp)]), layout.pp)
    totals = []
    for params in stages:  # the most loaded stage's first server
        shard = float(params[0]) / layout.tp
        total = 0.0
        for rank in range(ctx.cluster.gpus_per_server):
            first = rank // layout.tp == 0  # cp rank 0 and dp rank 0
            for bytes_per_param, sharded_from in ((2.0, 3), (12.0, 1)):
                if layout.zero >= sharded_from:
                    total += shard * bytes_per_param / (layout.dp * layout.cp)
                elif first:
                    total += shard * bytes_per_param
        totals.append(total)
    return max(totals)


@pytest.mark.parametrize(
    "values",
    [dict(tp=8, pp=4, zero=1), dict(tp=4, pp=4, zero=0), dict(tp=2, pp=2, cp=2, zero=1),
     dict(tp=1, pp=8, zero=3)],
)  # fmt: skip
def test_first_replica_save_sums_the_servers_ranks(values) -> None:
    """Without the fully parallel save the first server writes its first replicas' shards and
    every rank's ZeRO shards: the term against a rank-by-rank sum."""
    problem = make_problem(
        model="llama-70b", gpus=64, seq_len=4096, global_batch=256,
        ckpt_fully_parallel_save=False, zero="any",
    )  # fmt: skip
    layout = _layout(problem, **values)
    ctx, grid = _figures(problem, layout)
    expected = _server_by_ranks(ctx, layout)
    assert CheckpointBytes().evaluate(grid, ctx)[0] == pytest.approx(expected, rel=1e-12)


def test_first_replica_save_makes_zero_matter() -> None:
    """The distributed optimizer (ZeRO-1) spreads the optimizer shard that plain DDP's first
    replica writes alone: its server writes less, so a layout with cheaper checkpoints exists."""
    problem = make_problem(
        model="llama-70b", gpus=64, seq_len=4096, global_batch=256, ckpt_fully_parallel_save=False
    )
    ctx = make_context(problem)
    server = CheckpointBytes().evaluate(_grid(tp=8, pp=4, zero=[0, 1]), ctx)
    # TP 8 fills the server with first replicas; DP 2 halves their optimizer shard under ZeRO-1
    assert server[1] / server[0] == pytest.approx((2.0 + 12.0 / 2) / (2.0 + 12.0))


def test_moe_checkpoint_adds_the_expert_shards() -> None:
    """An MoE model at PP 1: dense shard + expert shard, each as the memory model shards it
    (the expert optimizer over expert-DP, its weights as ZeRO-3 would); with PP the most loaded
    stage of both together is at most the sum of the two maxima the memory model takes."""
    problem = make_problem(model="mixtral-8x7b", gpus=64, seq_len=4096, global_batch=256)
    ctx = make_context(problem)
    grid = _grid(tp=4, pp=1, ep=8, zero=1)
    zero3 = {**grid, "zero": np.array([3])}
    prefetch = 2.0 * dense_layer_params(ctx.model) / 4 * 2.0
    dense = DenseParamMemory(part="weights").evaluate(zero3, ctx)[0] - prefetch
    dense += DenseParamMemory(part="optimizer").evaluate(grid, ctx)[0]
    expert = ExpertParamMemory(part="weights").evaluate(zero3, ctx)[0]
    expert += ExpertParamMemory(part="optimizer").evaluate(grid, ctx)[0]
    ckpt = CheckpointBytes().rank_bytes(grid, ctx)[0]
    assert ckpt == pytest.approx(dense + expert, rel=1e-12)
    staged = {**grid, "pp": np.array([4])}
    staged3 = {**staged, "zero": np.array([3])}
    upper = (
        DenseParamMemory(part="weights").evaluate(staged3, ctx)[0]
        - prefetch
        + DenseParamMemory(part="optimizer").evaluate(staged, ctx)[0]
        + ExpertParamMemory(part="weights").evaluate(staged3, ctx)[0]
        + ExpertParamMemory(part="optimizer").evaluate(staged, ctx)[0]
    )
    assert CheckpointBytes().rank_bytes(staged, ctx)[0] <= upper * (1 + 1e-12)


def test_whole_checkpoint_is_every_parameter_once() -> None:
    """With PP 1 all ranks write the same share: ranks x share = parameters x 14 bytes."""
    from autopar.inputs.echo import parameter_count

    problem = make_problem(model="llama-8b", gpus=8, seq_len=4096, global_batch=64)
    ctx = make_context(problem)
    grid = _grid(tp=1, pp=1)  # tp 1: no vocabulary padding
    share = CheckpointBytes().rank_bytes(grid, ctx)[0]
    padded = parameter_count(ctx.model)
    assert share * 8 == pytest.approx(padded * 14.0, rel=2e-3)


def test_async_blocks_only_for_the_snapshot() -> None:
    """Synchronous saves block for snapshot + write; asynchronous ones for the snapshot, with
    the write as durability lag; the server's GPUs share its storage bandwidth."""
    problem = make_problem(model="llama-70b", gpus=64, seq_len=4096, global_batch=256)
    ctx = make_context(problem)
    rank_bytes = np.array([1e9])
    sync = checkpoint_cost(rank_bytes, rank_bytes * 8, ctx)
    per_server = ctx.cluster.reliability.server_bytes_per_s(ctx.cluster.gpus_per_server)
    assert sync.write_s[0] == pytest.approx(8 * 1e9 / per_server)
    assert sync.snapshot_s[0] == pytest.approx(1e9 / 64e9)
    assert sync.blocking_s[0] == pytest.approx(sync.write_s[0] + sync.snapshot_s[0])
    stack = dataclasses.replace(ctx.training.stack, async_checkpoint=True)
    training = dataclasses.replace(ctx.training, stack=stack)
    asynchronous = checkpoint_cost(
        rank_bytes, rank_bytes * 8, dataclasses.replace(ctx, training=training)
    )
    assert asynchronous.blocking_s[0] == pytest.approx(sync.snapshot_s[0])
    assert asynchronous.lag_s[0] == pytest.approx(sync.write_s[0])


def test_estimates_carry_goodput_and_days() -> None:
    """evaluate: goodput in (0, 1), the interval in whole steps, interruptions per day from the
    GPU count, and days to train with failures = failure-free days / goodput."""
    from autopar.api import evaluate

    estimate = evaluate(
        model="llama-70b", gpus=1024, seq_len=8192, global_batch=512, tp=8, pp=4, vpp=5,
        train_tokens=1e12, gpu_hour_cost=2.0, gpu_mtbf_hours=10_000.0,
    )  # fmt: skip
    g = estimate.goodput
    assert 0 < g.goodput < 1
    assert g.interruptions_per_day == pytest.approx(24 * 1024 / 10_000.0)
    assert g.checkpoint_interval_s == pytest.approx(
        g.checkpoint_interval_steps * estimate.step_time_s
    )
    assert estimate.days_to_train == pytest.approx(estimate.days_to_train_failure_free / g.goodput)
    assert estimate.cost == pytest.approx(estimate.cost_failure_free / g.goodput)
    assert load_cost_model(None).checkpoint is not None


# ---------------------------------------------------------------------------------------------
# the goodput objective: CP-SAT against brute force


def _failure_prone(problem, *, parallel_save: bool = False):
    """A cluster that fails often and writes slowly, with the first-replica save (where ZeRO
    and the layout move the checkpoint), so that the checkpoint moves the optimum."""
    from autopar.inputs.reliability import ReliabilitySpec

    reliability = ReliabilitySpec(gpu_mtbf_hours=2.0, restart_s=60.0, checkpoint_bytes_per_s=2e7)
    cluster = dataclasses.replace(problem.cluster, reliability=reliability)
    stack = dataclasses.replace(problem.training.stack, ckpt_fully_parallel_save=parallel_save)
    training = dataclasses.replace(problem.training, stack=stack)
    return dataclasses.replace(problem, cluster=cluster, training=training)


@pytest.mark.parametrize("seed", range(1000, 1012))
def test_goodput_objective_matches_brute_force(seed: int) -> None:
    """Minimising the expected time per useful step: CP-SAT's optimum equals the smallest
    step time x overhead factor over every layout that fits, enumerated in numpy."""
    from autopar.costs.goodput import overhead_factor
    from autopar.costs.terms import memory_bytes, step_time_s
    from autopar.layout.space import build_space
    from autopar.search.solver import solve_space
    from tests.test_solver import random_problem

    problem = _failure_prone(random_problem(seed), parallel_save=seed % 3 == 0)
    ctx, cost_model = make_context(problem), load_cost_model(None)
    space = build_space(problem)
    factor = overhead_factor(cost_model)
    result = solve_space(space, ctx, cost_model, top_k=1, num_workers=2, time_factor=factor)
    grid = space.pruned_grid(GRID_AXES)
    expected = step_time_s(cost_model, grid, ctx) * factor.evaluate(grid, ctx)
    fits = memory_bytes(cost_model, grid, ctx) <= ctx.cluster.usable_memory_bytes
    if result.status == "infeasible":
        assert not fits.any()
        return
    assert result.status == "optimal" and result.objective == "goodput"
    best = result.best
    row = {k: np.array([v]) for k, v in best.layout.grid_row().items()}
    chosen = best.step_time_s * float(factor.evaluate(row, ctx)[0])
    assert chosen == pytest.approx(float(expected[fits].min()), rel=1e-5, abs=1e-4)


def test_goodput_objective_trades_step_time_for_cheaper_checkpoints() -> None:
    """Llama-3 70B on 64 GPUs with slow storage, frequent failures and the first-replica save:
    the step-time optimum writes fat checkpoints; the goodput objective takes a slower step
    whose ZeRO-sharded checkpoint is cheaper, and wins on expected time per useful step."""
    from autopar.api import solve

    options = dict(
        model="llama-70b", gpus=64, seq_len=4096, global_batch=256, zero="any",
        ckpt_fully_parallel_save=False, checkpoint_gb_per_s=0.5, gpu_mtbf_hours=50.0,
    )  # fmt: skip
    fastest = solve(**options).best
    useful = solve(objective="goodput", **options)
    assert useful.objective == "goodput" and useful.status == "optimal"
    best = useful.best
    assert best.layout != fastest.layout
    assert best.step_time_s >= fastest.step_time_s
    assert best.goodput.goodput > fastest.goodput.goodput
    assert best.goodput.time_per_useful_step_s < fastest.goodput.time_per_useful_step_s
    assert best.goodput.checkpoint_bytes_per_server < fastest.goodput.checkpoint_bytes_per_server


def test_cluster_file_keys_and_flags_set_the_failure_model(tmp_path) -> None:
    """A cluster file's gpu_mtbf_hours / restart_s / checkpoint_gb_per_s are the defaults the
    flags override; a bad value names the file and the key, or the flag."""
    from autopar.base.errors import InputError
    from autopar.inputs.reliability import DEFAULT_GPU_MTBF_HOURS

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("gpu: h100\ngpu_mtbf_hours: 20000\nrestart_s: 120\ncheckpoint_gb_per_s: 4\n")
    base = dict(model="llama-8b", gpus=16)
    spec = make_problem(**base, cluster=str(cluster)).cluster.reliability
    assert (spec.gpu_mtbf_hours, spec.restart_s, spec.checkpoint_bytes_per_s) == (2e4, 120.0, 4e9)
    flagged = make_problem(**base, cluster=str(cluster), restart_s=30.0).cluster.reliability
    assert flagged.restart_s == 30.0 and flagged.gpu_mtbf_hours == 2e4
    assert make_problem(**base).cluster.reliability.gpu_mtbf_hours == DEFAULT_GPU_MTBF_HOURS
    cluster.write_text("gpu: h100\ngpu_mtbf_hours: -5\n")
    with pytest.raises(InputError, match=r"cluster.yaml: gpu_mtbf_hours: must be a finite"):
        make_problem(**base, cluster=str(cluster))
    for flag, value in (("gpu_mtbf_hours", float("inf")), ("restart_s", 0.0),
                        ("checkpoint_gb_per_s", float("nan")), ("train_tokens", -1.0)):  # fmt: skip
        with pytest.raises(InputError, match=f"--{flag.replace('_', '-')}: "):
            make_problem(**base, **{flag: value})


def test_cli_rejects_a_bad_objective_or_rate_naming_the_flag() -> None:
    from typer.testing import CliRunner

    from autopar.cli import app

    base = ["solve", "--gpus", "16", "--model", "llama-8b", "--top", "1"]
    for extra, flag in (
        (["--objective", "fast"], "--objective"),
        (["--objective", "goodput", "--pipeline-plan", "per-stage"], "--objective"),
        (["--gpu-mtbf-hours", "-1"], "--gpu-mtbf-hours"),
        (["--checkpoint-gb-per-s", "inf"], "--checkpoint-gb-per-s"),
    ):
        out = CliRunner().invoke(app, [*base, *extra])
        assert out.exit_code == 2 and flag in out.output, (extra, out.output)
