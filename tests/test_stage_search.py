"""The per-stage search's parts (issue 19): the vectorised stage tables against a per-spread loop
and against the figures of the plans they stand for, under Megatron's schedule and a plugged-in
one; bounds that are never written; runners-up that share the first solve's tables."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest

from autopar.api import make_context
from autopar.base.axes import GRID_AXES
from autopar.costs.plugin import load_cost_model
from autopar.costs.schedule import MEGATRON, simulate_step_s
from autopar.costs.stage_costs import StageCosts, probe_stage_costs
from autopar.costs.stage_figures import stage_figures
from autopar.layout.stages import StagePlan, StageRecompute, even_plan
from autopar.pipeline import tables as table_module
from autopar.pipeline.candidates import per_stage_space
from autopar.pipeline.encoding import Bounds, Shape, least_layers, shapes_of
from autopar.pipeline.search import solve_stages_top
from autopar.pipeline.tables import stage_table
from tests.test_stages import small_problem

MODE_SETS = (("none", "selective", "full"), ("full",), ("selective", "full"), ("none",))


@dataclass(frozen=True, slots=True)
class GPipe:
    """A schedule to plug in: every forward before every backward, so each stage holds all
    ``m`` micro-batches (Huang et al. 2019, GPipe §2.2); the same closed form as 1F1B."""

    name: str = "gpipe"

    def in_flight(self, pp, vpp, num_microbatches, stage):
        return (num_microbatches,) * vpp

    def step_weights(self, pp, vpp, num_microbatches):
        return Fraction(num_microbatches * vpp - 1, vpp), Fraction(1, vpp)

    def pipeline_s(self, slowest_s, total_s, num_microbatches, *, pp, vpp):
        return MEGATRON.pipeline_s(slowest_s, total_s, num_microbatches, pp=pp, vpp=vpp)

    def simulate_s(self, forward_s, backward_s, num_microbatches):
        return simulate_step_s(forward_s, backward_s, num_microbatches)


def _reference_spreads(n, p, v, stage, weights):
    """The spreads of ``n`` layers, one by one (the loop the vectorised table replaced)."""
    if v == 1:
        return [(n,)]
    end = 0 if stage == 0 else (v - 1 if stage == p - 1 else None)
    others = [j for j in range(v) if j != end]
    order = sorted(others, key=lambda j: (weights[j], -j))
    out = []
    for e in range(0, n + 1) if end is not None else [None]:
        q, extra = divmod(n - (e or 0), len(others))
        if q < 1 or (e is not None and e > q + 1):
            continue
        chunks = [0] * v
        for rank, j in enumerate(order):
            chunks[j] = q + (1 if rank < extra else 0)
        if end is not None:
            chunks[end] = e
        out.append(tuple(chunks))
    return out


def _reference_table(costs: StageCosts, shape: Shape, stage, m, modes, capacity):
    """(time, option, chunks) per row and layer count, one spread and recompute at a time in
    the order none, selective, full 1..k, the first strictly faster one kept."""
    kind = costs.layer_kinds[0]
    t, a, s = costs.time_s[kind], costs.activation_bytes[kind], costs.static_bytes[kind]
    p, v, num_layers, rows = shape.pp, shape.vpp, len(costs.layer_kinds), len(m)
    fixed_t, static = costs.every_time_s.copy(), costs.every_static_bytes.copy()
    extra = np.zeros((rows, v))
    extra[:, 0] += costs.every_activation_bytes
    if stage == 0:
        fixed_t, static = fixed_t + costs.first_time_s, static + costs.first_static_bytes
        extra[:, 0] += costs.first_activation_bytes
    if stage == p - 1:
        fixed_t, static = fixed_t + costs.last_time_s, static + costs.last_static_bytes
        extra[:, v - 1] += costs.last_activation_bytes
    w = np.array([shape.schedule.in_flight(p, v, int(x), stage) for x in m], dtype=float)
    weights = shape.schedule.in_flight(p, v, int(np.min(m)), stage)
    fixed_act = (w * extra).sum(axis=1)
    time = np.full((rows, num_layers + 1), np.inf)
    option = np.zeros((rows, num_layers + 1), dtype=np.int64)
    chunks = np.full((rows, num_layers + 1), None, dtype=object)
    for n in range(least_layers(p, v, stage, num_layers), num_layers + 1):
        for d in _reference_spreads(n, p, v, stage, weights):
            weighted = w @ np.array(d, dtype=float)
            none_mem = static + n * s + fixed_act + weighted * a[:, 0]
            choices = []
            if "none" in modes:
                choices.append((n * t[:, 0] + fixed_t, none_mem, 0))
            if "selective" in modes:
                mem = static + n * s + costs.selective_workspace_bytes + fixed_act
                choices.append((n * t[:, 1] + fixed_t, mem + weighted * a[:, 1], 1))
            for k in range(1, max(d) + 1) if "full" in modes and n else ():
                if "none" not in modes and k != max(d):
                    continue
                mins = np.minimum(k, np.array(d, dtype=float))
                mem = none_mem + costs.full_workspace_bytes - (w @ mins) * (a[:, 0] - a[:, 2])
                choices.append(
                    (n * t[:, 0] + fixed_t + mins.sum() * (t[:, 2] - t[:, 0]), mem, 1 + k)
                )
            for time_s, mem, code in choices:
                take = (mem <= capacity) & (time_s < time[:, n])
                time[:, n] = np.where(take, time_s, time[:, n])
                option[:, n] = np.where(take, code, option[:, n])
                for r in np.flatnonzero(take):
                    chunks[r, n] = d
    return time, option, chunks


def _shapes_of_problem(seed: int):
    problem = small_problem(seed)
    ctx, cm = make_context(problem), load_cost_model(None)
    grid = per_stage_space(problem).pruned_grid(GRID_AXES)
    costs = probe_stage_costs(cm, ctx, grid)
    return problem, ctx, grid, costs


@pytest.mark.parametrize("seed", [3, 9, 24, 49])
@pytest.mark.parametrize("schedule", [MEGATRON, GPipe()], ids=["megatron", "gpipe"])
def test_stage_table_is_the_best_spread_and_recompute(seed, schedule):
    """Every entry of the vectorised table equals the per-spread loop's (time, recompute and
    chunks), for every mode set; and it is the time ``stage_figures`` gives that stage in a
    plan with those chunks and that recompute, within the capacity."""
    problem, ctx, grid, costs = _shapes_of_problem(seed)
    capacity = float(ctx.cluster.usable_memory_bytes)
    for shape, rows in shapes_of(grid).items():
        shape = Shape(shape.pp, shape.vpp, schedule)
        sub, m = costs.take(rows), grid["grad_accum"][rows]
        for modes in MODE_SETS:
            for stage in range(shape.pp):
                table = stage_table(
                    sub, shape=shape, stage=stage, num_microbatches=m, modes=modes,
                    capacity_bytes=capacity,
                )  # fmt: skip
                time, option, chunks = _reference_table(sub, shape, stage, m, modes, capacity)
                assert np.array_equal(table.time_s, time)
                assert np.array_equal(table.option, option)
                for r, n in np.argwhere(np.isfinite(time)):
                    assert table.chunks(r, n) == chunks[r, n]
        _check_against_figures(sub, shape, m, capacity, problem.options.recompute)


def _check_against_figures(costs, shape, m, capacity, modes):
    """A plan built from each stage's table entries prices each stage as its table says."""
    p, v = shape.pp, shape.vpp
    layers = costs.layer_kinds
    tables = [
        stage_table(
            costs, shape=shape, stage=i, num_microbatches=m, modes=tuple(modes),
            capacity_bytes=capacity,
        )
        for i in range(p)
    ]  # fmt: skip
    even = even_plan(len(layers), p, v, StageRecompute())
    counts = [even.stage_layers(i) for i in range(p)]
    for r in range(len(m)):
        if not all(np.isfinite(tables[i].time_s[r, counts[i]]) for i in range(p)):
            continue
        chunk = [0] * (p * v)
        for i in range(p):
            for j, n in enumerate(tables[i].chunks(r, counts[i])):
                chunk[j * p + i] = n
        recompute = tuple(tables[i].recompute(r, counts[i]) for i in range(p))
        plan = StagePlan(pp=p, vpp=v, chunk_layers=tuple(chunk), recompute=recompute)
        figures = stage_figures(plan, costs.take([r]), m[r : r + 1], schedule=shape.schedule)
        expected = [tables[i].time_s[r, counts[i]] for i in range(p)]
        assert figures.time_s[0] == pytest.approx(expected, rel=1e-12)
        assert (figures.memory_bytes[0] <= capacity * (1 + 1e-12)).all()


