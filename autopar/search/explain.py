"""Explain an infeasible problem: which rule families conflict, the nearest miss, and the
smallest changes that make it feasible (DESIGN §3, "Infeasibility"; issue 21).

- What binds: memory, when a layout exists once the capacity is lifted; else the rule families
  of an infeasible core of the rules alone, from CP-SAT assumption literals (one per family,
  ``num_workers=1`` as the CP-SAT troubleshooting guide requires), shrunk to a minimal core (a
  family stays only if the others alone are satisfiable).
- The nearest miss: the least memory at each step time over every layout the rules allow
  (``autopar.costs.score``, exact), among the layouts within ``SENSIBLE_SLOWDOWN`` of the
  fastest one: the least memory at any speed is reached by splitting the sequence or the model
  past all reason (CP 64 at 8k tokens), which no one would train with; it is said beside.
- Suggestions: changes a user can make, each checked by scoring the changed problem: lifting a
  restriction actually in force (by the flag that lifts it), the nearest GPU counts below and
  above whose layouts fit, another batch, a shorter sequence, a bigger GPU.
"""

from __future__ import annotations

import dataclasses
import time

from ortools.sat.python import cp_model

from autopar.base.deadline import TimeLimitReached
from autopar.base.errors import InputError
from autopar.costs.score import Scored, score_space
from autopar.costs.terms import CostModel, TermContext
from autopar.inputs.specs import GIB, Problem
from autopar.layout.plan import Layout
from autopar.layout.results import Explanation, NearestMiss, RuleFamily
from autopar.layout.space import Space, build_space
from autopar.search import interrupt
from autopar.search.cpsat import build_model, make_solver
from autopar.search.nearby import lifts, nearby_batches, nearby_gpu_counts, nearby_sequences

CORE_TIME_S = 10.0
SENSIBLE_SLOWDOWN = 2.0
"""A nearest miss is at most this much slower than the fastest layout with the capacity lifted:
twice the step time is twice the GPU-hours, which nobody books to fit."""
MAX_SUGGESTIONS = 6
QUICK_TEST_S = 1.0
"""A deletion test runs without probing for at most this long before it is asked with probing
(``_infeasible``)."""


def _left(deadline: float, most_s: float) -> float:
    return max(0.0, min(most_s, deadline - time.perf_counter()))


def _family_texts(space: Space, ctx: TermContext) -> dict[str, list[str]]:
    texts: dict[str, list[str]] = {}
    for rule in (*space.products, *space.all_rules):
        texts.setdefault(rule.family, []).append(rule.text)
    texts["memory"] = [f"per-GPU memory <= {ctx.cluster.usable_memory_bytes / GIB:.1f} GiB"]
    return texts


def conflicting_families(
    space: Space, ctx: TermContext, cost_model: CostModel, *, deadline: float
) -> list[RuleFamily]:
    """The rule families of a minimal infeasible core of the rules alone (memory capacity
    lifted), each with its rules as the user reads them."""
    try:
        model, vm = build_model(space.unpruned(), cost_model, ctx, explain=True, deadline=deadline)
    except TimeLimitReached:
        return []
    literals = list(vm.families.values())
    infeasible, core = _core(model, literals, deadline)
    if not infeasible:
        return []
    kept = [literal for literal in literals if literal.index in core]
    for literal in list(kept):  # deletion filter: a family stays only if it is needed
        if time.perf_counter() >= deadline or len(kept) == 1:
            break
        rest = [other for other in kept if other is not literal]
        if _infeasible(model, rest, deadline):
            kept = rest
    texts = _family_texts(space, ctx)
    names = {literal.name for literal in kept}
    return [
        RuleFamily(family=family, rules=tuple(texts.get(family, [])))
        for family, literal in vm.families.items()
        if literal.name in names
    ]


