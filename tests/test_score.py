"""Scoring every layout (autopar.costs.score) against the brute-force oracle: the same layouts,
the same figures, the same best rows in the documented order; the band and the memory front;
and the fallback when the time limit strikes (issue 21: an answer whatever the load)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from autopar.api import make_context, make_problem
from autopar.base.axes import GRID_AXES, tie_key
from autopar.costs.plugin import load_cost_model
from autopar.costs.score import US_PER_S, score_space
from autopar.layout.space import build_space
from autopar.search.solver import solve_space
from tests.oracle import enumerate_layouts
from tests.test_solver import random_problem
from tests.toy_cost_model import toy_cost_model


def _oracle_rows(space, ctx, cost_model):
    grid, times, memory = enumerate_layouts(space, ctx, cost_model)
    rows = [{a: int(grid[a][i]) for a in GRID_AXES} for i in range(len(times))]
    return rows, times, memory


# The oracle's layouts read as numpy columns: on 20k-100k layouts one dict per layout, scanned
# per axis value and tie-keyed whole, cost more CPU than the scoring under test.
def _row(grid, i) -> dict[str, int]:
    return {a: int(grid[a][i]) for a in GRID_AXES}


def _index(grid, row: dict[str, int]) -> int:
    """The first layout equal to ``row`` (as ``list.index`` on the rows)."""
    same = np.logical_and.reduce([grid[a] == row[a] for a in GRID_AXES])
    return int(np.flatnonzero(same)[0])


def _ranked(grid, times, fits, n: int) -> list[int]:
    """The first ``n`` fitting layouts in the documented order (whole microseconds, then
    tie_key): only those within the n-th smallest microsecond count can be among them, so only
    those are tie-keyed."""
    us = np.round(times * US_PER_S)
    exact = np.flatnonzero(fits)
    cut = np.sort(us[exact])[:n][-1:]
    near = exact[us[exact] <= cut[0]] if len(cut) else exact
    return sorted(near, key=lambda i: (int(us[i]), tie_key(_row(grid, i))))[:n]


@pytest.mark.parametrize("seed", range(60))
def test_scores_are_the_oracle_s(seed: int) -> None:
    problem = random_problem(seed)
    cost_model = toy_cost_model() if seed % 2 else load_cost_model(None)
    ctx, space = make_context(problem), build_space(problem)
    grid, times, memory = enumerate_layouts(space, ctx, cost_model)
    capacity = ctx.cluster.usable_memory_bytes
    scores = score_space(space, ctx, cost_model, top=4, band=0.2, front=True)
    fits = memory <= capacity
    assert (scores.layouts, scores.fitting) == (len(times), int(fits.sum()))
    ranked = _ranked(grid, times, fits, 4)
    assert [s.row for s in scores.best[:4]] == [_row(grid, i) for i in ranked]
    for item in scores.best:
        i = _index(grid, item.row)
        assert item.step_s == pytest.approx(times[i], rel=1e-12)
        assert item.memory_bytes == pytest.approx(memory[i], rel=1e-12)
    if ranked:
        limit = times[ranked[0]] * 1.2
        assert len(scores.within_band) == int((fits & (times <= limit)).sum())
    # the front: no layout is both at least as fast and lighter than a front point
    for point in scores.front:
        assert not np.any((times < point.step_s) & (memory < point.memory_bytes))
    if len(times):
        assert min(p.memory_bytes for p in scores.front) == pytest.approx(memory.min())


def test_virtual_stages_are_folded_not_enumerated() -> None:
    """DeepSeek-V3 on 2048 H100s: 890k layouts (every virtual-stage count Megatron's layout flag
    accepts), scored exactly; the oracle needs the full grid."""
    problem = make_problem(model="deepseek-v3", gpus=2048, global_batch=8192)
    ctx, space = make_context(problem), build_space(problem)
    scores = score_space(space, ctx, load_cost_model(None), top=1)
    assert scores.layouts > 500_000 and scores.complete
    assert scores.best[0].row["pp"] > 1  # the uneven pipeline is in the space


def _deadline_after_the_tables(monkeypatch, cost_model) -> None:
    """The deadline strikes once every term's table is built: after the first chunk."""
    from autopar.base.deadline import TimeLimitReached
    from autopar.costs import score, score_tables

    tables = len(list(score._all_terms(cost_model)))
    built = []
    table = score._table

    def counted(*args, **kwargs):
        out = table(*args, **kwargs)
        built.append(out)
        return out

    def check(deadline) -> None:
        if len(built) >= tables:
            raise TimeLimitReached()

    monkeypatch.setattr(score, "_table", counted)
    monkeypatch.setattr(score, "check_deadline", check)
    monkeypatch.setattr(score_tables, "check_deadline", check)  # the terms' chunks check it too


