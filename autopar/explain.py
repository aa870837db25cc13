"""Explain an infeasible problem: which rule families conflict, the nearest miss, and the
smallest changes that make it feasible (DESIGN §3, "Infeasibility").

The conflicting families come from CP-SAT assumption literals (one per family, ``num_workers=1``
as the CP-SAT troubleshooting guide requires). When memory binds, the nearest miss is the layout
with the smallest per-GPU footprint, found by minimising memory with the capacity lifted.
Suggestions are candidate changes, each checked by solving the changed problem.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from autopar.cpsat import BYTES_PER_KIB, build_model
from autopar.errors import InputError
from autopar.plan import Layout
from autopar.rules import layout_rules, products
from autopar.space import build_space
from autopar.specs import GIB, RECOMPUTE_MODES, ZERO_STAGES, Problem
from autopar.terms import CostModel, TermContext

CHECK_TIME_S = 1.0


def _core_solver(time_limit_s: float) -> cp_model.CpSolver:
    """For the infeasible core: one worker (assumptions need it), no presolve, and probing
    kept on, since proving infeasibility leans on it (5-10x faster on the oracle's cases)."""
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.cp_model_presolve = False
    return solver


def _search_solver(time_limit_s: float) -> cp_model.CpSolver:
    """For finding layouts (nearest miss, suggestions): the settings of ``autopar.solver``."""
    from autopar.solver import _solver

    return _solver(time_limit_s=time_limit_s, num_workers=1)


def _family_texts(problem: Problem, ctx: TermContext) -> dict[str, list[str]]:
    texts: dict[str, list[str]] = {}
    for rule in (*products(problem), *layout_rules(problem)):
        texts.setdefault(rule.family, []).append(rule.text)
    texts["memory"] = [f"per-GPU memory <= {ctx.cluster.usable_memory_bytes / GIB:.1f} GiB"]
    return texts


def conflicting_families(
    problem: Problem, ctx: TermContext, cost_model: CostModel
) -> list[dict[str, Any]]:
    """The rule families in an infeasible core of the rules alone (memory capacity lifted),
    each with its rules as the user reads them."""
    space = build_space(problem, prune=False)
    model, vm = build_model(space, cost_model, ctx, explain=True)
    solver = _core_solver(10.0)
    if solver.solve(model) != cp_model.INFEASIBLE:
        return []
    core = {
        model.proto.variables[i].name for i in solver.sufficient_assumptions_for_infeasibility()
    }
    texts = _family_texts(problem, ctx)
    return [
        {"family": family, "rules": texts.get(family, [])}
        for family, literal in vm.families.items()
        if literal.name in core
    ]


def nearest_memory_miss(
    problem: Problem, ctx: TermContext, cost_model: CostModel
) -> dict[str, Any] | None:
    """The smallest per-GPU footprint over all layouts the other rules allow."""
    model, vm = build_model(build_space(problem), cost_model, ctx, memory_limit=False)
    model.minimize(vm.memory_kib)
    solver = _search_solver(5.0)
    if solver.solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    layout = Layout.from_grid_row({a: int(solver.value(v)) for a, v in vm.axes.items()})
    need = solver.objective_value * BYTES_PER_KIB
    return {
        "min_memory_bytes": need,
        "capacity_bytes": float(ctx.cluster.usable_memory_bytes),
        "layout": layout.to_dict(),
    }


def _with_training(problem: Problem, **changes: int) -> Problem:
    return dataclasses.replace(problem, training=dataclasses.replace(problem.training, **changes))


def _gpu_counts(problem: Problem, miss: dict[str, Any] | None) -> list[int]:
    """GPU counts worth trying: the nearest multiples of a node, and, when memory binds, the
    power-of-two multiples of the current count that would spread the nearest miss thin enough
    (model states shrink about linearly with the GPUs that share them)."""
    n, node = problem.training.num_gpus, problem.cluster.gpus_per_node
    counts = {max(node, n // node * node), (n // node + 1) * node, 2 * n}
    if miss is not None:
        ratio = miss["min_memory_bytes"] / miss["capacity_bytes"]
        first = int(np.ceil(np.log2(max(ratio, 1.0))))
        counts |= {n * 2**k for k in range(max(first, 1), first + 3)}
    return sorted(counts - {n})


def _candidates(problem: Problem, miss: dict[str, Any] | None) -> list[tuple[str, Problem]]:
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
    for n in _gpu_counts(problem, miss):
        out.append((f"use {n} GPUs (--gpus {n})", _with_training(problem, num_gpus=n)))
        if relaxed is not None:
            flags = f"--gpus {n} --recompute any --zero any"
            out.append(
                (
                    f"use {n} GPUs and allow every recompute mode and ZeRO stage ({flags})",
                    _with_training(relaxed, num_gpus=n),
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
    n = training.num_gpus
    return max(n, round(training.global_batch_sequences / n) * n)


def _bigger_gpus(problem: Problem) -> list[tuple[str, Problem]]:
    from autopar.loading import load_gpu, preset_names

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


def _feasible(problem: Problem, ctx: TermContext, cost_model: CostModel) -> bool:
    try:
        model, _ = build_model(
            build_space(problem),
            cost_model,
            dataclasses.replace(
                ctx,
                model=problem.model,
                cluster=problem.cluster,
                training=problem.training,
                options=problem.options,
            ),
        )
    except (InputError, ValueError):
        return False
    return _search_solver(CHECK_TIME_S).solve(model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)


def explain_infeasible(problem: Problem, ctx: TermContext, cost_model: CostModel) -> dict[str, Any]:
    # With the capacity lifted, a layout exists: memory alone binds. Else the rules conflict.
    miss = nearest_memory_miss(problem, ctx, cost_model)
    if miss is not None:
        families = [{"family": "memory", "rules": _family_texts(problem, ctx)["memory"]}]
    else:
        families = conflicting_families(problem, ctx, cost_model)
    candidates = _candidates(problem, miss)
    if miss is not None:
        candidates += _bigger_gpus(problem)
    suggestions = [change for change, changed in candidates if _feasible(changed, ctx, cost_model)]
    summary = (
        "no layout satisfies: "
        + "; ".join(f"{f['family']} ({', '.join(f['rules'])})" for f in families)
        if families
        else ("no layout satisfies the rules")
    )
    if miss is not None:
        layout = Layout(**miss["layout"])
        summary += (
            f". The smallest per-GPU footprint is {miss['min_memory_bytes'] / GIB:.1f} GiB"
            f" (TP={layout.tp} PP={layout.pp} CP={layout.cp} DP={layout.dp} "
            f"mbs={layout.mbs} recompute={layout.recompute} ZeRO-{layout.zero}), above "
            f"{miss['capacity_bytes'] / GIB:.1f} GiB"
        )
    if suggestions:
        summary += ". Would fit: " + "; or ".join(suggestions[:3])
    return {
        "summary": summary,
        "families": families,
        "nearest_miss": miss,
        "suggestions": suggestions,
    }
