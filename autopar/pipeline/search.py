"""Per-stage pipeline plans in CP-SAT, chosen together with the outer layout (issue 13).

One model holds the layout axes (variables, value indicators, the rules and products of
``autopar.search.cpsat``) and, for every pipeline shape ``(pp, vpp)`` still in play, the plan:
integer chunk boundaries (layers per chunk in model order), and per stage a selective-recompute flag
and a full-recompute count ``k`` (``min(k, layers of the chunk)`` layers of each chunk).

Outer layouts are rows: one boolean per row, exactly one chosen, channelled to the axes'
indicators. A row fixes every per-layer coefficient (``autopar.costs.stage_costs``), so under its
boolean the stage times, the stage memories and the objective are linear in the plan variables:

    T_i   >= sum over chunks of stage i and layer kinds of
             count*t_none + selective*(t_sel - t_none) + full*(t_full - t_none) + fixed_i
    M_i   =  static_i + sum_j in_flight_ij * activations of chunk j  <= capacity
    v*obj >= v*step + (m*v - 1) * max_i T_i + sum_i T_i

(``autopar.layout.stages`` for the schedule). ``max_i T_i`` is an ``add_max_equality``; kind counts
of a chunk are prefix sums at its boundaries (``add_element``). Times are integer nanoseconds,
memory integer bytes.

Rows are pruned before the model is built, without losing the optimum: every row has a lower
bound (no recompute, perfect balance: ``sum T >= S``, ``max T >= S/p``; then water-filling the
stages with a lower bound on each stage's time for ``n`` layers, ``h`` of them of the minor
kinds, the stages sharing the model's minor layers: ``_mix_fill``) and every row that fits
with a heuristic plan gives an upper bound; rows whose lower bound exceeds the best upper bound
cannot hold the optimum. The plans also give the hint. On the rows left, exact per-stage tables
tighten both bounds: one layer kind, per layer count (``autopar.pipeline.tables``); several kinds
without interleaving, per window of layers (``autopar.pipeline.windows``, with exact dynamic
programmes over the boundaries). Several kinds with interleaving keep the boundary encoding.
Middle stages that hold the same micro-batches in flight on every remaining row are
interchangeable (single-kind models): their layer counts are ordered.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from autopar.base.axes import AXIS, GRID_AXES
from autopar.base.deadline import TimeLimitReached, check_deadline
from autopar.costs.stage_costs import StageCosts, probe_stage_costs
from autopar.costs.stage_estimate import with_plan_recompute
from autopar.costs.stage_figures import in_flight, pipeline_time_s, stage_figures
from autopar.costs.terms import CostModel, TermContext
from autopar.inputs.specs import Problem
from autopar.layout.plan import Layout
from autopar.layout.results import Explanation, NearestMiss, SolveResult
from autopar.layout.rules import layout_rules
from autopar.layout.space import Space, space_of
from autopar.layout.stages import StagePlan, StageRecompute, even_plan
from autopar.pipeline.tables import StageTable, least_layers, stage_table
from autopar.pipeline.windows import WindowTable, start_classes, window_bounds, window_table
from autopar.search.cpsat import VarMap, _add_layout, make_solver

NS_PER_S = 1e9
ABSOLUTE_GAP_NS = 10_000
"""Optimality tolerance: 10 microseconds of step time."""
CAPACITY_SLACK_BYTES = 4096
"""Integer memory slack over the float capacity (rounded coefficients, a few hundred terms)."""
BISECTIONS = 24
HINT_TIME_S = 2.0
HEURISTIC_OPTIONS = 12
"""Recompute options the heuristic plans try per stage (full counts spaced geometrically)."""
"""Time to turn the heuristic plan into a full hint."""
"""Bisection steps of the water-filling bound (any number gives a valid bound; 24 give a
relative precision of 6e-8 of the largest stage time)."""
"""Optimality tolerance: 10 microseconds of step time."""
SPLIT_FAMILY = "layers vs PP"
MAX_KIND_MIXES = 64
"""Kind mixes (minor kind counts and their recomputed counts) the lower bound enumerates
per stage; beyond, every layer is priced at the cheapest kind."""


def per_stage_space(problem: Problem) -> Space:
    """The space of ``problem`` for per-stage plans: the even-split rules (``layers vs PP``) give
    way to ``pp*vpp <= layers + 2`` (every chunk but the first and last holds a layer), and
    ``recompute`` has one value: the plan carries each stage's."""
    layers = problem.model.num_layers
    rules = [r for r in layout_rules(problem) if r.family != SPLIT_FAMILY]
    rules.append(
        dataclasses.replace(
            next(r for r in layout_rules(problem) if r.family == "interleaved schedule"),
            family=SPLIT_FAMILY,
            text=f"pp*vpp <= num_layers + 2 ({layers + 2}): every middle chunk holds a layer",
            axes=("pp", "vpp"),
            check=lambda g: g["pp"] * g["vpp"] <= layers + 2,
            source="Megatron pipeline_parallel_layer_layout.py (E and L may stand alone)",
        )
    )
    unpruned = {axis.name: axis.values(problem) for axis in AXIS.values()}
    codes = unpruned["recompute"]
    unpruned["recompute"] = (min(codes),) if codes else ()
    return space_of(problem, rules, unpruned)


def allowed_modes(problem: Problem) -> tuple[str, ...]:
    return tuple(problem.options.recompute)


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidates:
    """The outer rows, their costs, bounds and the best even plan of each."""

    grid: dict[str, np.ndarray]
    costs: StageCosts
    lower_s: np.ndarray
    even_s: np.ndarray
    """Best even plan's step time per row (inf where none fits)."""
    even_plans: list[StagePlan | None]
    even_peak_bytes: np.ndarray
    """Smallest peak stage memory over the even plans of each row (for explanations)."""
    even_peak_plans: list[StagePlan | None]


def _uniform_recomputes(modes: tuple[str, ...], max_chunk: int) -> list[StageRecompute]:
    out = []
    if "none" in modes:
        out.append(StageRecompute("none", 0))
    if "selective" in modes:
        out.append(StageRecompute("selective", 0))
    if "full" in modes:
        out += [StageRecompute("full", k) for k in range(1, max_chunk + 1)]
    return out


def candidates(
    problem: Problem,
    space: Space,
    ctx: TermContext,
    cost_model: CostModel,
    *,
    deadline: float | None = None,
) -> Candidates:
    """Every outer row with its costs, lower bound and best heuristic plan (module docstring).

    Heuristic plans: the even split, then, on the rows whose lower bound beats the best plan so
    far, the water-filled stage layer counts of the bound; each spread over the stage's chunks
    with the fewest layers where the most micro-batches are in flight, and each stage given the
    cheapest recompute that fits (exact for given layer counts: stages fit independently)."""
    grid = space.pruned_grid(GRID_AXES)
    costs = probe_stage_costs(cost_model, ctx, grid, deadline=deadline)
    size = len(grid["pp"])
    capacity = float(ctx.cluster.usable_memory_bytes)
    lower = np.full(size, np.inf)
    best_s = np.full(size, np.inf)
    peak = np.full(size, np.inf)
    plans: list[StagePlan | None] = [None] * size
    peak_plans: list[StagePlan | None] = [None] * size
    num_layers = problem.model.num_layers
    modes = allowed_modes(problem)

    def consider(index, sub, m, layers, p, v):
        step, recompute, most = _best_recompute(layers, p, v, sub, m, modes, capacity)
        better = step < best_s[index]
        made: dict[tuple, StagePlan] = {}
        for j in np.flatnonzero(better):
            rec = recompute[j]
            if rec not in made:
                made[rec] = StagePlan(pp=p, vpp=v, chunk_layers=layers, recompute=rec)
            plans[index[j]] = made[rec]
        best_s[index] = np.where(better, step, best_s[index])
        lower_peak = most < peak[index]
        saving = StagePlan(
            pp=p, vpp=v, chunk_layers=layers, recompute=(_most_saving(modes, layers),) * p
        )
        for r in index[lower_peak]:
            peak_plans[r] = saving
        peak[index] = np.minimum(peak[index], most)

    groups = _groups(grid)
    for (p, v), index in groups.items():
        check_deadline(deadline)  # --time-limit covers the plan search (issue 15)
        sub = _subset(costs, index)
        m = np.asarray(grid["grad_accum"][index], dtype=np.int64)
        lower[index] = _balanced_bound(sub, p, v, m)
        even = even_plan(num_layers, p, v, StageRecompute())
        counts = tuple(even.stage_layers(i) for i in range(p))
        consider(index, sub, m, _spread(counts, p, v, int(m[0])), p, v)
        if len(set(costs.layer_kinds)) > 1:
            balanced = _balanced_counts(sub, p, v)
            if balanced != counts:
                consider(index, sub, m, _spread(balanced, p, v, int(m[0])), p, v)
    bound = float(np.min(best_s)) if size else np.inf
    for (p, v), index in groups.items():
        check_deadline(deadline)
        # The water-filling bound where the balanced one does not already rule the row out.
        open_rows = index[lower[index] <= bound * (1 + 1e-9)]
        if not len(open_rows):
            continue
        sub = _subset(costs, open_rows)
        m = np.asarray(grid["grad_accum"][open_rows], dtype=np.int64)
        tight, split = _lower_bound(sub, p, v, m, modes, capacity)
        lower[open_rows] = np.maximum(lower[open_rows], tight)
        promising = np.flatnonzero(lower[open_rows] < bound * (1 + 1e-9))
        vectors: dict[tuple[int, ...], list[int]] = {}
        for j in promising:
            n = _trim([int(c[j]) for c in split[0]], p, v, num_layers)
            if n is not None:
                vectors.setdefault(n, []).append(int(j))
        for n, rows in vectors.items():
            chosen = open_rows[np.array(rows)]
            sub = _subset(costs, chosen)
            m = np.asarray(grid["grad_accum"][chosen], dtype=np.int64)
            consider(chosen, sub, m, _spread(n, p, v, int(m[0])), p, v)
    return Candidates(
        grid=grid,
        costs=costs,
        lower_s=lower,
        even_s=best_s,
        even_plans=plans,
        even_peak_bytes=peak,
        even_peak_plans=peak_plans,
    )


