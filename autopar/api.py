"""The Python API: ``solve``, ``evaluate`` (and ``sweep`` in ``autopar.sweeps.run``), taking the
CLI's options as keyword arguments (DESIGN §7).

One way through: options -> ``Problem`` (``autopar.inputs.problem``) -> ``Space``
(``autopar.layout.space``) -> CP-SAT model and search (``autopar.search``; per-stage plans:
``autopar.pipeline``) -> estimates; when nothing fits, the search asks ``autopar.search.explain``
why. Callers that also emit launcher configs build the ``Problem`` once and pass it on
(``solve_problem``, ``evaluate_problem``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from autopar.base.axes import GIVEN_AXES
from autopar.base.errors import InputError, excerpt
from autopar.costs.comm import CollectiveModel, DatasheetCollectives, collective_sources
from autopar.costs.error_bands import BANDED_COST_MODELS, band_of
from autopar.costs.estimate import estimate
from autopar.costs.goodput import overhead_factor
from autopar.costs.plugin import load_cost_model
from autopar.costs.terms import CostModel, TermContext
from autopar.inputs import limits as bounds
from autopar.inputs.echo import inputs_dict
from autopar.inputs.problem import (
    DEFAULT_GLOBAL_BATCH_TOKENS,
    DEFAULT_SEQ_LEN,
    build_problem,
    check_keywords,
    make_problem,
)
from autopar.inputs.specs import Problem
from autopar.layout.alternatives import Optimum
from autopar.layout.coverage import coverage
from autopar.layout.given import check_pipeline_plan, layout_of, plan_of
from autopar.layout.plan import Estimate, Layout
from autopar.layout.results import OBJECTIVES, PREFER, Explanation, SolveResult
from autopar.layout.space import build_space
from autopar.layout.stages import StagePlan
from autopar.search.alternatives import find_alternatives, find_optimum
from autopar.search.notes import default_batch_note
from autopar.search.solver import sized_time_limit_s, solve_scored

__all__ = [
    "DEFAULT_GLOBAL_BATCH_TOKENS",
    "DEFAULT_SEQ_LEN",
    "build_problem",
    "check_objective",
    "check_solve_options",
    "evaluate",
    "evaluate_problem",
    "layout_of",
    "make_context",
    "make_problem",
    "optimum_of",
    "plan_of",
    "solve",
    "solve_problem",
]


def make_context(problem: Problem, *, comm: CollectiveModel | None = None) -> TermContext:
    """The context a cost model reads for ``problem``: collective times from ``comm``, else from
    the cluster's measured profile (``comm_profile``, ``autopar.calibration.profile``; its GEMM
    points too), else from the datasheet alpha-beta model."""
    datasheet = DatasheetCollectives(problem.cluster)
    gemm = None
    if comm is None and problem.cluster.comm_profile_path:
        from autopar.calibration.profile_io import load_profile

        path = problem.cluster.comm_profile_path
        try:
            comm = load_profile(path, fallback=datasheet)
        except InputError as err:
            raise err.with_source(path) from None
        gemm = comm if comm.gemm else None
    return TermContext(
        model=problem.model,
        cluster=problem.cluster,
        training=problem.training,
        options=problem.options,
        comm=comm or datasheet,
        gemm=gemm,
    )


def solve_problem(
    problem: Problem,
    *,
    top: int = 1,
    time_limit: float | None = None,
    num_workers: int | None = None,
    cost_model: str | CostModel | None = None,
    pipeline_plan: str = "uniform",
    alternatives: bool = False,
    objective: str = "step-time",
    upper_bound_s: float | None = None,
    prefer: str = "fastest",
) -> SolveResult:
    """The provably fastest layout of ``problem`` (and ``top - 1`` runners-up); when nothing
    fits, the result carries the explanation. The layouts within the cost model's error band of
    the fastest are marked as ties (``SolveResult.ties``); ``prefer="headroom"`` ranks them
    first by ``autopar.layout.results.PREFERENCE``. ``pipeline_plan="per-stage"`` also chooses
    the layers of every pipeline chunk and each stage's recompute (``autopar.pipeline.result``:
    the ``top`` best distinct outer layouts, each with its best plan; the best uniform layout
    is the answer when the limit strikes before any plan). ``alternatives=True`` adds, for a
    uniform plan, the fastest layout with each axis changed (``autopar.search.alternatives``),
    within the same ``time_limit``. ``time_limit`` covers the whole solve; ``None`` sizes it
    from the problem (``autopar.search.solver.sized_time_limit_s``). ``objective="goodput"``
    minimises the expected time per useful step under the cluster's failure model instead
    (``autopar.costs.goodput``); ``upper_bound_s`` keeps only layouts whose objective is at
    most that (a caller's incumbent: ``infeasible`` then means none is as good)."""
    top, time_limit, num_workers = check_solve_options(
        top=top, time_limit=time_limit, num_workers=num_workers
    )
    check_pipeline_plan(pipeline_plan)
    check_objective(objective, pipeline_plan)
    check_prefer(prefer)
    start = time.perf_counter()
    cm = load_cost_model(cost_model)
    factor = overhead_factor(cm) if objective == "goodput" else None
    ctx = make_context(problem)
    sources = collective_sources(ctx.comm)
    inputs = inputs_dict(problem.model, problem.cluster, problem.training, sources=sources)
    asked = problem.options.pipeline_schedules
    if pipeline_plan == "per-stage":
        problem = per_stage_schedules_only(problem)
    space = build_space(problem)
    left = None if time_limit is None else max(0.0, time_limit - (time.perf_counter() - start))
    why = alternatives and pipeline_plan == "uniform"
    # "why this layout" reads the search's scoring when it ranks by step time alone
    shared = why and factor is None and upper_bound_s is None
    result, scores = solve_scored(
        space,
        ctx,
        cm,
        top_k=top,
        time_limit_s=left,
        num_workers=num_workers,
        time_factor=factor,
        upper_bound_s=upper_bound_s,
        coverage=coverage(problem, space),
        band=band_of(problem) if cm.name in BANDED_COST_MODELS else None,
        prefer=prefer,
        by_axis=shared,
    )
    limit = time_limit if time_limit is not None else sized_time_limit_s(_layouts(result))
    deadline = start + limit
    if pipeline_plan == "per-stage":
        result = _per_stage(
            problem, ctx, cm, result, top=top, deadline=deadline, workers=num_workers
        )
        result = _left_out_note(result, asked, problem.options.pipeline_schedules)
    note = default_batch_note(problem, result.best.layout if result.layouts else None)
    if note and (result.layouts or result.status == "infeasible"):
        result = dataclasses.replace(result, notes=(*result.notes, note))
    result = dataclasses.replace(result, inputs=inputs)
    if why and result.layouts:
        found = find_alternatives(
            space,
            ctx,
            cm,
            result.best,
            deadline=deadline,
            scores=scores if shared else None,
        )
        result = dataclasses.replace(result, alternatives=found)
    if result.status == "infeasible" and upper_bound_s is not None:
        return result  # nothing as good as the bound: the caller knows why
    if result.status == "unknown":
        return dataclasses.replace(result, explanation=Explanation.time_ran_out())
    if result.status != "infeasible" or (result.explanation and result.explanation.nearest_miss):
        return result
    # no layout at all, or no per-stage outer layout: the uniform explanation names what binds
    from autopar.search.explain import explain_infeasible  # CP-SAT's cores: OR-Tools

    explanation = explain_infeasible(problem, space, ctx, cm, deadline=deadline)
    return dataclasses.replace(result, explanation=explanation)


def _layouts(result: SolveResult) -> int:
    return (result.proof.layouts or 0) if result.proof else 0


def _per_stage(problem, ctx, cm, uniform: SolveResult, *, top, deadline, workers) -> SolveResult:
    """The per-stage search with the time left; when it ends without a plan, the best uniform
    layout (its even split) is the answer, status ``feasible``, and the notes say so."""
    from autopar.pipeline.result import solve_result

    left = max(0.0, deadline - time.perf_counter())
    result = solve_result(problem, ctx, cm, time_limit_s=left, num_workers=workers or 1, top=top)
    if result.status != "unknown" or not uniform.layouts:
        return result
    note = (
        "the time limit struck before the per-stage search found a plan: this is the best "
        "uniform layout, with Megatron's split on every stage; raise --time-limit"
    )
    return dataclasses.replace(uniform, status="feasible", notes=(*uniform.notes, note))


def check_prefer(prefer: object) -> None:
    if prefer not in PREFER:
        raise InputError(
            f"must be one of {', '.join(PREFER)}, got {excerpt(prefer)}", source="--prefer"
        )


def _left_out_note(result: SolveResult, asked, searched) -> SolveResult:
    """A note naming the schedules asked for that per-stage plans did not search, and why."""
    left_out = [s for s in asked if s not in searched]
    if not left_out:
        return result
    note = f"per-stage plans did not search {', '.join(left_out)}: {_refusals(left_out)}"
    return dataclasses.replace(result, notes=(*result.notes, note))


def _refusals(schedules) -> str:
    """Why each of ``schedules`` has no per-stage plan (``stage_schedules.STAGE_REFUSALS``)."""
    from autopar.costs.stage_schedules import STAGE_REFUSALS

    return "; ".join(f"{s}: {STAGE_REFUSALS.get(s, 'not priced')}" for s in schedules)


def per_stage_schedules_only(problem: Problem) -> Problem:
    """Per-stage plans search the schedules they are priced for
    (``autopar.costs.stage_schedules.STAGE_SCHEDULES``); a request for none of them is bad
    input naming each schedule asked for and why it has no per-stage plan."""
    from autopar.costs.stage_schedules import STAGE_SCHEDULES

    asked = problem.options.pipeline_schedules
    kept = tuple(s for s in asked if s in STAGE_SCHEDULES)
    if not kept:
        raise InputError(
            f"per-stage plans run {', '.join(STAGE_SCHEDULES)}; "
            f"got {', '.join(asked)} ({_refusals(asked)})",
            source="--pipeline-schedule",
        )
    options = dataclasses.replace(problem.options, pipeline_schedules=kept)
    return dataclasses.replace(problem, options=options)


def check_solve_options(
    *, top: object, time_limit: object, num_workers: object
) -> tuple[int, float | None, int | None]:
    """``--top``, ``--time-limit`` (>= 0 and finite: NaN or a negative limit is an error, never
    "the time limit ran out") and ``--num-workers``, against their documented maxima; returned
    as an int, a float (or None: sized from the problem) and an int (or None), whatever numeric
    type they were given in."""
    checked_top = bounds.check_int(top, source="--top", maximum=bounds.MAX_TOP)
    limit = None
    if time_limit is not None:
        limit = bounds.check_number(
            time_limit, source="--time-limit", maximum=bounds.MAX_TIME_LIMIT_S, inclusive=True
        )
    if num_workers is not None:
        num_workers = bounds.check_int(
            num_workers, source="--num-workers", maximum=bounds.MAX_WORKERS
        )
    return checked_top, limit, num_workers


def check_objective(objective: object, pipeline_plan: str = "uniform") -> None:
    """``--objective``: one of ``OBJECTIVES``; ``goodput`` ranks uniform layouts only (a
    per-stage plan's checkpoint is not tabulated per plan)."""
    if not isinstance(objective, str) or objective not in OBJECTIVES:
        raise InputError(
            f"must be one of {', '.join(OBJECTIVES)}, got {excerpt(objective)}",
            source="--objective",
        )
    if objective == "goodput" and pipeline_plan != "uniform":
        raise InputError(
            "goodput ranks uniform pipelines only; use --pipeline-plan uniform or --objective "
            "step-time",
            source="--objective",
        )


SOLVE_KEYWORDS: tuple[str, ...] = (
    "top",
    "time_limit",
    "num_workers",
    "cost_model",
    "pipeline_plan",
    "prefer",
    "alternatives",
    "objective",
)
"""``solve``'s own keywords besides ``make_problem``'s (one vocabulary with the CLI)."""


def solve(
    *,
    top: int = 1,
    time_limit: float | None = None,
    num_workers: int | None = None,
    cost_model: str | CostModel | None = None,
    pipeline_plan: str = "uniform",
    alternatives: bool = False,
    objective: str = "step-time",
    prefer: str = "fastest",
    **options: Any,
) -> SolveResult:
    """The provably fastest layout (and ``top - 1`` runners-up) for the options of
    ``make_problem``; ``status`` says whether it is proven optimal; ``alternatives=True`` adds
    the fastest layout with each axis changed (``SolveResult.alternatives``);
    ``objective="goodput"`` ranks by the expected time per useful step under failures."""
    check_keywords(options, own=SOLVE_KEYWORDS)
    return solve_problem(
        make_problem(**options),
        top=top,
        time_limit=time_limit,
        num_workers=num_workers,
        cost_model=cost_model,
        pipeline_plan=pipeline_plan,
        alternatives=alternatives,
        objective=objective,
        prefer=prefer,
    )


def evaluate_problem(
    problem: Problem,
    layout: Layout,
    *,
    cost_model: str | CostModel | None = None,
    plan: StagePlan | None = None,
) -> Estimate:
    """Score ``layout`` (from ``layout_of``) in ``problem`` with the cost model; with ``plan``
    (``plan_of``), run with that per-stage pipeline plan."""
    ctx, cm = make_context(problem), load_cost_model(cost_model)
    if plan is None:
        return estimate(layout, ctx, cm)
    from autopar.costs.stage_estimate import estimate_plan

    return estimate_plan(layout, plan, ctx, cm)


def optimum_of(
    problem: Problem,
    estimate: Estimate,
    *,
    time_limit: float = 10.0,
    num_workers: int | None = None,
    cost_model: str | CostModel | None = None,
) -> Optimum | None:
    """How far ``estimate`` (from ``evaluate_problem``) is from the fastest uniform layout of
    ``problem`` that fits, every layout scored within ``time_limit`` seconds; None when nothing
    fits or the limit ends the scoring first. ``num_workers`` is checked as ``solve`` checks it;
    scoring uses no CP-SAT workers."""
    check_solve_options(top=1, time_limit=time_limit, num_workers=num_workers)
    deadline = time.perf_counter() + time_limit
    ctx, cm = make_context(problem), load_cost_model(cost_model)
    space = build_space(problem)
    return find_optimum(space, ctx, cm, estimate, deadline=deadline)


def evaluate(
    *,
    cost_model: str | CostModel | None = None,
    pipeline_plan: str = "uniform",
    stage_layers: str | Sequence[int] | None = None,
    stage_recompute: str | None = None,
    **options: Any,
) -> Estimate:
    """Score one layout: ``options`` are ``make_problem``'s plus the layout's values (``tp=8,
    pp=4, vpp=5, recompute="selective", ...``); ``dp`` and ``grad_accum`` follow from the GPU
    count and the batch. ``pipeline_plan="per-stage"`` (implied by ``stage_layers`` or
    ``stage_recompute``) scores it with a per-stage plan (``plan_of``)."""
    attrs = {axis.layout_attr for axis in GIVEN_AXES}
    own = (*attrs, "cost_model", "pipeline_plan", "stage_layers", "stage_recompute")
    check_keywords(options, own=own)
    values = {k: options.pop(k) for k in list(options) if k in attrs}
    problem = make_problem(**options)
    if stage_layers is not None or stage_recompute is not None:
        pipeline_plan = "per-stage"
    layout = layout_of(problem, pipeline_plan=pipeline_plan, **values)
    plan = None
    if pipeline_plan == "per-stage":
        plan = plan_of(problem, layout, stage_layers=stage_layers, stage_recompute=stage_recompute)
    return evaluate_problem(problem, layout, cost_model=cost_model, plan=plan)