def _core(model: cp_model.CpModel, assumptions: list, deadline: float) -> tuple[bool, set[int]]:
    """Whether the rules-only model is infeasible under ``assumptions``, and the indices of the
    assumption literals of a sufficient core when it is."""
    model.clear_assumptions()
    model.add_assumptions(assumptions)
    solver = make_solver(time_limit_s=_left(deadline, CORE_TIME_S), probing=True)
    if interrupt.solve(solver, model) != cp_model.INFEASIBLE:
        return False, set()
    return True, set(solver.sufficient_assumptions_for_infeasibility())


def _infeasible(model: cp_model.CpModel, assumptions: list, deadline: float) -> bool:
    """``_core``'s answer, whether the model is infeasible under ``assumptions``, asked of
    CP-SAT without probing first: the deletion filter's tests settle 5-8x faster so (Llama-3
    70B on 1,000 GPUs: 13 tests, 1.03 s with probing, 0.21 s without). An answer is exact
    either way; one not settled within ``QUICK_TEST_S`` is asked as ``_core`` asks it."""
    model.clear_assumptions()
    model.add_assumptions(assumptions)
    quick = make_solver(time_limit_s=_left(deadline, QUICK_TEST_S))
    status = interrupt.solve(quick, model)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.INFEASIBLE):
        return status == cp_model.INFEASIBLE
    return _core(model, assumptions, deadline)[0]


def nearest_memory_miss(
    space: Space, ctx: TermContext, cost_model: CostModel, *, deadline: float
) -> NearestMiss | None:
    """The least memory among the layouts within ``SENSIBLE_SLOWDOWN`` of the fastest (the
    capacity lifted), with the least at any speed beside it; ``None`` when no layout exists."""
    if not all(space.domains.values()):
        return None
    scores = score_space(space, ctx, cost_model, front=True, deadline=deadline)
    if not scores.front:
        return None
    fastest = scores.front[0].step_s
    sensible = [p for p in scores.front if p.step_s <= SENSIBLE_SLOWDOWN * fastest]
    pick, least = sensible[-1], scores.front[-1]
    return NearestMiss(
        min_memory_bytes=pick.memory_bytes,
        capacity_bytes=float(ctx.cluster.usable_memory_bytes),
        layout=Layout.from_grid_row(pick.row).to_dict(),
        step_time_s=pick.step_s,
        least_memory_bytes=least.memory_bytes,
        least_layout=Layout.from_grid_row(least.row).to_dict(),
        least_step_time_s=least.step_s,
    )


def _best_of(problem: Problem, ctx: TermContext, cost_model, *, deadline: float) -> Scored | None:
    """The fastest layout of a changed problem that fits, or ``None``."""
    if time.perf_counter() >= deadline:
        return None
    changed = dataclasses.replace(
        ctx,
        model=problem.model,
        cluster=problem.cluster,
        training=problem.training,
        options=problem.options,
    )
    try:
        space = build_space(problem)
        if not all(space.domains.values()):
            return None
        scores = score_space(space, changed, cost_model, deadline=deadline)
    except (InputError, ValueError, TimeLimitReached):
        return None
    return scores.best[0] if scores.complete and scores.best else None


def _candidates(problem: Problem, miss: NearestMiss | None) -> list[tuple[str, Problem]]:
    """Changes a user could make besides the GPU count, in the order they are offered: lift a
    restriction in force, the batch, the sequence, a bigger GPU."""
    out = list(lifts(problem))
    out += nearby_batches(problem)
    if miss is not None:
        out += nearby_sequences(problem)
        out += _bigger_gpus(problem)
    return out


def _bigger_gpus(problem: Problem) -> list[tuple[str, Problem]]:
    from autopar.inputs.loading import load_gpu, preset_names

    out = []
    for name in preset_names("gpus"):
        gpu = load_gpu(name)
        if gpu.memory_bytes > problem.cluster.gpu.memory_bytes:
            cluster = dataclasses.replace(problem.cluster, gpu=gpu, gpus_per_node=gpu.gpus_per_node)
            out.append(
                (
                    f"use {name} GPUs ({gpu.memory_bytes / GIB:.0f} GiB, --gpu {name})",
                    dataclasses.replace(problem, cluster=cluster),
                )
            )
    return sorted(out, key=lambda c: c[1].cluster.gpu.memory_bytes)