def _balanced_counts(costs: StageCosts, p: int, v: int) -> tuple[int, ...]:
    """Stage layer counts that minimise the slowest stage without recompute, for the first
    row's per-layer times (layers of several kinds; a linear-partition dynamic programme)."""
    kinds = costs.layer_kinds
    num_layers = len(kinds)
    layer_t = np.array([costs.time_s[k][0, 0] for k in kinds])
    prefix = np.concatenate([[0.0], np.cumsum(layer_t)])
    fixed = [
        float(costs.every_time_s[0])
        + (float(costs.first_time_s[0]) if i == 0 else 0.0)
        + (float(costs.last_time_s[0]) if i == p - 1 else 0.0)
        for i in range(p)
    ]
    least = [least_layers(p, v, i, num_layers) for i in range(p)]
    inf = float("inf")
    # best[i][e]: least slowest time of stages 0..i-1 holding the first e layers
    best = [[inf] * (num_layers + 1) for _ in range(p + 1)]
    cut = [[0] * (num_layers + 1) for _ in range(p + 1)]
    best[0][0] = 0.0
    for i in range(p):
        for e in range(num_layers + 1):
            if best[i][e] == inf:
                continue
            for n in range(least[i], num_layers - e + 1):
                value = max(best[i][e], prefix[e + n] - prefix[e] + fixed[i])
                if value < best[i + 1][e + n]:
                    best[i + 1][e + n] = value
                    cut[i + 1][e + n] = n
    counts, e = [], num_layers
    for i in range(p, 0, -1):
        n = cut[i][e]
        counts.append(n)
        e -= n
    return tuple(reversed(counts))


def _least_total_s(costs: StageCosts, p: int) -> np.ndarray:
    """``sum_i T_i`` without recompute: every layer once, the fixed parts of every stage."""
    kinds = costs.layer_kinds
    layers = sum(kinds.count(k) * costs.time_s[k][:, 0] for k in dict.fromkeys(kinds))
    return layers + p * costs.every_time_s + costs.first_time_s + costs.last_time_s


def _balanced_bound(costs: StageCosts, p: int, v: int, m: np.ndarray) -> np.ndarray:
    """A lower bound on each row's step time: no recompute, perfect balance
    (``max_i T_i >= sum_i T_i / p``)."""
    total = _least_total_s(costs, p)
    return costs.step_time_s + (m - 1.0 / v) * total / p + total / v


def _most_saving(modes, layers) -> StageRecompute:
    if "full" in modes:
        return StageRecompute("full", max(layers))
    return StageRecompute("selective", 0) if "selective" in modes else StageRecompute()


def _trim(n: list[int], p: int, v: int, num_layers: int) -> tuple[int, ...] | None:
    """Water-filled stage counts cut down to the layer count (from the first stage on, which
    holds the most micro-batches in flight), or ``None`` when they do not reach it."""
    if min(n) < 0 or sum(n) < num_layers:
        return None
    least = [max(v - 1, 0) if i in (0, p - 1) else v for i in range(p)] if p > 1 else [num_layers]
    surplus = sum(n) - num_layers
    for i in range(p):
        cut = min(surplus, n[i] - least[i])
        n[i] -= cut
        surplus -= cut
    return tuple(n)


def _spread(counts: Sequence[int], p: int, v: int, m: int) -> tuple[int, ...]:
    """Chunk layer counts from stage counts: a stage's chunks differ by at most one layer, the
    extra layers where the fewest micro-batches are in flight; the first chunk (with the
    embedding) holds none when the stage's other chunks can take its layers."""
    chunk = [0] * (p * v)
    for i, n in enumerate(counts):
        mine = [j * p + i for j in range(v)]
        weights = in_flight(p, v, m, i)
        if i == 0 and v > 1 and n >= v - 1:
            mine, weights = mine[1:], weights[1:]
        base, extra = divmod(n, len(mine))
        order = sorted(range(len(mine)), key=lambda j: (weights[j], -j))
        for rank, j in enumerate(order):
            chunk[mine[j]] = base + (1 if rank < extra else 0)
    return tuple(chunk)


def _best_recompute(layers, p, v, costs: StageCosts, m, modes, capacity):
    """For chunk layer counts ``layers``: per row, the step time with each stage's cheapest
    recompute that fits (inf when a stage fits with none), the recompute per stage, and the
    smallest peak memory reachable."""
    max_chunk = max(layers)
    options = _uniform_recomputes(modes, max_chunk)
    if len(options) > HEURISTIC_OPTIONS:  # a heuristic: every recompute count is too many
        keep_k = {
            1,
            max_chunk,
            *np.unique(np.geomspace(1, max_chunk, HEURISTIC_OPTIONS).astype(int)),
        }
        options = [o for o in options if o.mode != "full" or o.num_layers in keep_k]
    rows = len(m)
    best_t = np.full((rows, p), np.inf)
    choice = np.zeros((rows, p), dtype=np.int64)
    least_memory = np.full(rows, np.inf)
    for o, rec in enumerate(options):
        plan = StagePlan(pp=p, vpp=v, chunk_layers=tuple(layers), recompute=(rec,) * p)
        fig = stage_figures(plan, costs, m)
        fits = fig.memory_bytes <= capacity
        take = fits & (fig.time_s < best_t)
        best_t = np.where(take, fig.time_s, best_t)
        choice = np.where(take, o, choice)
        least_memory = np.minimum(least_memory, fig.memory_bytes.max(axis=1))
    feasible = np.isfinite(best_t).all(axis=1)
    step = np.full(rows, np.inf)
    if feasible.any():
        step[feasible] = costs.step_time_s[feasible] + pipeline_time_s(
            best_t[feasible], m[feasible], v
        )
    distinct, which = np.unique(choice, axis=0, return_inverse=True)
    per_choice = [tuple(options[c] for c in row) for row in distinct]
    recompute = [per_choice[j] for j in np.ravel(which)]
    return step, recompute, least_memory


