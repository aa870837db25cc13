"""Explain an infeasible problem: which rule families conflict, the nearest miss, and the
smallest changes that make it feasible (DESIGN §3, "Infeasibility").

The conflicting families come from CP-SAT assumption literals (one per family, ``num_workers=1``
as the CP-SAT troubleshooting guide requires). When memory binds, the nearest miss is the layout
with the smallest per-GPU footprint, found by minimising memory with the capacity lifted.
Suggestions are candidate changes, each checked by solving the changed problem.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
from ortools.sat.python import cp_model

from autopar.base.axes import RECOMPUTE_MODES, ZERO_STAGES
from autopar.base.deadline import TimeLimitReached
from autopar.base.errors import InputError
from autopar.costs.terms import CostModel, TermContext
from autopar.inputs.specs import GIB, Problem
from autopar.layout.plan import Layout
from autopar.layout.results import Explanation, NearestMiss, RuleFamily
from autopar.layout.space import Space, build_space
from autopar.search import interrupt
from autopar.search.cpsat import BYTES_PER_KIB, build_model, make_solver

CORE_TIME_S = 10.0
MISS_TIME_S = 5.0
CHECK_TIME_S = 1.0


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
    """The rule families in an infeasible core of the rules alone (memory capacity lifted),
    each with its rules as the user reads them."""
    try:
        model, vm = build_model(space.unpruned(), cost_model, ctx, explain=True, deadline=deadline)
    except TimeLimitReached:
        return []
    solver = make_solver(time_limit_s=_left(deadline, CORE_TIME_S), probing=True)
    if interrupt.solve(solver, model) != cp_model.INFEASIBLE:
        return []
    core = {
        model.proto.variables[i].name for i in solver.sufficient_assumptions_for_infeasibility()
    }
    texts = _family_texts(space, ctx)
    return [
        RuleFamily(family=family, rules=tuple(texts.get(family, [])))
        for family, literal in vm.families.items()
        if literal.name in core
    ]


def nearest_memory_miss(
    space: Space, ctx: TermContext, cost_model: CostModel, *, deadline: float
) -> NearestMiss | None:
    """The smallest per-GPU footprint over all layouts the other rules allow."""
    if not all(space.domains.values()):
        return None
    try:
        model, vm = build_model(space, cost_model, ctx, memory_limit=False, deadline=deadline)
    except TimeLimitReached:
        return None
    model.minimize(vm.memory_kib)
    solver = make_solver(time_limit_s=_left(deadline, MISS_TIME_S))
    if interrupt.solve(solver, model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    layout = Layout.from_grid_row({a: int(solver.value(v)) for a, v in vm.axes.items()})
    need = solver.objective_value * BYTES_PER_KIB
    return NearestMiss(
        min_memory_bytes=need,
        capacity_bytes=float(ctx.cluster.usable_memory_bytes),
        layout=layout.to_dict(),
    )


def _with_training(problem: Problem, **changes: int) -> Problem:
    return dataclasses.replace(problem, training=dataclasses.replace(problem.training, **changes))


def _gpu_counts(problem: Problem, miss: NearestMiss | None) -> list[int]:
    """GPU counts worth trying: the nearest multiples of a node, and, when memory binds, the
    power-of-two multiples of the current count that would spread the nearest miss thin enough
    (model states shrink about linearly with the GPUs that share them)."""
    num_gpus, node = problem.training.num_gpus, problem.cluster.gpus_per_node
    counts = {max(node, num_gpus // node * node), (num_gpus // node + 1) * node, 2 * num_gpus}
    if miss is not None:
        ratio = miss.min_memory_bytes / miss.capacity_bytes
        first = int(np.ceil(np.log2(max(ratio, 1.0))))
        counts |= {num_gpus * 2**k for k in range(max(first, 1), first + 3)}
    return sorted(counts - {num_gpus})


def _candidates(problem: Problem, miss: NearestMiss | None) -> list[tuple[str, Problem]]:
    """Changes a user could make, smallest first."""
    t, o = problem.training, problem.options
    out: list[tuple[str, Problem]] = []
    if set(o.recompute) != set(RECOMPUTE_MODES) or set(o.zero_stages) != set(ZERO_STAGES):
        opts = dataclasses.replace(o, recompute=RECOMPUTE_MODES, zero_stages=ZERO_STAGES)
        out.append(
            (
                "allow every recompute mode and ZeRO stage (--recompute any --zero any)",
                dataclasses.replace(problem, options=opts),
            )
        )
    if not o.uneven_pipeline:
        out.append(
            (
                "allow an uneven pipeline split (--uneven-pipeline)",
                dataclasses.replace(problem, options=dataclasses.replace(o, uneven_pipeline=True)),
            )
        )
    if o.pins or o.maxima:
        out.append(
            (
                "drop the pins and limits",
                dataclasses.replace(problem, options=dataclasses.replace(o, pins=(), maxima=())),
            )
        )
    relaxed = out[0][1] if out and out[0][0].startswith("allow every") else None
    for num_gpus in _gpu_counts(problem, miss):
        out.append(
            (f"use {num_gpus} GPUs (--gpus {num_gpus})", _with_training(problem, num_gpus=num_gpus))
        )
        if relaxed is not None:
            flags = f"--gpus {num_gpus} --recompute any --zero any"
            out.append(
                (
                    f"use {num_gpus} GPUs and allow every recompute mode and ZeRO stage ({flags})",
                    _with_training(relaxed, num_gpus=num_gpus),
                )
            )
    batches = {t.global_batch_sequences // 2, _round_batch(t)} - {0, t.global_batch_sequences}
    out += [
        (
            f"use a global batch of {b} sequences (--global-batch {b})",
            _with_training(problem, global_batch_sequences=b),
        )
        for b in sorted(batches)
    ]
    if t.seq_len % 2 == 0:
        half = t.seq_len // 2
        out.append(
            (
                f"train with sequences of {half} tokens (--seq-len {half})",
                _with_training(problem, seq_len=half),
            )
        )
    return out


def _round_batch(training) -> int:
    """The nearest global batch that is a multiple of num_gpus (every DP size then divides it)."""
    num_gpus = training.num_gpus
    return max(num_gpus, round(training.global_batch_sequences / num_gpus) * num_gpus)


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


def _feasible(
    problem: Problem, ctx: TermContext, cost_model: CostModel, *, deadline: float
) -> bool:
    left = _left(deadline, CHECK_TIME_S)
    if left <= 0:
        return False
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
            return False
        model, _ = build_model(space, cost_model, changed, deadline=deadline)
    except (InputError, ValueError, TimeLimitReached):
        return False
    status = interrupt.solve(make_solver(time_limit_s=left), model)
    return status in (cp_model.OPTIMAL, cp_model.FEASIBLE)


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
    candidates = _candidates(problem, miss)
    if miss is not None:
        candidates += _bigger_gpus(problem)
    suggestions = [
        change
        for change, changed in candidates
        if _feasible(changed, ctx, cost_model, deadline=deadline)
    ]
    cut_short = time.perf_counter() >= deadline
    summary = (
        "no layout satisfies: " + "; ".join(f"{f.family} ({', '.join(f.rules)})" for f in families)
        if families
        else ("no layout satisfies the rules")
    )
    if miss is not None:
        layout = Layout(**miss.layout)
        summary += (
            f". The smallest per-GPU footprint is {miss.min_memory_bytes / GIB:.1f} GiB"
            f" ({layout.text()}), above {miss.capacity_bytes / GIB:.1f} GiB"
        )
    if suggestions:
        summary += ". Would fit: " + "; or ".join(suggestions[:3])
    if cut_short:
        summary += ". The time limit cut this explanation short (raise --time-limit)"
    return Explanation(
        summary=summary,
        families=tuple(families),
        nearest_miss=miss,
        suggestions=tuple(suggestions),
        cut_short=cut_short,
    )