def test_a_deadline_keeps_what_was_scored(monkeypatch) -> None:
    problem = make_problem(model="deepseek-v3", gpus=2048, global_batch=8192)
    ctx, space, cost_model = make_context(problem), build_space(problem), load_cost_model(None)
    _deadline_after_the_tables(monkeypatch, cost_model)
    scores = score_space(space, ctx, cost_model, deadline=time.perf_counter() + 60)
    assert not scores.complete and 0 < scores.layouts < 890_000 and scores.best


def test_a_deadline_before_any_table_scores_nothing() -> None:
    problem = make_problem(model="deepseek-v3", gpus=2048, global_batch=8192)
    ctx, space = make_context(problem), build_space(problem)
    scores = score_space(space, ctx, load_cost_model(None), deadline=time.perf_counter() - 1)
    assert not scores.complete and scores.layouts == 0 and not scores.best


def test_the_time_limit_leaves_the_best_layout_scored_not_nothing(monkeypatch) -> None:
    """When the limit strikes while scoring (and so before CP-SAT can build its model), the
    answer is the best layout scored so far, status feasible, and the result says so."""
    problem = make_problem(model="deepseek-v3", gpus=2048, global_batch=8192)
    ctx, space, cost_model = make_context(problem), build_space(problem), load_cost_model(None)
    _deadline_after_the_tables(monkeypatch, cost_model)
    result = solve_space(space, ctx, cost_model, time_limit_s=0.5)
    assert result.status == "feasible" and result.layouts and result.best.fits
    assert any("time limit" in note for note in result.notes)
    assert result.proof.method == "cp-sat"


@pytest.mark.parametrize("seed", range(20))
def test_the_best_of_every_axis_value_is_the_oracle_s(seed: int) -> None:
    """``by_axis``: for each free axis and value, the fastest fitting layout (whole
    microseconds, then tie_key) and the least memory, as brute force finds them; a value no
    allowed layout has is absent."""
    from autopar.base.axes import FREE_AXES

    problem = random_problem(seed)
    cost_model = load_cost_model(None)
    ctx, space = make_context(problem), build_space(problem)
    grid, times, memory = enumerate_layouts(space, ctx, cost_model)  # columns, read with numpy
    fits = memory <= ctx.cluster.usable_memory_bytes
    us = np.round(times * US_PER_S)
    scores = score_space(space, ctx, cost_model, by_axis=True)
    for axis in FREE_AXES:
        values = np.unique(grid[axis]).tolist()
        assert set(scores.least_by_axis.get(axis, {})) == set(values), axis
        for value in values:
            at = grid[axis] == value
            assert scores.least_by_axis[axis][value] == pytest.approx(min(memory[at]))
            fitting = np.flatnonzero(at & fits)
            if not len(fitting):
                assert value not in scores.by_axis.get(axis, {})
                continue
            # the least (whole microseconds, tie_key): tie_key among the fastest only
            fastest = fitting[us[fitting] == us[fitting].min()]
            key = min(fastest, key=lambda i: tie_key(_row(grid, i)))
            assert scores.by_axis[axis][value].row == _row(grid, key), (axis, value)


def test_the_goodput_objective_and_a_bound_are_scored_as_cp_sat_solves_them() -> None:
    """``--objective goodput`` (every step time times the failure overhead) and a fallback's
    ``upper_bound_s``: the same optimum by scoring as by CP-SAT, and nothing under the bound
    below it."""
    from autopar.costs.goodput import overhead_factor

    problem = make_problem(model="llama-8b", gpus=16, global_batch=128)
    cost_model = load_cost_model(None)
    ctx, space = make_context(problem), build_space(problem)
    factor = overhead_factor(cost_model)
    scored = solve_space(space, ctx, cost_model, time_factor=factor, method="enumerate")
    proved = solve_space(space, ctx, cost_model, time_factor=factor, method="cp-sat")
    assert scored.status == proved.status == "optimal" and scored.objective == "goodput"
    assert scored.best.layout == proved.best.layout
    assert scored.best_bound_step_time_s == pytest.approx(proved.best_bound_step_time_s, abs=1e-5)
    bound = scored.best_bound_step_time_s
    below = solve_space(space, ctx, cost_model, time_factor=factor, upper_bound_s=bound * 0.999)
    assert below.status == "infeasible"
    above = solve_space(space, ctx, cost_model, time_factor=factor, upper_bound_s=bound * 1.001)
    assert above.best.layout == scored.best.layout


