"""Why this layout (issue 24): for each axis, the fastest layout with that axis changed, checked
against the brute-force oracle; a deadline that cuts the scoring short; evaluate's gap to the
optimum."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

import autopar
from autopar import api
from autopar.base.axes import AXIS, FREE_AXES, GIVEN_AXES
from autopar.cli import app
from autopar.costs.plugin import load_cost_model
from autopar.costs.score import score_space
from autopar.layout.space import build_space
from autopar.outputs.why import alternatives_text
from autopar.search import alternatives as search
from tests.oracle import enumerate_layouts

SMALL = dict(model="llama-8b", gpus=16, global_batch=128)
TIGHT = dict(model="llama-70b", gpus=16, global_batch=16)  # memory leaves little choice


def _setup(options):
    problem = api.make_problem(**options)
    result = api.solve_problem(problem, top=1, alternatives=True)
    return problem, result, api.make_context(problem), load_cost_model(None), build_space(problem)


@pytest.fixture(scope="module")
def small():
    return _setup(SMALL)


def test_each_alternative_is_the_oracles_fastest_with_that_axis_changed(small):
    problem, result, ctx, cm, space = small
    grid, step, memory = enumerate_layouts(space, ctx, cm)
    fits = memory <= ctx.cluster.usable_memory_bytes
    chosen = result.best.layout.grid_row()
    items = {a.axis: a for a in result.alternatives.items}
    assert set(items) == {a for a in FREE_AXES if len(space.domains[a]) > 1}
    assert result.alternatives.method == "enumeration"
    assert result.alternatives.layouts == len(step)
    for axis, item in items.items():
        other = fits & (grid[axis] != chosen[axis])
        assert item.outcome == "found" and item.proven
        assert item.estimate.fits and item.value != item.chosen
        assert item.estimate.step_time_s == pytest.approx(float(step[other].min()), rel=1e-9)
        assert item.slowdown >= 0  # the chosen layout is proven optimal
        assert item.estimate.time_s[item.grows] >= result.best.time_s[item.grows]


class _Clock:
    """A deterministic ``time.perf_counter``: each reading one second after the last."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def _readings(small, clock: _Clock) -> int:
    """How many clock readings scoring ``small``'s space whole takes."""
    _, _, ctx, cm, space = small
    before = clock.now
    assert score_space(space, ctx, cm, by_axis=True, deadline=clock.now + 1e9).complete
    return int(clock.now - before)


