"""The per-stage search's answer as the uniform search's types (``SolveResult`` with
``Estimate`` layouts and an ``Explanation``): the ``top`` best outer layouts with their plans,
the best even splits checked by the simulated schedule, the notes, and why nothing fits.

The search ranks plans by the schedule's closed form, exact only for equal stages; the
estimates are the schedule simulated (``autopar.costs.stage_estimate``). So the answer is the
fastest by the simulation among the search's plans and the best even splits (one recompute on
every stage, the plans Megatron runs by default), and the notes say what was proven for which
number.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from autopar.base.axes import GRID_AXES
from autopar.costs.stage_estimate import estimate_plan, with_plan_recompute
from autopar.costs.stage_figures import simulated_pipeline_s, stage_figures, stage_totals
from autopar.costs.stage_schedules import LOWER_BOUND_FORMULAS, stage_schedule
from autopar.costs.terms import CostModel, TermContext
from autopar.inputs.specs import GIB, Problem
from autopar.layout.plan import Estimate, Layout
from autopar.layout.results import Explanation, NearestMiss, SolveResult
from autopar.layout.stage_rules import broken_plan_rule
from autopar.layout.stages import V_PLACED, StagePlan, even_plan
from autopar.pipeline.candidates import Candidates, allowed_modes, uniform_recomputes
from autopar.pipeline.encoding import shapes_of
from autopar.pipeline.search import solve_stages_top
from autopar.pipeline.solution import StageSolution

EVEN_ALTERNATIVES = 4
"""How many of the best even-split plans (by the formula) ``solve_result`` simulates."""
SEARCH_CLOSURE = 8
"""Where the formula is not the simulated step for uneven stages even in its own order
(``LOWER_BOUND_FORMULAS``: ZB-H1's and the V schedules' formulas read the schedule at equal
phase times; 0.4% either way on Llama-3 70B), the search's best outer layouts simulated,
by the formula best first, whatever ``--top`` asks: the answer is the fastest of them by the
simulation, so ``--top 1`` and ``--top 5`` agree on it."""


def solve_result(
    problem: Problem,
    ctx: TermContext,
    cost_model: CostModel,
    *,
    time_limit_s: float,
    num_workers: int,
    top: int = 1,
) -> SolveResult:
    """``solve_stages_top`` as a ``SolveResult`` (the ``top`` best distinct outer layouts, each
    with its best plan, best first by the simulated schedule), with an explanation naming the
    stage that cannot fit when nothing does."""
    start = time.perf_counter()
    closing = bool(set(problem.options.pipeline_schedules) & LOWER_BOUND_FORMULAS)
    asked = max(top, SEARCH_CLOSURE) if closing else top
    solutions = solve_stages_top(
        problem, ctx, cost_model, top=asked, time_limit_s=time_limit_s, num_workers=num_workers
    )
    solution = solutions[0]
    notes = [
        f"per-stage plan: {solution.rows_kept} of {solution.rows_total} outer layouts left "
        f"after the bounds; model built in {solution.build_s:.2f} s, searched in "
        f"{solution.solve_s:.2f} s",
    ]
    if solution.plan is None:
        return SolveResult(
            status=solution.status,
            solve_time_s=time.perf_counter() - start,
            layouts=(),
            explanation=explain(solution, ctx),
            num_workers=num_workers,
            notes=tuple(notes),
        )
    found = [s for s in solutions if s.plan is not None]
    formula_best = found[0]
    if closing:
        found, note = _fastest_simulated(found, top, problem)
        notes += [note] if note else []
        solutions = found + [s for s in solutions if s.plan is None]
    memo: dict = {}  # each layout's probed costs and uniform estimate (estimate_plan)
    layouts = [
        estimate_plan(s.layout, s.plan, ctx, cost_model, plan_from="search", memo=memo)
        for s in found
    ]
    kept = [e for s, e in zip(found, layouts, strict=True) if s is formula_best]
    # the formula's best, for the notes (estimated apart when the simulation dropped it)
    ranked_first = (
        kept[0]
        if kept
        else estimate_plan(
            formula_best.layout, formula_best.plan, ctx, cost_model, plan_from="search", memo=memo
        )
    )
    if len(found) > 1:
        statuses = ", ".join(s.status for s in found[1:])
        notes.append(f"runners-up: the best per-stage plan of each next outer layout ({statuses})")
    if len(found) < top:
        why = "the time limit ran out" if solutions[-1].status == "unknown" else "no more fit"
        notes.append(f"{len(found)} of the {top} layouts asked for: {why}")
    evens = [
        estimate_plan(layout, plan, ctx, cost_model, plan_from="even split", memo=memo)
        for layout, plan in even_alternatives(solution.candidates, problem)
    ]
    evens, closure = closed_evens(
        solution.candidates, problem, ctx, cost_model, evens, layouts, memo=memo
    )
    notes += schedule_notes(solution.status, ranked_first, evens)
    notes += [closure] if closure else []
    fastest_even = min(evens, key=lambda e: e.step_time_s) if evens else None
    beat = min(e.step_time_s for e in layouts) if closing else layouts[0].step_time_s
    faster = fastest_even is not None and fastest_even.step_time_s < beat
    if faster and not any(_same(fastest_even, e) for e in layouts):  # a runner-up may be it
        layouts.append(fastest_even)
    # Best first by the simulated schedule (the search found them by the formula).
    layouts.sort(key=lambda e: e.step_time_s)
    if layouts[0] is not ranked_first and layouts[0].per_stage.plan_from == "search":
        notes.append(
            f"a runner-up simulates faster than the formula's best ({layouts[0].step_time_s:.3f} "
            f"against {ranked_first.step_time_s:.3f} s): returned first"
            + ("" if closing else "; --top 1 simulates the formula's best alone")
        )
    return SolveResult(
        status=solution.status,
        solve_time_s=time.perf_counter() - start,
        layouts=tuple(layouts),
        best_bound_step_time_s=solution.bound_s,
        num_workers=num_workers,
        notes=tuple(notes),
    )


def _fastest_simulated(found: list, top: int, problem: Problem):
    """Of the search's solutions (``SEARCH_CLOSURE`` of them, by the formula), the ``top``
    fastest by the simulated schedule (each row's costs as the search probed them,
    ``simulated_pipeline_s``), kept in the formula's order, and the note saying so (``None``
    when none was dropped)."""
    cand = found[0].candidates
    steps = []
    for s in found:
        row = np.array([s.row])
        schedule = stage_schedule(s.layout.pipeline_schedule)
        figures = stage_figures(s.plan, cand.costs.take(row), cand.grid["grad_accum"][row],
                                schedule=schedule)  # fmt: skip
        pipeline = simulated_pipeline_s(figures, 0, schedule=schedule)
        steps.append(float(cand.costs.step_time_s[s.row]) + pipeline)
    keep = sorted(sorted(range(len(found)), key=lambda j: steps[j])[:top])
    note = None
    if len(found) > top:
        names = ", ".join(sorted(set(problem.options.pipeline_schedules) & LOWER_BOUND_FORMULAS))
        note = (
            f"the {len(found)} best outer layouts by the formula simulated ({names}: the "
            f"formula is not the simulated step for uneven stages); the fastest {top} kept"
        )
    return [found[j] for j in keep], note


def _same(a: Estimate, b: Estimate) -> bool:
    """The same outer layout run with the same plan."""
    return a.layout == b.layout and a.per_stage.plan == b.per_stage.plan


BOUND_MARGIN = 1e-6
"""Relative slack on a lower bound before it rules a shape out (the bounds are floats)."""


def even_alternatives(
    cand: Candidates, problem: Problem, *, count: int = EVEN_ALTERNATIVES
) -> list[tuple[Layout, StagePlan]]:
    """The ``count`` best outer layouts run with the even split and one recompute on every
    stage (the uniform plans Megatron runs by default), ranked by the schedule formula: the
    alternatives ``solve_result`` simulates next to the per-stage optimum.

    Shapes are scored best lower bound first (``cand.bounds``: no plan of a row, the even ones
    among them, beats it); once ``count`` rows have an even split faster than every row left's
    bound, the rest cannot enter the answer and are not scored. The answer is then assembled
    in shape order, as if every shape had been scored."""
    shapes = list(shapes_of(cand.grid).items())
    least = [float(np.min(cand.bounds.lower_s[index])) for _, index in shapes]
    scored: dict[int, list[tuple[float, int, StagePlan]]] = {}
    best_of_row: dict[int, float] = {}
    for s in sorted(range(len(shapes)), key=lambda s: least[s]):
        kth = sorted(best_of_row.values())[count - 1] if len(best_of_row) >= count else np.inf
        if least[s] > kth * (1 + BOUND_MARGIN):
            break
        scored[s] = _even_entries(cand, problem, *shapes[s], count)
        for step, row, _ in scored[s]:
            best_of_row[row] = min(step, best_of_row.get(row, np.inf))
    found = [entry for s in range(len(shapes)) for entry in scored.get(s, ())]
    best: dict[int, tuple[float, StagePlan]] = {}
    for step, row, plan in sorted(found, key=lambda f: f[0]):
        best.setdefault(row, (step, plan))
    out = []
    for row, (_, plan) in list(best.items())[:count]:
        layout = Layout.from_grid_row({a: int(cand.grid[a][row]) for a in GRID_AXES})
        out.append((with_plan_recompute(layout, plan), plan))
    return out


V_FORMULA = "a V's formula reads it at equal phase times, not a bound"
"""What the closure's note says of a V schedule's formula at equal stages: it reads the
schedule at ``ZERO_BUBBLE_RATIO`` (``autopar.costs.stage_schedules.ZeroBubble``), above the
simulation or below it by the plan's phase times (``tests/test_stage_v.py``), so the order
is not a proof."""
EVEN_CLOSURE_MAX = 32
"""At most this many even splits ``closed_evens`` simulates."""


def closed_evens(
    cand: Candidates,
    problem: Problem,
    ctx,
    cost_model,
    evens: list[Estimate],
    searched: list,
    *,
    memo: dict | None = None,
) -> tuple[list[Estimate], str | None]:
    """Where a schedule whose formula is a lower bound (``LOWER_BOUND_FORMULAS``, ZB-H1: at its
    least bubble, the simulation reads the plan's own phase times) is among ``evens`` or the
    ``searched`` plans' estimates, the next even splits simulated in formula order until the
    next one's formula exceeds the best simulated step, as ``autopar.search.exact`` closes its
    bounds: no even split left can then simulate faster, for splits as near equal stages as
    the formula's bound holds (at most ``EVEN_CLOSURE_MAX``; the note says whether it closed).
    ``evens`` and no note elsewhere (Megatron's rows: unchanged)."""
    schedules = {e.layout.pipeline_schedule for e in (*evens, *searched)}
    if not schedules & LOWER_BOUND_FORMULAS:
        return evens, None
    fastest = min(e.step_time_s for e in (*evens, *searched))
    out = list(evens)
    closed = True
    for layout, plan in even_alternatives(cand, problem, count=EVEN_CLOSURE_MAX)[len(evens) :]:
        estimate = estimate_plan(layout, plan, ctx, cost_model, plan_from="even split", memo=memo)
        if estimate.per_stage.formula_step_time_s > fastest:
            break
        out.append(estimate)
        fastest = min(fastest, estimate.step_time_s)
    else:
        closed = len(out) < EVEN_CLOSURE_MAX
    how = "closed (no even split left has a lower formula)" if closed else "not closed"
    names = sorted(schedules & LOWER_BOUND_FORMULAS)
    why = "the formula is a lower bound for equal stages" if "zb-h1" in names else ""
    why = ", ".join([why] * bool(why) + [V_FORMULA] * bool(set(names) & V_PLACED))
    note = (
        f"even splits simulated in formula order ({', '.join(names)}: {why}): {len(out)}, "
        f"best {fastest:.3f} s, {how}"
    )
    return out, note


def _even_entries(cand: Candidates, problem: Problem, shape, index, count: int) -> list:
    """``(step, row, plan)`` of the ``count`` best rows of ``shape`` for each uniform
    recompute of the even split (those that fit)."""
    num_layers, p, v = problem.model.num_layers, shape.pp, shape.vpp
    sub, m = cand.costs.take(index), cand.grid["grad_accum"][index]
    out = []
    for rec in uniform_recomputes(allowed_modes(problem), -(-num_layers // (p * v))):
        plan = even_plan(num_layers, p, v, rec, shape.placement)
        if broken_plan_rule(plan, problem.options.framework) is not None:
            continue  # the framework's output could not write it (autopar.layout.stage_rules)
        if (shape, plan) in cand.plan_steps:  # scored by the heuristics already
            plan_step, peak = cand.plan_steps[(shape, plan)]
        else:
            figures = stage_totals(plan, sub, m, schedule=shape.schedule)
            plan_step, peak = figures.step_time_s, figures.memory_bytes.max(axis=1)
        step = np.where(peak <= cand.ctx.capacity_bytes, plan_step, np.inf)
        for j in np.argsort(step)[:count]:
            if np.isfinite(step[j]):
                out.append((float(step[j]), int(index[j]), plan))
    return out


def schedule_notes(status: str, best: Estimate, evens: Sequence[Estimate]) -> list[str]:
    """What the search proved and what the simulated schedule gives: the search ranks plans by
    the schedule formula (``autopar.costs.stage_figures.pipeline_time_s``), exact only for equal
    stages; the estimates are the layout's schedule simulated (``autopar.costs.schedule``)."""
    proof = "proven optimal" if status == "optimal" else status
    formula = best.per_stage.formula_step_time_s
    name = best.layout.pipeline_schedule
    which = "Megatron's schedule" if name in ("1f1b", "combined-1f1b") else f"the {name} schedule"
    notes = [
        f"ranked by the schedule formula ({proof} for it): {formula:.3f} s; "
        f"{which} simulated: {best.step_time_s:.3f} s"
    ]
    if not evens:
        return notes
    even = min(evens, key=lambda e: e.step_time_s)
    gain = even.step_time_s / best.step_time_s - 1.0
    if gain < 0:
        notes.append(
            f"the even split of {even.layout.text()} simulates faster, {even.step_time_s:.3f} s "
            f"({-gain:.1%}): returned first; the per-stage plan's gain by the formula does not "
            "hold in the simulated schedule"
        )
    else:
        notes.append(
            f"the best even split simulated ({even.layout.text()}): {even.step_time_s:.3f} s; "
            f"the per-stage plan is {gain:.1%} faster by the simulation"
        )
    return notes


def explain(solution: StageSolution, ctx: TermContext) -> Explanation:
    """Why no per-stage plan fits: the outer layout and plan whose fullest stage comes closest,
    which stage that is, and what it would need."""
    cand = solution.candidates
    if solution.status == "unknown":
        return Explanation.time_ran_out()
    if cand is None or not len(cand.peak_bytes):
        return Explanation(
            summary="the layout rules leave no outer layout (see the uniform explanation)"
        )
    capacity = float(ctx.cluster.usable_memory_bytes)
    row = int(np.argmin(cand.peak_bytes))
    plan = cand.peak_plans[row]
    layout = Layout.from_grid_row({a: int(cand.grid[a][row]) for a in GRID_AXES})
    shape = next(iter(shapes_of(cand.grid, np.array([row]))))
    figures = stage_figures(
        plan, cand.costs.take(np.array([row])), cand.grid["grad_accum"][row : row + 1],
        schedule=shape.schedule,
    )  # fmt: skip
    stage = int(np.argmax(figures.memory_bytes[0]))
    need = float(figures.memory_bytes[0, stage])
    flights = sum(shape.schedule.in_flight(plan.pp, plan.vpp, int(layout.grad_accum), stage))
    summary = (
        f"no per-stage plan fits: at best (layout {with_plan_recompute(layout, plan).text()}, "
        f"{plan.recompute[stage].text()} "
        f"recompute on every stage) stage {stage} of {plan.pp} holds "
        f"{plan.stage_layers(stage)} layers and {flights} chunk micro-batches in flight "
        f"and needs {need / GIB:.1f} GiB, "
        f"{(need - capacity) / GIB:.1f} GiB over the {capacity / GIB:.1f} GiB capacity"
    )
    miss = NearestMiss(
        min_memory_bytes=need,
        capacity_bytes=capacity,
        layout=with_plan_recompute(layout, plan).to_dict(),
        stage=stage,
        stage_layers=plan.stage_layers(stage),
    )
    return Explanation(summary=summary, nearest_miss=miss)
