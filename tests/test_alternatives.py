"""Why this layout (issue 24): for each axis, the fastest layout with that axis changed, checked
against the brute-force oracle and against CP-SAT re-solves; evaluate's gap to the optimum."""

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


def test_cpsat_re_solves_agree_with_the_enumeration(small, monkeypatch):
    problem, result, ctx, cm, space = small
    monkeypatch.setattr(search, "_scores", lambda *_: None)  # scoring cut short: re-solve
    found = search.find_alternatives(space, ctx, cm, result.best, deadline=time.perf_counter() + 60)
    assert found.method == "cp-sat" and found.layouts is None
    exact = {a.axis: a for a in result.alternatives.items}
    for item in found.items:
        assert item.outcome == "found" and item.proven
        assert item.estimate.step_time_s == pytest.approx(
            exact[item.axis].estimate.step_time_s, abs=2e-6
        )


def test_no_time_left_marks_the_axes_cut_short(small, monkeypatch):
    problem, result, ctx, cm, space = small
    monkeypatch.setattr(search, "_scores", lambda *_: None)
    found = search.find_alternatives(space, ctx, cm, result.best, deadline=time.perf_counter())
    assert {item.outcome for item in found.items} == {"cut short"}
    text = alternatives_text(found)
    assert text.count("not searched, the time limit ran out first") == len(found.items)


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