def test_scoring_stops_early_only_past_its_deadline(small, monkeypatch):
    """What lets a scoring cut short end "why this layout" at once: it stops only once the
    deadline has passed, so no time is left for another search."""
    _, _, ctx, cm, space = small
    clock = _Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    total = _readings(small, clock)
    cut = 0
    for share in range(0, total, max(1, total // 7)):
        deadline = clock.now + share
        scores = score_space(space, ctx, cm, by_axis=True, deadline=deadline)
        if not scores.complete:
            cut += 1
            assert clock() > deadline, f"scoring stopped {deadline - clock.now:.0f} s early"
    assert cut, "no deadline cut the scoring short"


def test_a_scoring_the_deadline_cuts_short_marks_every_axis_cut_short(small, monkeypatch):
    problem, result, ctx, cm, space = small
    clock = _Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    deadline = clock.now + _readings(small, clock) // 2  # strikes mid-scoring
    found = search.find_alternatives(space, ctx, cm, result.best, deadline=deadline)
    assert [item.axis for item in found.items] == [a.axis for a in result.alternatives.items]
    assert {item.outcome for item in found.items} == {"cut short"}
    assert found.layouts is None and found.method == "enumeration"
    text = alternatives_text(found)
    assert "the time limit ran out before every layout was scored" in text
    assert text.count("not searched, the time limit ran out first") == len(found.items)
    deadline = clock.now + _readings(small, clock) // 2
    assert search.find_optimum(space, ctx, cm, result.best, deadline=deadline) is None


def test_no_time_left_marks_the_axes_cut_short(small):
    problem, result, ctx, cm, space = small
    found = search.find_alternatives(space, ctx, cm, result.best, deadline=time.perf_counter())
    assert {item.outcome for item in found.items} == {"cut short"}
    assert len(found.items) == len(result.alternatives.items)
    text = alternatives_text(found)
    assert text.count("not searched, the time limit ran out first") == len(found.items)


def test_complete_scores_handed_over_are_read_even_past_the_deadline(small):
    """The search's complete scoring costs nothing more to read: a deadline that has passed
    only stops new scoring."""
    problem, result, ctx, cm, space = small
    scores = score_space(space, ctx, cm, by_axis=True, deadline=time.perf_counter() + 60)
    assert scores.complete
    found = search.find_alternatives(
        space, ctx, cm, result.best, deadline=time.perf_counter(), scores=scores
    )
    assert [(a.axis, a.outcome) for a in found.items] == [
        (a.axis, a.outcome) for a in result.alternatives.items
    ]
    assert "cut short" not in {a.outcome for a in found.items}
    assert found.layouts == scores.layouts


def test_an_axis_nothing_else_fits_says_how_much_memory_it_would_need():
    problem, result, ctx, cm, space = _setup(TIGHT)
    grid, _, memory = enumerate_layouts(space, ctx, cm)
    chosen = result.best.layout.grid_row()
    stuck = [a for a in result.alternatives.items if a.outcome == "none fits"]
    assert stuck, "the tight case should leave some axis no other fitting value"
    for item in stuck:
        least = float(memory[grid[item.axis] != chosen[item.axis]].min())
        assert item.min_memory_bytes == pytest.approx(least)
        assert least > ctx.cluster.usable_memory_bytes
    text = alternatives_text(result.alternatives)
    first = stuck[0]
    title = AXIS[first.axis].title
    assert (
        f"{title}: no other value fits (at least {first.min_memory_bytes / 2**30:.1f} GiB" in text
    )


def test_solve_prints_why_and_json_carries_it():
    runner = CliRunner()
    args = ["solve", "--model", "llama-8b", "--gpus", "16", "--global-batch", "128", "--top", "1"]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    block = table.stdout[table.stdout.index("why this layout") :].splitlines()
    lines = [line.strip() for line in block[1:] if line.startswith("  ")]
    assert lines and all(" instead of " in line and "because" in line for line in lines)
    tp = next(line for line in lines if line.startswith("TP "))
    assert tp.split(":")[1].split()[0].startswith("+")  # the extra cost, in percent
    data = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    axes = [a["axis"] for a in data["alternatives"]["axes"]]
    assert len(axes) == len(lines) and "tp" in axes
    megatron = runner.invoke(app, [*args, "--format", "megatron"])
    assert "why this layout" not in megatron.stdout  # launcher files carry no prose


def test_evaluate_gives_the_gap_to_the_optimum():
    options = dict(SMALL)
    best = autopar.solve(**options).best
    worse = autopar.evaluate(**options, tp=8, pp=2)
    problem = api.make_problem(**options)
    optimum = api.optimum_of(problem, worse)
    assert optimum.proven and optimum.method == "enumeration"
    assert optimum.estimate.step_time_s == pytest.approx(best.step_time_s, rel=1e-9)
    assert optimum.gap == pytest.approx(worse.step_time_s / best.step_time_s - 1)
    assert optimum.gap > 0
    args = ["evaluate", "--model", "llama-8b", "--gpus", "16", "--global-batch", "128"]
    text = CliRunner().invoke(app, [*args, "--tp", "8", "--pp", "2"]).stdout
    assert f"this layout is {optimum.gap:.1%} slower" in text
    flags = [
        word
        for axis in GIVEN_AXES
        for word in (
            f"--{axis.layout_attr.replace('_', '-')}",
            str(getattr(best.layout, axis.layout_attr)),
        )
    ]
    assert "this layout is the optimum" in CliRunner().invoke(app, [*args, *flags]).stdout
    quiet = CliRunner().invoke(app, [*args, "--tp", "8", "--time-limit", "0", "--format", "json"])
    assert "optimum" not in json.loads(quiet.stdout)


def test_an_axis_the_rules_leave_one_value_says_so():
    result = autopar.solve(model="llama-8b", gpus=8, global_batch=64, max_pp=1, alternatives=True)
    items = {a.axis: a for a in result.alternatives.items}
    assert "pp" not in items  # --max-pp 1 leaves PP one value: nothing to explain
    assert items["vpp"].outcome == "none allowed"  # VPP > 1 needs PP > 1 (a rule of two axes)
    assert items["vpp"].estimate is None and items["vpp"].chosen == 1
    assert "VPP: the rules allow no other value here than 1" in alternatives_text(
        result.alternatives
    )