def _kind_mixes(kinds_in_order: Sequence[str]):
    """The major kind (the most frequent) with its count, the minor kinds, and every pair
    (minor counts, minor counts recomputed fully) a stage may hold; ``None`` when there are more
    than ``MAX_KIND_MIXES`` such pairs."""
    totals: dict[str, int] = {}
    for kind in kinds_in_order:
        totals[kind] = totals.get(kind, 0) + 1
    major = max(totals, key=lambda k: totals[k])
    minors = [k for k in totals if k != major]
    size = math.prod((totals[k] + 1) * (totals[k] + 2) // 2 for k in minors)
    if size > MAX_KIND_MIXES:
        return None
    pairs = [
        (held, done)
        for held in itertools.product(*(range(totals[k] + 1) for k in minors))
        for done in itertools.product(*(range(h + 1) for h in held))
    ]
    return major, totals[major], minors, pairs


def _stage_time_of_layers(costs: StageCosts, p: int, v: int, m: np.ndarray, modes, capacity: float):
    """Per stage ``i`` and minor-kind counts ``h`` (``_kind_mixes``), ``t_i(h, n)`` (rows x
    ``n``): a lower bound on the time of one micro-batch on stage ``i`` holding ``n`` layers,
    ``h`` of them of the minor kinds, over every plan; and the model's count of each minor
    kind. Relaxations: the stage may hold any mix of kinds the model has (not only what
    consecutive chunks give), its activations are weighed by its smallest in-flight count,
    and full recompute may pick any of its layers (not the first ``k`` of each chunk); each
    mix takes its cheapest recompute that fits. With too many kind mixes every layer is
    priced at the cheapest kind, term by term. ``t_i`` is made non-decreasing in ``n`` (a
    minimum over ``n' >= n``, still a bound), as the water-filling needs."""
    mixes = _kind_mixes(costs.layer_kinds)
    num_layers = len(costs.layer_kinds)
    if mixes is None:
        kinds = tuple(dict.fromkeys(costs.layer_kinds))
        arrays = {
            "t": np.min([costs.time_s[k] for k in kinds], axis=0),
            "a": np.min([costs.activation_bytes[k] for k in kinds], axis=0),
            "s": np.min([costs.static_bytes[k] for k in kinds], axis=0),
        }
        major, cap_major, minors, pairs = None, num_layers, [], [((), ())]
    else:
        major, cap_major, minors, pairs = mixes
        arrays = {
            "t": costs.time_s[major],
            "a": costs.activation_bytes[major],
            "s": costs.static_bytes[major],
        }
    t, a, s = arrays["t"], arrays["a"], arrays["s"]
    n = np.arange(num_layers + 1, dtype=np.float64)[None, :]
    distinct = np.unique(m)
    out = []
    for i in range(p):
        least_w = np.array([min(in_flight(p, v, int(mm), i)) for mm in distinct], dtype=float)
        w = least_w[np.searchsorted(distinct, m)][:, None]
        ends = [costs.every_time_s, costs.every_static_bytes, costs.every_activation_bytes]
        if i == 0:
            ends = [
                e + f
                for e, f in zip(
                    ends,
                    (costs.first_time_s, costs.first_static_bytes, costs.first_activation_bytes),
                    strict=True,
                )
            ]
        if i == p - 1:
            ends = [
                e + f
                for e, f in zip(
                    ends,
                    (costs.last_time_s, costs.last_static_bytes, costs.last_activation_bytes),
                    strict=True,
                )
            ]
        fixed_t, fixed_s, fixed_a = ends
        by_held: dict[tuple[int, ...], np.ndarray] = {}
        for held, done in pairs:
            best = by_held.setdefault(held, np.full((len(m), num_layers + 1), np.inf))
            c = n - sum(held)  # layers of the major kind (rows broadcast)
            valid = (c >= 0) & (c <= cap_major)
            tk = [costs.time_s[k] for k in minors]
            ak = [costs.activation_bytes[k] for k in minors]
            time0 = (
                fixed_t[:, None]
                + c * t[:, 0:1]
                + sum(h * x[:, 0:1] for h, x in zip(held, tk, strict=True))
            )
            static = (
                (fixed_s + w[:, 0] * fixed_a)[:, None]
                + c * s[:, None]
                + sum(h * costs.static_bytes[k][:, None] for h, k in zip(held, minors, strict=True))
            )

            def acts(code, held=held, c=c, ak=ak):
                return c * a[:, code : code + 1] + sum(
                    h * x[:, code : code + 1] for h, x in zip(held, ak, strict=True)
                )

            options = []
            if not any(done):
                if "none" in modes:
                    options.append((time0, static + w * acts(0)))
                if "selective" in modes:
                    options.append(
                        (
                            time0
                            + c * (t[:, 1:2] - t[:, 0:1])
                            + sum(
                                h * (x[:, 1:2] - x[:, 0:1]) for h, x in zip(held, tk, strict=True)
                            ),
                            static + costs.selective_workspace_bytes[:, None] + w * acts(1),
                        )
                    )
            if "full" in modes and ("none" in modes or tuple(done) == tuple(held)):
                saved_minor = sum(
                    r * (x[:, 0:1] - x[:, 2:3]) for r, x in zip(done, ak, strict=True)
                )
                over = (
                    static
                    + costs.full_workspace_bytes[:, None]
                    + w * (acts(0) - saved_minor)
                    - capacity
                )
                per_layer = w * (a[:, 0:1] - a[:, 2:3])
                need = np.ceil(
                    np.maximum(over, 0.0) / np.where(per_layer > 0, per_layer, np.inf) - 1e-9
                )
                need = np.where((over > 0) & ~(per_layer > 0), np.inf, need)
                need = np.maximum(need, 0.0 if sum(done) else 1.0)
                if "none" not in modes:
                    need = np.where(need <= c, c, need)
                extra = need * (t[:, 2:3] - t[:, 0:1]) + sum(
                    r * (x[:, 2:3] - x[:, 0:1]) for r, x in zip(done, tk, strict=True)
                )
                options.append((np.where(need <= c, time0 + extra, np.inf), None))
            for time_s, memory in options:
                ok = valid if memory is None else valid & (memory <= capacity)
                np.minimum(best, np.where(ok, time_s, np.inf), out=best)
        # non-decreasing in n: the least over n' >= n
        out.append(
            {h: np.minimum.accumulate(b[:, ::-1], axis=1)[:, ::-1] for h, b in by_held.items()}
        )
    caps = tuple(costs.layer_kinds.count(k) for k in minors)
    return out, caps


def _lower_bound(costs: StageCosts, p: int, v: int, m: np.ndarray, modes, capacity: float):
    """A lower bound on each row's step time over all plans, and stage layer counts near its
    ``max`` term (for the heuristic plans): ``max_i T_i >= tau``, the least ``tau`` at which the
    stages can take all layers, and all layers of each minor kind between them, with
    ``t_i(h_i, n_i) <= tau`` (``_mix_fill``); ``sum_i T_i`` is at least the time of every layer
    without recompute."""
    num_layers = len(costs.layer_kinds)
    tables, caps = _stage_time_of_layers(costs, p, v, m, modes, capacity + CAPACITY_SLACK_BYTES)
    least_n = [least_layers(p, v, i, num_layers) for i in range(p)]
    lo, feasible = _mix_fill(tables, caps, least_n, num_layers)
    cheapest = [np.min(list(t.values()), axis=0) for t in tables]
    _, _, counts = _water_fill(cheapest, least_n, num_layers, _max_layers)
    total = _least_total_s(costs, p)
    bound = costs.step_time_s + (m - 1.0 / v) * np.maximum(lo, total / p) + total / v
    return np.where(feasible, bound, np.inf), (counts,)


def _mix_fill(
    tables: list[dict[tuple[int, ...], np.ndarray]],
    caps: tuple[int, ...],
    least: list[int],
    num_layers: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The least bottleneck ``tau`` (per row, by bisection; the lower end, and whether any
    ``tau`` works) at which the stages hold every layer: stage ``i`` holding ``h_i`` minor-kind
    layers takes at most ``max{n : t_i(h_i, n) <= tau} - |h_i|`` major ones, and the ``h_i``
    share the model's minor layers (``caps``). A knapsack over stages whose states are the
    minor counts used so far (capped at ``caps``: a relaxation, so still a bound); a true plan
    with bottleneck ``<= tau`` is a path of it, so ``tau`` below the result is impossible."""
    rows = next(iter(tables[0].values())).shape[0]
    states = list(itertools.product(*(range(c + 1) for c in caps)))
    index = {s: j for j, s in enumerate(states)}
    moves = {
        h: [(j, index[tuple(min(a + b, c) for a, b, c in zip(s, h, caps, strict=True))])
            for s, j in index.items()]
        for h in tables[0]
    }  # fmt: skip
    need = num_layers - sum(caps)

    def enough(tau: np.ndarray) -> np.ndarray:
        value = np.full((rows, len(states)), -np.inf)
        value[:, 0] = 0.0
        for i, table in enumerate(tables):
            new = np.full_like(value, -np.inf)
            for h, t in table.items():
                most = (t <= tau[:, None]).sum(axis=1) - 1
                majors = np.where((most >= least[i]) & (most >= sum(h)), most - sum(h), -np.inf)
                for j, to in moves[h]:
                    np.maximum(new[:, to], value[:, j] + majors, out=new[:, to])
            value = new
        return value[:, index[caps]] >= need

    finite = [np.where(np.isfinite(t), t, 0).max(axis=1) for tab in tables for t in tab.values()]
    hi = np.max(finite, axis=0) + 1.0
    lo = np.zeros(rows)
    feasible = enough(hi)
    for _ in range(BISECTIONS):
        mid = 0.5 * (lo + hi)
        ok = enough(mid)
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    return lo, feasible


def _water_fill(
    times: list[np.ndarray],
    least: list[int],
    num_layers: int,
    most_within: Callable[[np.ndarray, np.ndarray, int], np.ndarray],
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """The smallest bottleneck time ``tau`` (per row, by bisection) at which the stages together
    hold ``num_layers``: stage ``i`` takes ``most_within(times[i], tau, least[i])`` layers.
    Returns the bisection's lower and upper ends and the counts at the upper one."""
    lo = np.zeros(times[0].shape[0])
    hi = np.max([np.where(np.isfinite(t), t, 0).max(axis=1) for t in times], axis=0) + 1.0
    for _ in range(BISECTIONS):
        mid = 0.5 * (lo + hi)
        take = sum(most_within(t, mid, k) for t, k in zip(times, least, strict=True))
        enough = take >= num_layers
        hi = np.where(enough, mid, hi)
        lo = np.where(enough, lo, mid)
    return lo, hi, [most_within(t, hi, k) for t, k in zip(times, least, strict=True)]


def _max_layers(times: np.ndarray, tau: np.ndarray, least: int) -> np.ndarray:
    """Most layers a stage can hold within ``tau`` (``t_i(n)`` grows with ``n``), or a large
    negative number when not even ``least``."""
    most = (times <= tau[:, None]).sum(axis=1) - 1
    return np.where(most >= least, most, -(10**9))


def _plan_ok(plan: StagePlan, num_layers: int) -> bool:
    chunks = plan.pp * plan.vpp
    return sum(plan.chunk_layers) == num_layers and all(
        plan.chunk_layers[c] >= 1 for c in range(1, chunks - 1)
    )


def _groups(grid) -> dict[tuple[int, int], np.ndarray]:
    keys = np.stack([grid["pp"], grid["vpp"]], axis=1)
    out = {}
    for p, v in sorted({(int(a), int(b)) for a, b in keys}):
        out[(p, v)] = np.flatnonzero((grid["pp"] == p) & (grid["vpp"] == v))
    return out


def _subset(costs: StageCosts, index: np.ndarray) -> StageCosts:
    fields = {}
    for f in dataclasses.fields(costs):
        value = getattr(costs, f.name)
        if f.name == "layer_kinds":
            fields[f.name] = value
        elif isinstance(value, dict):
            fields[f.name] = {k: v[index] for k, v in value.items()}
        else:
            fields[f.name] = value[index]
    return StageCosts(**fields)


@dataclass(slots=True)
class _Group:
    """The plan variables of one ``(pp, vpp)``."""

    pp: int
    vpp: int
    bounds: list
    counts: list  # per chunk: {kind: expr}
    full: list  # per chunk: {kind: expr}
    selective: list  # per chunk: {kind: var}
    sel: list
    k: list
    any_full: list
    times: list
    slowest: cp_model.IntVar


def _prefix(kinds: tuple[str, ...], kind: str) -> list[int]:
    out = [0]
    for k in kinds:
        out.append(out[-1] + (k == kind))
    return out


def _add_group(
    model: cp_model.CpModel, p: int, v: int, kinds_in_order: tuple[str, ...], modes, max_ns: int
) -> _Group:
    num_layers = len(kinds_in_order)
    kinds = tuple(dict.fromkeys(kinds_in_order))
    single = len(kinds) == 1
    chunks = p * v
    name = f"pp{p}v{v}"
    b = [model.new_constant(0)]
    b += [model.new_int_var(0, num_layers, f"{name}.b{c}") for c in range(1, chunks)]
    b.append(model.new_constant(num_layers))
    # Chunks hold consecutive layers; every chunk but the first and the last holds one.
    for c in range(chunks):
        model.add(b[c + 1] >= b[c] + (1 if 0 < c < chunks - 1 else 0))
    if v > 1:
        # Interleaving: a stage's chunks differ by at most one layer (the first and the last
        # chunk, which also hold the embedding and the loss, may hold fewer): the schedule
        # formula holds for near-equal chunks only (tests/test_stages.py simulates it).
        for i in range(p):
            low = model.new_int_var(0, num_layers, f"{name}.q{i}")
            for c in range(i, chunks, p):
                n_c = b[c + 1] - b[c]
                model.add(n_c <= low + 1)
                if 0 < c < chunks - 1:
                    model.add(n_c >= low)
    prefixes = {kind: _prefix(kinds_in_order, kind) for kind in kinds}

    def kind_counts(lo, hi, tag):
        if single:
            return {kinds[0]: hi - lo}
        out = {}
        for kind in kinds:
            at = []
            for j, point in enumerate((lo, hi)):
                var = model.new_int_var(0, num_layers, f"{name}.{tag}.P{kind}{j}")
                model.add_element(point, prefixes[kind], var)
                at.append(var)
            out[kind] = at[1] - at[0]
        return out

    counts = [kind_counts(b[c], b[c + 1], f"c{c}") for c in range(chunks)]
    max_chunk = num_layers - max(chunks - 2, 0)
    sel, k, any_full, full, selective = [], [], [], [], []
    for i in range(p):
        s_i = model.new_bool_var(f"{name}.sel{i}") if "selective" in modes else None
        k_i = model.new_int_var(0, max_chunk, f"{name}.k{i}") if "full" in modes else None
        a_i = model.new_bool_var(f"{name}.anyfull{i}") if k_i is not None else None
        if s_i is not None and k_i is not None:
            # Megatron's granularity is selective or full, not both.
            model.add(k_i == 0).only_enforce_if(s_i)
        sel.append(s_i)
        k.append(k_i)
        any_full.append(a_i)
    for c in range(chunks):
        i = c % p
        n_c = b[c + 1] - b[c]
        if k[i] is not None:
            r_c = model.new_int_var(0, max_chunk, f"{name}.r{c}")
            n_var = model.new_int_var(0, num_layers, f"{name}.n{c}")
            model.add(n_var == n_c)
            model.add_min_equality(r_c, [k[i], n_var])
            full.append(kind_counts(b[c], b[c] + r_c, f"f{c}") if not single else {kinds[0]: r_c})
            if "none" not in modes:
                cond = [sel[i].Not()] if sel[i] is not None else []
                model.add(r_c == n_var).only_enforce_if(cond)
        else:
            full.append({kind: 0 for kind in kinds})
            if "none" not in modes and sel[i] is not None:
                model.add(sel[i] == 1)
        if sel[i] is not None:
            chunk_sel = {}
            for kind in kinds:
                var = model.new_int_var(0, num_layers, f"{name}.s{c}{kind}")
                model.add(var == counts[c][kind]).only_enforce_if(sel[i])
                model.add(var == 0).only_enforce_if(sel[i].Not())
                chunk_sel[kind] = var
            selective.append(chunk_sel)
        else:
            selective.append({kind: 0 for kind in kinds})
    for i in range(p):
        if any_full[i] is None:
            continue
        total = sum(full[c][kind] for c in range(i, chunks, p) for kind in kinds)
        model.add(total >= 1).only_enforce_if(any_full[i])
        model.add(total == 0).only_enforce_if(any_full[i].Not())
    times = [model.new_int_var(0, max_ns, f"{name}.T{i}") for i in range(p)]
    slowest = model.new_int_var(0, max_ns, f"{name}.Tmax")
    model.add_max_equality(slowest, times)
    return _Group(p, v, b, counts, full, selective, sel, k, any_full, times, slowest)


def _ns(x) -> int:
    return int(round(float(x) * NS_PER_S))


def _bytes(x) -> int:
    return int(round(float(x)))


def _add_row(
    model: cp_model.CpModel,
    g: _Group,
    costs: StageCosts,
    r: int,
    m: int,
    x: cp_model.IntVar,
    objective: cp_model.IntVar,
    capacity: int,
) -> None:
    """The stage times, memories and objective of row ``r`` under its boolean ``x``."""
    p, v = g.pp, g.vpp
    chunks = p * v
    kinds = tuple(dict.fromkeys(costs.layer_kinds))
    t = {kind: [_ns(costs.time_s[kind][r, code]) for code in range(3)] for kind in kinds}
    a = {
        kind: [_bytes(costs.activation_bytes[kind][r, code]) for code in range(3)] for kind in kinds
    }
    s = {kind: _bytes(costs.static_bytes[kind][r]) for kind in kinds}

    def chunk_time(c):
        return sum(
            g.counts[c][kind] * t[kind][0]
            + g.selective[c][kind] * (t[kind][1] - t[kind][0])
            + g.full[c][kind] * (t[kind][2] - t[kind][0])
            for kind in kinds
        )

    def chunk_act(c):
        return sum(
            g.counts[c][kind] * a[kind][0]
            + g.selective[c][kind] * (a[kind][1] - a[kind][0])
            + g.full[c][kind] * (a[kind][2] - a[kind][0])
            for kind in kinds
        )

    for i in range(p):
        mine = range(i, chunks, p)
        fixed_ns = _ns(costs.every_time_s[r])
        fixed_bytes = _bytes(costs.every_static_bytes[r])
        if i == 0:
            fixed_ns += _ns(costs.first_time_s[r])
            fixed_bytes += _bytes(costs.first_static_bytes[r])
        if i == p - 1:
            fixed_ns += _ns(costs.last_time_s[r])
            fixed_bytes += _bytes(costs.last_static_bytes[r])
        model.add(g.times[i] >= sum(chunk_time(c) for c in mine) + fixed_ns).only_enforce_if(x)
        memory = fixed_bytes + sum(g.counts[c][kind] * s[kind] for c in mine for kind in kinds)
        if g.any_full[i] is not None:
            memory += g.any_full[i] * _bytes(costs.full_workspace_bytes[r])
        if g.sel[i] is not None:
            memory += g.sel[i] * _bytes(costs.selective_workspace_bytes[r])
        for j, (w, c) in enumerate(zip(in_flight(p, v, m, i), mine, strict=True)):
            extra = 0
            if c == 0:
                extra += _bytes(costs.first_activation_bytes[r])
            if c == chunks - 1:
                extra += _bytes(costs.last_activation_bytes[r])
            if j == 0:
                extra += _bytes(costs.every_activation_bytes[r])
            memory += w * (chunk_act(c) + extra)
        model.add(memory <= capacity).only_enforce_if(x)
    step = _ns(costs.step_time_s[r])
    model.add(v * objective >= v * step + (m * v - 1) * g.slowest + sum(g.times)).only_enforce_if(x)


def _symmetry(model: cp_model.CpModel, g: _Group, ms: set[int], single_kind: bool) -> None:
    """Middle stages with the same in-flight counts on every row are interchangeable."""
    if not single_kind or g.vpp != 1:
        return
    for i in range(1, g.pp - 2):
        if all(in_flight(g.pp, 1, m, i) == in_flight(g.pp, 1, m, i + 1) for m in ms):
            model.add(g.bounds[i + 1] - g.bounds[i] >= g.bounds[i + 2] - g.bounds[i + 1])


def _hint_values(g: _Group, plan: StagePlan) -> list[tuple[cp_model.IntVar, int]]:
    out, start = [], 0
    for c, n in enumerate(plan.chunk_layers[:-1]):
        start += n
        out.append((g.bounds[c + 1], start))
    for i, rec in enumerate(plan.recompute):
        if g.sel[i] is not None:
            out.append((g.sel[i], int(rec.mode == "selective")))
        if g.k[i] is not None:
            out.append((g.k[i], rec.num_layers if rec.mode == "full" else 0))
    return out


def _complete_hint(model: cp_model.CpModel, fixes, *, time_limit_s: float) -> bool:
    """Hint every variable: solve once with ``fixes`` assumed (the heuristic's row and plan),
    no objective yet, and hint that whole assignment (CP-SAT does not complete partial hints
    well here). Returns whether the heuristic's plan is a solution of the model."""
    literals = []
    for var, value in fixes:
        literal = model.new_bool_var("")
        model.add(var == value).only_enforce_if(literal)
        literals.append(literal)
    model.add_assumptions(literals)
    solver = make_solver(time_limit_s=time_limit_s)
    status = solver.solve(model)
    model.clear_assumptions()
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return False
    for index in range(len(model.proto.variables)):
        var = model.get_int_var_from_proto_index(index)
        model.add_hint(var, solver.value(var))
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSolution:
    status: str
    """``optimal``, ``feasible``, ``infeasible`` or ``unknown``."""
    layout: Layout | None
    plan: StagePlan | None
    step_time_s: float | None
    bound_s: float | None
    rows_total: int
    rows_kept: int
    candidates: Candidates
    build_s: float
    solve_s: float
    row: int | None = None
    """The outer layout's row in ``candidates.grid`` (``None`` without a layout)."""

    @classmethod
    def without_layout(cls, status: str, start: float) -> StageSolution:
        """No layout: ``infeasible`` before the search, or ``unknown`` when time ran out."""
        return cls(
            status=status,
            layout=None,
            plan=None,
            step_time_s=None,
            bound_s=None,
            rows_total=0,
            rows_kept=0,
            candidates=None,
            build_s=time.perf_counter() - start,
            solve_s=0.0,
        )


def solve_stages(
    problem: Problem,
    ctx: TermContext,
    cost_model: CostModel,
    *,
    time_limit_s: float = 10.0,
    num_workers: int = 1,
    tables: bool = True,
) -> StageSolution:
    """The fastest layout with its per-stage plan, proven optimal when the status says so.
    Models of one layer kind use per-stage tables (``autopar.pipeline.tables``) unless ``tables``
    is false; the others, chunk boundaries and recompute counts. When the time limit runs out
    before the search starts, the status is ``unknown``."""
    return solve_stages_top(
        problem,
        ctx,
        cost_model,
        top=1,
        time_limit_s=time_limit_s,
        num_workers=num_workers,
        tables=tables,
    )[0]


def solve_stages_top(
    problem: Problem,
    ctx: TermContext,
    cost_model: CostModel,
    *,
    top: int,
    time_limit_s: float = 10.0,
    num_workers: int = 1,
    tables: bool = True,
) -> list[StageSolution]:
    """The ``top`` best distinct outer layouts, each with its best per-stage plan, best first
    (``--top`` as ``autopar.search.solver`` reads it for uniform plans: distinct layouts). The k-th
    is the optimum over the outer layouts other than the first k-1: the same search with their
    rows excluded, whose bounds stay valid (each row's bounds are its own). Fewer come back
    when fewer layouts fit or the time limit runs out (a last ``unknown`` entry says so)."""
    start = time.perf_counter()
    deadline = start + time_limit_s
    try:
        space = per_stage_space(problem)
        if not all(space.domains.values()):
            return [StageSolution.without_layout("infeasible", start)]
        cand = candidates(problem, space, ctx, cost_model, deadline=deadline)
    except TimeLimitReached:
        return [StageSolution.without_layout("unknown", start)]
    out: list[StageSolution] = []
    excluded: list[int] = []
    for _ in range(top):
        try:
            solution = _solve_stages(
                ctx,
                space,
                cand,
                modes=allowed_modes(problem),
                num_workers=num_workers,
                tables=tables,
                start=start if not out else time.perf_counter(),
                deadline=deadline,
                excluded=excluded,
            )
        except TimeLimitReached:
            solution = StageSolution.without_layout("unknown", start)
        if out and solution.row is None:
            if solution.status == "unknown":
                out.append(solution)
            break
        out.append(solution)
        if solution.row is None:
            break
        excluded.append(solution.row)
    return out


def _solve_stages(
    ctx: TermContext,
    space: Space,
    cand: Candidates,
    *,
    modes: tuple[str, ...],
    num_workers: int,
    tables: bool,
    start: float,
    deadline: float,
    excluded: Sequence[int],
) -> StageSolution:
    """The best outer layout and plan over the rows of ``cand`` other than ``excluded``."""
    grid = cand.grid
    capacity_float = float(ctx.cluster.usable_memory_bytes)
    out_rows = np.zeros(len(cand.even_s), dtype=bool)
    out_rows[list(excluded)] = True

    def least_upper() -> float:
        even = np.where(out_rows, np.inf, cand.even_s)
        return float(np.min(even)) if len(even) else np.inf

    upper = least_upper()
    lower = np.where(out_rows, np.inf, cand.lower_s)
    keep = np.flatnonzero(np.isfinite(lower) & (lower <= upper * (1 + 1e-9) + 1e-12))
    single_kind = tables and len(set(cand.costs.layer_kinds)) == 1
    windows = tables and not single_kind
    class_of, starts = start_classes(cand.costs.layer_kinds)
    by_group: dict[tuple[int, int], tuple[np.ndarray, list]] = {}
    if single_kind and len(keep):
        # Exact per-stage tables on the rows left: a tighter bound and an exact water-filled
        # plan per row, then prune again.
        for (p, v), index in _groups({"pp": grid["pp"][keep], "vpp": grid["vpp"][keep]}).items():
            check_deadline(deadline)
            rows = keep[index]
            sub = _subset(cand.costs, rows)
            m = np.asarray(grid["grad_accum"][rows], dtype=np.int64)
            stage_tables = [
                stage_table(
                    sub, p=p, v=v, stage=i, num_microbatches=m, modes=modes,
                    capacity_bytes=capacity_float,
                )
                for i in range(p)
            ]  # fmt: skip
            by_group[(p, v)] = (rows, stage_tables)
            bound, plans, steps = _table_bounds(stage_tables, sub, p, v, m)
            lower[rows] = np.maximum(lower[rows], bound)
            better = steps < cand.even_s[rows]
            for j in np.flatnonzero(better):
                cand.even_plans[int(rows[j])] = plans[j]
            cand.even_s[rows] = np.where(better, steps, cand.even_s[rows])
        upper = least_upper()
        keep = np.flatnonzero(np.isfinite(lower) & (lower <= upper * (1 + 1e-9) + 1e-12))
    if windows and len(keep):
        # Exact window tables on the rows left without interleaving: an exact bound on the
        # bottleneck and the best plan under it (dynamic programmes), then prune again.
        for (p, v), index in _groups({"pp": grid["pp"][keep], "vpp": grid["vpp"][keep]}).items():
            if v != 1:
                continue
            check_deadline(deadline)
            rows = keep[index]
            sub = _subset(cand.costs, rows)
            m = np.asarray(grid["grad_accum"][rows], dtype=np.int64)
            window_tables = [
                window_table(
                    sub, p=p, stage=i, num_microbatches=m, modes=modes,
                    capacity_bytes=capacity_float, starts=starts,
                )
                for i in range(p)
            ]  # fmt: skip
            by_group[(p, v)] = (rows, window_tables)
            least = [least_layers(p, 1, i, len(class_of) - 1) for i in range(p)]
            bound, steps, plan_bounds = window_bounds(window_tables, class_of, least, m)
            lower[rows] = np.maximum(lower[rows], sub.step_time_s + bound)
            steps = sub.step_time_s + steps
            for j in np.flatnonzero(steps < cand.even_s[rows]):
                g = _WindowGroup(p, 1, [], [], None, rows, window_tables, class_of)
                cand.even_plans[int(rows[j])] = _window_plan(g, int(rows[j]), plan_bounds[j])
                cand.even_s[int(rows[j])] = steps[j]
        upper = least_upper()
        keep = np.flatnonzero(np.isfinite(lower) & (lower <= upper * (1 + 1e-9) + 1e-12))
    model = cp_model.CpModel()
    vm = VarMap(axes={}, objective=0, memory_kib=0, capacity_kib=0)
    _add_layout(model, space, vm, explain=False)
    x = {int(r): model.new_bool_var(f"row{r}") for r in keep}
    model.add_exactly_one(x.values())
    for axis in GRID_AXES:
        column = grid[axis]
        for value, indicator in vm.indicators[axis].items():
            model.add(sum(x[r] for r in keep if column[r] == value) == indicator)
    costs = cand.costs
    worst_layers = sum(costs.time_s[k].max(axis=1) for k in costs.layer_kinds)
    worst_stage = worst_layers + costs.every_time_s + costs.first_time_s + costs.last_time_s
    ceiling = costs.step_time_s + (grid["grad_accum"] + 1.0) * (
        worst_stage + costs.every_time_s * grid["pp"]
    )
    max_ns = _ns(1.1 * float(np.max(ceiling[keep], initial=1.0)) + 1.0)
    objective = model.new_int_var(0, max_ns, "step_time_ns")
    # The rows' lower bounds as a cut (slightly loosened against rounding).
    model.add(objective >= sum(_ns(lower[r] * (1 - 1e-7)) * x[r] for r in keep))
    kinds_in_order = cand.costs.layer_kinds
    # Coefficients are rounded to whole bytes: the slack keeps every plan that fits in float.
    capacity = int(ctx.cluster.usable_memory_bytes) + CAPACITY_SLACK_BYTES
    groups: dict[tuple[int, int], object] = {}
    best = int(np.argmin(np.where(out_rows, np.inf, cand.even_s))) if np.isfinite(upper) else None
    for (p, v), index in _groups({"pp": grid["pp"][keep], "vpp": grid["vpp"][keep]}).items():
        rows = keep[index]
        if single_kind:
            all_rows, stage_tables = by_group[(p, v)]
            g = _add_table_group(
                model, p, v, rows, all_rows, stage_tables, x, objective, costs, grid, max_ns
            )
            groups[(p, v)] = g
            continue
        if windows and v == 1:
            all_rows, window_tables = by_group[(p, v)]
            groups[(p, v)] = _add_window_group(
                model, p, rows, all_rows, window_tables, class_of, x, objective, costs, grid,
                max_ns,
            )  # fmt: skip
            continue
        g = _add_group(model, p, v, kinds_in_order, modes, max_ns)
        groups[(p, v)] = g
        for r in rows:
            _add_row(
                model, g, costs, int(r), int(grid["grad_accum"][r]), x[int(r)], objective,
                capacity,
            )  # fmt: skip
        _symmetry(
            model, g, {int(grid["grad_accum"][r]) for r in rows}, len(set(kinds_in_order)) == 1
        )
    if best is not None and best in x:
        group = groups[(int(grid["pp"][best]), int(grid["vpp"][best]))]
        plan = cand.even_plans[best]
        if single_kind:
            fixes = [(x[best], 1), *zip(group.n, _stage_counts(plan), strict=True)]
        elif isinstance(group, _WindowGroup):
            starts_of = itertools.accumulate(plan.chunk_layers[:-1])
            fixes = [(x[best], 1), *zip(group.bounds[1:-1], starts_of, strict=True)]
        else:
            fixes = [(x[best], 1), *_hint_values(group, plan)]
        _complete_hint(
            model, fixes, time_limit_s=min(HINT_TIME_S, max(0.0, deadline - time.perf_counter()))
        )
    model.minimize(objective)
    build_s = time.perf_counter() - start
    solver = make_solver(
        time_limit_s=max(0.0, deadline - time.perf_counter()), num_workers=num_workers
    )
    # Times are integer nanoseconds; optimal means within ABSOLUTE_GAP_NS of the bound (the
    # uniform model rounds every table to a microsecond).
    solver.parameters.absolute_gap_limit = ABSOLUTE_GAP_NS
    status = solver.solve(model)
    solve_s = time.perf_counter() - start - build_s
    common = dict(
        rows_total=len(grid["pp"]),
        rows_kept=len(keep),
        candidates=cand,
        build_s=build_s,
        solve_s=solve_s,
    )
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if status != cp_model.INFEASIBLE and best is not None:
            # Out of time with no solution of its own: the heuristic plan stands, unproven.
            layout = Layout.from_grid_row({a: int(grid[a][best]) for a in GRID_AXES})
            plan = cand.even_plans[best]
            return StageSolution(
                status="feasible",
                layout=with_plan_recompute(layout, plan),
                plan=plan,
                step_time_s=float(cand.even_s[best]),
                bound_s=float(np.min(lower[keep])),
                row=best,
                **common,
            )
        name = "infeasible" if status == cp_model.INFEASIBLE else "unknown"
        return StageSolution(
            status=name, layout=None, plan=None, step_time_s=None, bound_s=None, **common
        )
    row = next(r for r in keep if solver.boolean_value(x[int(r)]))
    g = groups[(int(grid["pp"][row]), int(grid["vpp"][row]))]
    if single_kind:
        plan = _table_plan(g, int(row), [int(solver.value(n)) for n in g.n])
    elif isinstance(g, _WindowGroup):
        plan = _window_plan(g, int(row), [int(solver.value(b)) for b in g.bounds])
    else:
        plan = _plan_of(solver, g)
    layout = Layout.from_grid_row({a: int(grid[a][row]) for a in GRID_AXES})
    return StageSolution(
        status="optimal" if status == cp_model.OPTIMAL else "feasible",
        layout=with_plan_recompute(layout, plan),
        plan=plan,
        step_time_s=solver.objective_value / NS_PER_S,
        bound_s=solver.best_objective_bound / NS_PER_S,
        row=int(row),
        **common,
    )


def _plan_of(solver: cp_model.CpSolver, g: _Group) -> StagePlan:
    bounds = [int(solver.value(b)) for b in g.bounds]
    layers = tuple(hi - lo for lo, hi in itertools.pairwise(bounds))
    recompute = []
    for i in range(g.pp):
        if g.sel[i] is not None and solver.boolean_value(g.sel[i]):
            recompute.append(StageRecompute("selective", 0))
            continue
        k = int(solver.value(g.k[i])) if g.k[i] is not None else 0
        # Normalise: no more than the largest chunk of the stage.
        k = min(k, max(layers[c] for c in range(i, g.pp * g.vpp, g.pp)))
        recompute.append(StageRecompute("full", k) if k else StageRecompute("none", 0))
    return StagePlan(pp=g.pp, vpp=g.vpp, chunk_layers=layers, recompute=tuple(recompute))


def solve_result(
    problem: Problem,
    ctx: TermContext,
    cost_model: CostModel,
    *,
    time_limit_s: float,
    num_workers: int,
    top: int = 1,
):
    """``solve_stages_top`` as a ``SolveResult`` (the ``top`` best distinct outer layouts, each
    with its best plan, best first), with an explanation naming the stage that cannot fit when
    nothing does."""
    from autopar.costs.stage_estimate import estimate_plan

    start = time.perf_counter()
    solutions = solve_stages_top(
        problem, ctx, cost_model, top=top, time_limit_s=time_limit_s, num_workers=num_workers
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
            explanation=explain(solution, problem, ctx),
            num_workers=num_workers,
            notes=tuple(notes),
        )
    found = [s for s in solutions if s.plan is not None]
    if len(found) > 1:
        statuses = ", ".join(s.status for s in found[1:])
        notes.append(f"runners-up: the best per-stage plan of each next outer layout ({statuses})")
    if len(found) < top:
        why = "the time limit ran out" if solutions[-1].status == "unknown" else "no more fit"
        notes.append(f"{len(found)} of the {top} layouts asked for: {why}")
    layouts = [estimate_plan(s.layout, s.plan, ctx, cost_model, plan_from="search") for s in found]
    evens = [
        estimate_plan(layout, plan, ctx, cost_model, plan_from="even split")
        for layout, plan in even_alternatives(solution.candidates, problem, ctx)
    ]
    notes += schedule_notes(solution.status, layouts[0], evens)
    if evens and min(e.step_time_s for e in evens) < layouts[0].step_time_s:
        layouts.append(min(evens, key=lambda e: e.step_time_s))
    # Best first by the simulated schedule (the search found them by the formula).
    layouts.sort(key=lambda e: e.step_time_s)
    return SolveResult(
        status=solution.status,
        solve_time_s=time.perf_counter() - start,
        layouts=tuple(layouts),
        best_bound_step_time_s=solution.bound_s,
        num_workers=num_workers,
        notes=tuple(notes),
    )


EVEN_ALTERNATIVES = 4
"""How many of the best even-split plans (by the formula) ``solve_result`` simulates."""


def even_alternatives(
    cand: Candidates, problem: Problem, ctx: TermContext, *, count: int = EVEN_ALTERNATIVES
) -> list[tuple[Layout, StagePlan]]:
    """The ``count`` best outer layouts run with the even split and one recompute on every
    stage (the uniform plans Megatron runs by default), ranked by the schedule formula: the
    alternatives ``solve_result`` simulates next to the per-stage optimum."""
    capacity = float(ctx.cluster.usable_memory_bytes)
    num_layers = problem.model.num_layers
    modes = allowed_modes(problem)
    found: list[tuple[float, int, StagePlan]] = []
    for (p, v), index in _groups(cand.grid).items():
        sub = _subset(cand.costs, index)
        m = cand.grid["grad_accum"][index]
        for rec in _uniform_recomputes(modes, -(-num_layers // (p * v))):
            plan = even_plan(num_layers, p, v, rec)
            figures = stage_figures(plan, sub, m)
            fits = figures.memory_bytes.max(axis=1) <= capacity
            step = np.where(fits, figures.step_time_s, np.inf)
            for j in np.argsort(step)[:count]:
                if np.isfinite(step[j]):
                    found.append((float(step[j]), int(index[j]), plan))
    best: dict[int, tuple[float, StagePlan]] = {}
    for step, row, plan in sorted(found, key=lambda f: f[0]):
        best.setdefault(row, (step, plan))
    out = []
    for row, (_, plan) in list(best.items())[:count]:
        layout = Layout.from_grid_row({a: int(cand.grid[a][row]) for a in GRID_AXES})
        out.append((with_plan_recompute(layout, plan), plan))
    return out


def schedule_notes(status: str, best, evens: Sequence) -> list[str]:
    """What the search proved and what the simulated schedule gives: the search ranks plans by
    the schedule formula (``autopar.costs.stage_figures.pipeline_time_s``), exact only for equal
    stages; the estimates are Megatron's schedule simulated (``autopar.costs.schedule``)."""
    proof = "proven optimal" if status == "optimal" else status
    notes = [
        f"ranked by the schedule formula ({proof} for it): {best.formula_step_time_s:.3f} s; "
        f"Megatron's schedule simulated: {best.step_time_s:.3f} s"
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


def explain(solution: StageSolution, problem: Problem, ctx: TermContext) -> Explanation:
    """Why no per-stage plan fits: the outer layout and plan whose fullest stage comes closest,
    which stage that is, and what it would need."""
    cand = solution.candidates
    capacity = float(ctx.cluster.usable_memory_bytes)
    if cand is None or solution.status == "unknown" or not len(cand.even_peak_bytes):
        text = (
            "the time limit ran out before any plan was found; raise --time-limit"
            if solution.status == "unknown"
            else "the layout rules leave no outer layout (see the uniform explanation)"
        )
        return Explanation(summary=text, cut_short=solution.status == "unknown")
    row = int(np.argmin(cand.even_peak_bytes))
    plan = cand.even_peak_plans[row]
    layout = Layout.from_grid_row({a: int(cand.grid[a][row]) for a in GRID_AXES})
    costs = _subset(cand.costs, np.array([row]))
    figures = stage_figures(plan, costs, cand.grid["grad_accum"][row : row + 1])
    stage = int(np.argmax(figures.memory_bytes[0]))
    need = float(figures.memory_bytes[0, stage])
    gib = 2**30
    flights = sum(in_flight(plan.pp, plan.vpp, int(layout.grad_accum), stage))
    summary = (
        f"no per-stage plan fits: at best (layout {with_plan_recompute(layout, plan).text()}, "
        f"{plan.recompute[stage].text()} "
        f"recompute on every stage) stage {stage} of {plan.pp} holds "
        f"{plan.stage_layers(stage)} layers and {flights} chunk micro-batches in flight "
        f"and needs {need / gib:.1f} GiB, "
        f"{(need - capacity) / gib:.1f} GiB over the {capacity / gib:.1f} GiB capacity"
    )
    miss = NearestMiss(
        min_memory_bytes=need,
        capacity_bytes=capacity,
        layout=with_plan_recompute(layout, plan).to_dict(),
        stage=stage,
        stage_layers=plan.stage_layers(stage),
    )
    return Explanation(summary=summary, nearest_miss=miss)


# --- one layer kind: the plan is the layer count of every stage ------------------------------


@dataclass(slots=True)
class _TableGroup:
    """``(pp, vpp)`` with tables: layer counts ``n`` per stage and the row of the group."""

    pp: int
    vpp: int
    n: list
    times: list
    slowest: cp_model.IntVar
    rows: np.ndarray
    """Global row indices of the tables' rows."""
    tables: list[StageTable]


def _row_selector(model, name: str, rows, all_rows, x):
    """(an integer naming which of ``rows`` is chosen, by its index in ``all_rows``, -1 when
    none is, tied to the layouts' booleans ``x``; that index of each row)."""
    local = {int(r): j for j, r in enumerate(all_rows)}
    row_var = model.new_int_var(-1, len(all_rows) - 1, f"{name}.row")
    for r in rows:
        model.add(row_var == local[int(r)]).only_enforce_if(x[int(r)])
    model.add(row_var == -1).only_enforce_if([x[int(r)].Not() for r in rows])
    return row_var, local


def _add_table_group(
    model, p, v, rows, all_rows, stage_tables, x, objective, costs, grid, max_ns
) -> _TableGroup:
    """Stage ``i`` takes ``n_i`` layers and its time is its table's entry for the chosen row
    (an allowed-assignments table over (row, n_i, T_i)); the bottleneck by
    ``add_max_equality``; the objective per row under its boolean."""
    num_layers = len(costs.layer_kinds)
    name = f"pp{p}v{v}"
    row_var, local = _row_selector(model, name, rows, all_rows, x)
    n = []
    for i in range(p):
        least = least_layers(p, v, i, num_layers)
        n.append(model.new_int_var(least, num_layers, f"{name}.n{i}"))
    model.add(sum(n) == num_layers)
    times = [model.new_int_var(0, max_ns, f"{name}.T{i}") for i in range(p)]
    for i, table in enumerate(stage_tables):
        tuples = [(-1, k, 0) for k in range(num_layers + 1)]
        for r in rows:
            j = local[int(r)]
            finite = np.flatnonzero(np.isfinite(table.time_s[j]))
            tuples += [(j, int(k), _ns(table.time_s[j, k])) for k in finite]
        model.add_allowed_assignments([row_var, n[i], times[i]], tuples)
    slowest = model.new_int_var(0, max_ns, f"{name}.Tmax")
    model.add_max_equality(slowest, times)
    for r in rows:
        m = int(grid["grad_accum"][r])
        step = _ns(costs.step_time_s[r])
        model.add(v * objective >= v * step + (m * v - 1) * slowest + sum(times)).only_enforce_if(
            x[int(r)]
        )
    # Middle stages whose tables agree on every row are interchangeable: order their counts.
    for i in range(1, p - 2):
        a, b = stage_tables[i].time_s, stage_tables[i + 1].time_s
        if np.array_equal(a, b):
            model.add(n[i] >= n[i + 1])
    return _TableGroup(p, v, n, times, slowest, all_rows, stage_tables)


def _table_bounds(stage_tables: list[StageTable], costs: StageCosts, p, v, m):
    """Per row: a lower bound (the least possible slowest stage, by water-filling the exact
    tables, and the time of every layer without recompute), and the plan of the water-filled
    counts with its step time (an upper bound)."""
    num_layers = len(costs.layer_kinds)
    rows = len(m)
    times = [t.time_s for t in stage_tables]
    least = [least_layers(p, v, i, num_layers) for i in range(p)]
    lo, _, most = _water_fill(times, least, num_layers, _most)
    counts = np.stack(most, axis=1)
    feasible = counts.sum(axis=1) >= num_layers
    kind = costs.layer_kinds[0]
    total = (
        num_layers * costs.time_s[kind][:, 0]
        + p * costs.every_time_s
        + costs.first_time_s
        + costs.last_time_s
    )
    bound = np.where(feasible, costs.step_time_s + (m - 1.0 / v) * lo + total / v, np.inf)
    plans: list[StagePlan | None] = [None] * rows
    steps = np.full(rows, np.inf)
    for r in np.flatnonzero(feasible):
        n = list(counts[r])
        surplus = sum(n) - num_layers
        for i in range(p):
            cut = min(surplus, n[i] - least[i])
            n[i] -= cut
            surplus -= cut
        stage_t = np.array([[times[i][r, n[i]] for i in range(p)]])
        if not np.isfinite(stage_t).all():
            continue
        steps[r] = costs.step_time_s[r] + pipeline_time_s(stage_t, m[r : r + 1], v)[0]
        plans[r] = _plan_from_tables(stage_tables, r, n, p, v)
    return bound, plans, steps


def _most(times: np.ndarray, tau: np.ndarray, least: int) -> np.ndarray:
    """Most layers a stage holds within ``tau`` (a large negative number below ``least``)."""
    index = np.arange(times.shape[1])
    most = np.max(np.where(times <= tau[:, None], index, -1), axis=1)
    return np.where(most >= least, most, -(10**9))


def _plan_from_tables(stage_tables: list[StageTable], row: int, n, p: int, v: int) -> StagePlan:
    chunks = [0] * (p * v)
    recompute = []
    for i, table in enumerate(stage_tables):
        for j, layers in enumerate(table.chunks(row, int(n[i]))):
            chunks[j * p + i] = layers
        recompute.append(table.recompute(row, int(n[i])))
    return StagePlan(pp=p, vpp=v, chunk_layers=tuple(chunks), recompute=tuple(recompute))


def _table_plan(g: _TableGroup, row: int, n) -> StagePlan:
    local = int(np.flatnonzero(g.rows == row)[0])
    return _plan_from_tables(g.tables, local, n, g.pp, g.vpp)


def _stage_counts(plan: StagePlan) -> list[int]:
    return [plan.stage_layers(i) for i in range(plan.pp)]


# --- no interleaving, several layer kinds: the plan is the first layer of every stage ---------


@dataclass(slots=True)
class _WindowGroup:
    """``(pp, 1)`` with window tables: stage boundaries ``b`` and the rows of the tables."""

    pp: int
    vpp: int
    bounds: list
    times: list
    slowest: cp_model.IntVar
    rows: np.ndarray
    tables: list[WindowTable]
    class_of: tuple[int, ...]


def _add_window_group(
    model, p, rows, all_rows, tables, class_of, x, objective, costs, grid, max_ns
) -> _WindowGroup:
    """Stage ``i`` holds layers ``[b_i, b_{i+1})``; its time is its table's entry for the chosen
    row, the class of ``b_i`` and ``b_{i+1} - b_i`` (an allowed-assignments table over (row,
    class, n_i, T_i)); the bottleneck by ``add_max_equality``; the objective per row under its
    boolean."""
    num_layers = len(costs.layer_kinds)
    name = f"pp{p}w"
    row_var, local = _row_selector(model, name, rows, all_rows, x)
    b = [model.new_constant(0)]
    b += [model.new_int_var(0, num_layers, f"{name}.b{i}") for i in range(1, p)]
    b.append(model.new_constant(num_layers))
    classes = max(class_of) + 1
    times = [model.new_int_var(0, max_ns, f"{name}.T{i}") for i in range(p)]
    for i, table in enumerate(tables):
        n_i = model.new_int_var(least_layers(p, 1, i, num_layers), num_layers, f"{name}.n{i}")
        model.add(n_i == b[i + 1] - b[i])
        c_i = model.new_int_var(0, classes - 1, f"{name}.c{i}")
        model.add_element(b[i], list(class_of), c_i)
        tuples = [(-1, c, k, 0) for c in range(classes) for k in range(num_layers + 1)]
        for r in rows:
            j = local[int(r)]
            finite = np.argwhere(np.isfinite(table.time_s[j]))
            tuples += [(j, int(c), int(k), _ns(table.time_s[j, c, k])) for c, k in finite]
        model.add_allowed_assignments([row_var, c_i, n_i, times[i]], tuples)
    slowest = model.new_int_var(0, max_ns, f"{name}.Tmax")
    model.add_max_equality(slowest, times)
    for r in rows:
        m = int(grid["grad_accum"][r])
        step = _ns(costs.step_time_s[r])
        model.add(objective >= step + (m - 1) * slowest + sum(times)).only_enforce_if(x[int(r)])
    return _WindowGroup(p, 1, b, times, slowest, all_rows, tables, class_of)


def _window_plan(g: _WindowGroup, row: int, bounds: list[int]) -> StagePlan:
    local = int(np.flatnonzero(g.rows == row)[0])
    layers = tuple(hi - lo for lo, hi in itertools.pairwise(bounds))
    recompute = tuple(
        table.recompute(local, g.class_of[bounds[i]], layers[i]) for i, table in enumerate(g.tables)
    )
    return StagePlan(pp=g.pp, vpp=1, chunk_layers=layers, recompute=recompute)