def _suggestions(problem, ctx, cost_model, miss, *, deadline) -> list[str]:
    """The GPU counts that fit (``_gpu_counts``), then the other candidate changes that fit,
    each with the best layout it gives."""
    out = _gpu_counts(problem, ctx, cost_model, miss, deadline=deadline)
    for change, changed in _candidates(problem, miss):
        if len(out) >= MAX_SUGGESTIONS:
            break
        best = _best_of(changed, ctx, cost_model, deadline=deadline)
        if best is not None:
            out.append(_line(change, changed, best))
    return out


def _line(change: str, changed: Problem, best: Scored) -> str:
    tokens = changed.training.global_batch_tokens / best.step_s / changed.training.num_gpus
    layout = Layout.from_grid_row(best.row).text()
    return f"{change}: {layout}, {best.step_s:.2f} s ({tokens:,.0f} tokens/s per GPU)"


def _gpu_counts(problem, ctx, cost_model, miss, *, deadline) -> list[str]:
    """Of the nearby GPU counts that fit: the nearest below, the one below with the most
    tokens/s per GPU, and the one above with the most (when memory binds, the counts above that
    fit, fewest first)."""
    fits = []
    for change, changed in nearby_gpu_counts(problem, miss):
        best = _best_of(changed, ctx, cost_model, deadline=deadline)
        if best is not None:
            rate = changed.training.global_batch_tokens / best.step_s / changed.training.num_gpus
            fits.append((changed.training.num_gpus, rate, change, changed, best))
    if miss is not None:
        return [_line(c, p, b) for _, _, c, p, b in sorted(fits, key=lambda f: f[0])[:3]]
    below = [f for f in fits if f[0] < problem.training.num_gpus]
    above = [f for f in fits if f[0] > problem.training.num_gpus]
    picked = []
    if below:
        picked.append(max(below, key=lambda f: f[0]))
        picked.append(max(below, key=lambda f: f[1]))
    if above:
        picked.append(max(above, key=lambda f: f[1]))
    unique = {f[0]: f for f in picked}
    return [_line(c, p, b) for _, _, c, p, b in unique.values()]


def explain_infeasible(
    problem: Problem,
    space: Space,
    ctx: TermContext,
    cost_model: CostModel,
    *,
    deadline: float | None = None,
) -> Explanation:
    """Why ``space`` (of ``problem``) has no layout that fits, within ``deadline``
    (``time.perf_counter()`` seconds; ``cut_short`` says when it ran out)."""
    deadline = time.perf_counter() + 60.0 if deadline is None else deadline
    # With the capacity lifted, a layout exists: memory alone binds. Else the rules conflict.
    miss = nearest_memory_miss(space, ctx, cost_model, deadline=deadline)
    if miss is not None:
        families = [RuleFamily(family="memory", rules=tuple(_family_texts(space, ctx)["memory"]))]
    else:
        families = conflicting_families(space, ctx, cost_model, deadline=deadline)
    suggestions = _suggestions(problem, ctx, cost_model, miss, deadline=deadline)
    cut_short = time.perf_counter() >= deadline
    return Explanation(
        summary=_summary(families, miss, suggestions, cut_short),
        families=tuple(families),
        nearest_miss=miss,
        suggestions=tuple(suggestions),
        cut_short=cut_short,
    )


def _summary(families, miss: NearestMiss | None, suggestions, cut_short: bool) -> str:
    summary = (
        "no layout satisfies: " + "; ".join(f"{f.family} ({', '.join(f.rules)})" for f in families)
        if families
        else "no layout satisfies the rules"
    )
    if miss is not None:
        summary += f". {miss.text()}"
    if suggestions:
        summary += ". Would fit: " + "; or ".join(suggestions[:3])
    if cut_short:
        summary += ". The time limit cut this explanation short (raise --time-limit)"
    return summary