@pytest.mark.parametrize("seed", [3001, 3016, 3033, 3012])
def test_schedules_are_scored_exactly_or_as_lower_bounds(seed: int) -> None:
    """With every torchtitan schedule (issue 23): each layout's score is its simulated step
    where ``Scored.exact`` says so, and at most it elsewhere (the bound the closing needs);
    the memory is exact everywhere. 3016 and 3033 have bounds below the simulation."""
    from tests.test_solver import random_schedule_problem

    problem = random_schedule_problem(seed)
    cost_model = load_cost_model(None)
    ctx, space = make_context(problem), build_space(problem)
    rows, times, memory = _oracle_rows(space, ctx, cost_model)
    scores = score_space(space, ctx, cost_model, top=len(rows), front=True)
    fits = memory <= ctx.cluster.usable_memory_bytes
    assert scores.fitting == int(fits.sum()) and len(scores.best) == scores.fitting
    simulated = {
        tuple(sorted(r.items())): (t, m) for r, t, m in zip(rows, times, memory, strict=True)
    }
    loose = 0
    for item in scores.best:
        step, mem = simulated[tuple(sorted(item.row.items()))]
        assert item.memory_bytes == pytest.approx(mem, rel=1e-12)
        if item.exact:
            assert item.step_s == pytest.approx(step, rel=1e-9)
        else:
            assert item.step_s <= step * (1 + 1e-12)
            loose += item.step_s < step * (1 - 1e-9)
    assert any(not item.exact for item in scores.best)
    if seed in (3016, 3033):
        assert loose


def test_1f1b_alone_is_scored_as_before() -> None:
    """The default schedules (1F1B, interleaved with VPP) are ratio-free and the same for every
    phase: the plain composition, every score exact (main's answers)."""
    problem = make_problem(model="llama-70b", gpus=64, seq_len=4096, global_batch=256)
    ctx, space = make_context(problem), build_space(problem)
    scores = score_space(space, ctx, load_cost_model(None), top=20)
    assert scores.best and all(item.exact for item in scores.best)
    assert {item.row["schedule"] for item in scores.best} == {0}


@pytest.mark.parametrize(
    ("model", "gpus", "global_batch", "framework"),
    # Mixtral on 16 GPUs: four schedules fit, as on 32 (1F1B / interleaved, ZB-H1, ZB-V, GPipe
    # over PP 1-16), with 28k layouts for the oracle instead of 52k (1.1 s of brute force, not 4)
    [("qwen3-30b-a3b", 32, 256, "megatron"), ("mixtral-8x7b", 16, 64, "torchtitan")],
)
def test_the_schedule_axis_folded_scores_each_layout_once(
    model, gpus, global_batch, framework
) -> None:
    """With ``--pipeline-schedule any`` the schedule is a column beside vpp and the rows are
    scored in (pp, ep, recompute) groups (``autopar.costs.score_tables``): every layout the
    rules allow is counted once, and the best rows and every axis value's least memory are
    the oracle's (Megatron: the combined 1F1B beside 1F1B on EP > 1 rows)."""
    problem = make_problem(
        model=model,
        gpus=gpus,
        global_batch=global_batch,
        framework=framework,
        pipeline_schedule="any",
    )
    cost_model = load_cost_model(None)
    ctx, space = make_context(problem), build_space(problem)
    assert len(space.domains["schedule"]) > 1
    grid, times, memory = enumerate_layouts(space, ctx, cost_model)
    scores = score_space(space, ctx, cost_model, top=8, by_axis=True)
    fits = memory <= ctx.cluster.usable_memory_bytes
    assert (scores.layouts, scores.fitting) == (len(times), int(fits.sum()))
    for axis in ("schedule", "vpp", "pp", "ep"):
        least = scores.least_by_axis[axis]
        assert set(least) == set(np.unique(grid[axis]).tolist()), axis
        for value, low in least.items():
            at = grid[axis] == value
            assert low == pytest.approx(min(memory[at]), rel=1e-12), (axis, value)

    for item in scores.best:
        i = _index(grid, item.row)
        assert item.memory_bytes == pytest.approx(memory[i], rel=1e-12)
        if item.exact:  # the closed forms (every Megatron schedule) are the simulation
            assert item.step_s == pytest.approx(times[i], rel=1e-9)
    if framework == "megatron":  # all exact: the best are the oracle's, in order
        ranked = _ranked(grid, times, fits, 8)
        assert [s.row for s in scores.best[:8]] == [_row(grid, i) for i in ranked]