def test_bounds_are_never_written():
    """Tightening returns new bounds; the arrays of a ``Bounds`` are read-only."""
    bounds = Bounds.of([1.0, 2.0, 3.0], [4.0, 5.0, np.inf], [None, None, None])
    plan = even_plan(4, 2, 1, StageRecompute())
    tighter = bounds.tightened(np.array([1, 2]), [2.5, 1.0], [4.5, 6.0], lambda j: plan)
    assert list(bounds.lower_s) == [1.0, 2.0, 3.0] and bounds.plans == (None, None, None)
    assert list(tighter.lower_s) == [1.0, 2.5, 3.0]
    assert list(tighter.upper_s) == [4.0, 4.5, 6.0] and tighter.plans == (None, plan, plan)
    with pytest.raises(ValueError):
        tighter.lower_s[0] = 0.0
    assert list(tighter.open_rows()) == [0, 1, 2] and list(tighter.open_rows([0])) == [1, 2]
    assert list(tighter.rows_for_top(1)) == [0, 1, 2] and tighter.best_row([0]) == 1


@pytest.mark.parametrize("seed", [3, 49])
def test_runners_up_reuse_the_first_solves_tables(seed, monkeypatch):
    """``--top 3``: each stage's table of each row is built once over all three solves (the
    runners-up reuse the bounds and tables the first solve tightened)."""
    built: list[tuple[int, int, int, tuple[int, ...]]] = []
    original = table_module.stage_table

    def counting(costs, *, shape, stage, num_microbatches, **kw):
        built.append((shape.pp, shape.vpp, stage, len(num_microbatches)))
        return original(costs, shape=shape, stage=stage, num_microbatches=num_microbatches, **kw)

    monkeypatch.setattr(table_module, "stage_table", counting)
    problem = small_problem(seed)
    ctx, cm = make_context(problem), load_cost_model(None)
    solutions = solve_stages_top(problem, ctx, cm, top=3, time_limit_s=30.0)
    assert len([s for s in solutions if s.plan is not None]) >= 2
    once = {}
    for p, v, stage, _ in built:
        once[(p, v, stage)] = once.get((p, v, stage), 0) + 1
    # one batch per shape: the rows that can hold a top-3 layout, tightened before solve 1
    assert set(once.values()) == {1}
