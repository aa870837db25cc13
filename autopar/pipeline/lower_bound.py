"""Lower bounds on the best per-stage plan of each outer row, before any table or CP-SAT model
(``autopar.pipeline.candidates`` prunes the rows with them).

- balanced: no recompute, perfect balance, ``sum_i T_i >= S`` and ``max_i T_i >= S / p``;
- water-filled: a lower bound ``t_i(h, n)`` on stage ``i``'s time holding ``n`` layers, ``h``
  of them of the minor kinds (``_stage_time_of_layers``), and the least bottleneck ``tau`` at
  which the stages can hold every layer, sharing the model's minor layers (``_mix_fill``).

Both go through the shape's schedule closed form (``PipelineSchedule.pipeline_s``), which is
non-decreasing in ``max_i T_i`` and ``sum_i T_i``, so bounds on those bound the step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

from autopar.costs.stage_costs import StageCosts
from autopar.pipeline.encoding import CAPACITY_SLACK_BYTES, Shape, least_layers

BISECTIONS = 24
"""Bisection steps of the water-filling bound (any number gives a valid bound; 24 give a
relative precision of 6e-8 of the largest stage time)."""
MAX_KIND_MIXES = 64
"""Kind mixes (minor kind counts and their recomputed counts) the lower bound enumerates
per stage; beyond, every layer is priced at the cheapest kind."""
TOO_FEW = -(10**9)
"""What ``max_layers`` / ``most_layers`` answer for a stage that cannot hold its least count."""


def least_total_s(costs: StageCosts, p: int) -> np.ndarray:
    """``sum_i T_i`` without recompute: every layer once, the fixed parts of every stage."""
    kinds = costs.layer_kinds
    layers = sum(kinds.count(k) * costs.time_s[k][:, 0] for k in dict.fromkeys(kinds))
    return layers + p * costs.every_time_s + costs.first_time_s + costs.last_time_s


def balanced_bound(costs: StageCosts, shape: Shape, m: np.ndarray) -> np.ndarray:
    """A lower bound on each row's step time: no recompute, perfect balance
    (``max_i T_i >= sum_i T_i / p``)."""
    total = least_total_s(costs, shape.pp)
    return costs.step_time_s + shape.schedule.pipeline_s(
        total / shape.pp, total, m, pp=shape.pp, vpp=shape.vpp
    )


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


def _major_costs(costs: StageCosts):
    """(minor kinds, (minor counts, recomputed counts) pairs, the count the major kind may
    reach, and its time, activation and static arrays): ``_kind_mixes``, or every layer
    priced at the cheapest kind term by term when there are too many mixes."""
    mixes = _kind_mixes(costs.layer_kinds)
    if mixes is None:
        kinds = tuple(dict.fromkeys(costs.layer_kinds))
        arrays = [
            np.min([table[k] for k in kinds], axis=0)
            for table in (costs.time_s, costs.activation_bytes, costs.static_bytes)
        ]
        return [], [((), ())], len(costs.layer_kinds), arrays
    major, cap_major, minors, pairs = mixes
    arrays = [costs.time_s[major], costs.activation_bytes[major], costs.static_bytes[major]]
    return minors, pairs, cap_major, arrays


def _stage_ends(costs: StageCosts, stage: int, p: int, last: int):
    """(time, static bytes, activation bytes) outside the layers of ``stage`` (``last``: the
    rank holding the last chunk, ``Shape.last_stage``)."""
    ends = [costs.every_time_s, costs.every_static_bytes, costs.every_activation_bytes]
    if stage == 0:
        first = (costs.first_time_s, costs.first_static_bytes, costs.first_activation_bytes)
        ends = [e + f for e, f in zip(ends, first, strict=True)]
    if stage == last:
        last_ends = (costs.last_time_s, costs.last_static_bytes, costs.last_activation_bytes)
        ends = [e + f for e, f in zip(ends, last_ends, strict=True)]
    return ends


def _mix_options(costs, held, done, minors, major, c, w, ends, modes, capacity):
    """(time, memory or ``None`` when it fits by construction) of each recompute choice of a
    stage holding ``c`` major-kind layers and ``held`` minor ones (``done`` of them recomputed
    fully), over rows x layer counts (``_stage_time_of_layers``)."""
    t, a, s = major
    fixed_t, fixed_s, fixed_a = ends
    tk = [costs.time_s[k] for k in minors]
    ak = [costs.activation_bytes[k] for k in minors]
    time0 = (
        fixed_t[:, None] + c * t[:, 0:1] + sum(h * x[:, 0:1] for h, x in zip(held, tk, strict=True))
    )
    static = (
        (fixed_s + w[:, 0] * fixed_a)[:, None]
        + c * s[:, None]
        + sum(h * costs.static_bytes[k][:, None] for h, k in zip(held, minors, strict=True))
    )

    def acts(code):
        return c * a[:, code : code + 1] + sum(
            h * x[:, code : code + 1] for h, x in zip(held, ak, strict=True)
        )

    options = []
    if not any(done):
        if "none" in modes:
            options.append((time0, static + w * acts(0)))
        if "selective" in modes:
            extra = c * (t[:, 1:2] - t[:, 0:1]) + sum(
                h * (x[:, 1:2] - x[:, 0:1]) for h, x in zip(held, tk, strict=True)
            )
            memory = static + costs.selective_workspace_bytes[:, None] + w * acts(1)
            options.append((time0 + extra, memory))
    if "full" in modes and ("none" in modes or tuple(done) == tuple(held)):
        saved_minor = sum(r * (x[:, 0:1] - x[:, 2:3]) for r, x in zip(done, ak, strict=True))
        over = static + costs.full_workspace_bytes[:, None] + w * (acts(0) - saved_minor) - capacity
        per_layer = w * (a[:, 0:1] - a[:, 2:3])
        need = np.ceil(np.maximum(over, 0.0) / np.where(per_layer > 0, per_layer, np.inf) - 1e-9)
        need = np.where((over > 0) & ~(per_layer > 0), np.inf, need)
        need = np.maximum(need, 0.0 if sum(done) else 1.0)
        if "none" not in modes:
            need = np.where(need <= c, c, need)
        extra = need * (t[:, 2:3] - t[:, 0:1]) + sum(
            r * (x[:, 2:3] - x[:, 0:1]) for r, x in zip(done, tk, strict=True)
        )
        options.append((np.where(need <= c, time0 + extra, np.inf), None))
    return options


def _stage_time_of_layers(costs: StageCosts, shape: Shape, m: np.ndarray, modes, capacity: float):
    """Per stage ``i`` and minor-kind counts ``h`` (``_kind_mixes``), ``t_i(h, n)`` (rows x
    ``n``): a lower bound on the time of one micro-batch on stage ``i`` holding ``n`` layers,
    ``h`` of them of the minor kinds, over every plan; and the model's count of each minor
    kind. Relaxations: the stage may hold any mix of kinds the model has (not only what
    consecutive chunks give), its activations are weighed by its smallest in-flight count,
    and full recompute may pick any of its layers (not the first ``k`` of each chunk); each
    mix takes its cheapest recompute that fits. With too many kind mixes every layer is
    priced at the cheapest kind, term by term. ``t_i`` is made non-decreasing in ``n`` (a
    minimum over ``n' >= n``, still a bound), as the water-filling needs."""
    p, v = shape.pp, shape.vpp
    num_layers = len(costs.layer_kinds)
    minors, pairs, cap_major, major = _major_costs(costs)
    n = np.arange(num_layers + 1, dtype=np.float64)[None, :]
    distinct = np.unique(m)
    out = []
    for i in range(p):
        flights = [min(shape.schedule.in_flight(p, v, int(mm), i)) for mm in distinct]
        w = np.array(flights, dtype=float)[np.searchsorted(distinct, m)][:, None]
        ends = _stage_ends(costs, i, p, shape.last_stage)
        by_held: dict[tuple[int, ...], np.ndarray] = {}
        for held, done in pairs:
            best = by_held.setdefault(held, np.full((len(m), num_layers + 1), np.inf))
            c = n - sum(held)  # layers of the major kind (rows broadcast)
            valid = (c >= 0) & (c <= cap_major)
            options = _mix_options(costs, held, done, minors, major, c, w, ends, modes, capacity)
            for time_s, memory in options:
                ok = valid if memory is None else valid & (memory <= capacity)
                np.minimum(best, np.where(ok, time_s, np.inf), out=best)
        # non-decreasing in n: the least over n' >= n
        out.append(
            {h: np.minimum.accumulate(b[:, ::-1], axis=1)[:, ::-1] for h, b in by_held.items()}
        )
    caps = tuple(costs.layer_kinds.count(k) for k in minors)
    return out, caps


def lower_bound(costs: StageCosts, shape: Shape, m: np.ndarray, modes, capacity: float):
    """A lower bound on each row's step time over all plans, and stage layer counts near its
    ``max`` term (for the heuristic plans): ``max_i T_i >= tau``, the least ``tau`` at which the
    stages can take all layers, and all layers of each minor kind between them, with
    ``t_i(h_i, n_i) <= tau`` (``_mix_fill``); ``sum_i T_i`` is at least the time of every layer
    without recompute."""
    p, v = shape.pp, shape.vpp
    num_layers = len(costs.layer_kinds)
    tables, caps = _stage_time_of_layers(costs, shape, m, modes, capacity + CAPACITY_SLACK_BYTES)
    least_n = [least_layers(p, v, i, num_layers, shape.placement) for i in range(p)]
    lo, feasible = _mix_fill(tables, caps, least_n, num_layers)
    cheapest = [np.min(list(t.values()), axis=0) for t in tables]
    _, _, counts = water_fill(cheapest, least_n, num_layers, max_layers)
    total = least_total_s(costs, p)
    slowest = np.maximum(lo, total / p)
    bound = costs.step_time_s + shape.schedule.pipeline_s(slowest, total, m, pp=p, vpp=v)
    return np.where(feasible, bound, np.inf), counts


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


def water_fill(
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


def max_layers(times: np.ndarray, tau: np.ndarray, least: int) -> np.ndarray:
    """Most layers a stage can hold within ``tau`` (``t_i(n)`` grows with ``n``), or
    ``TOO_FEW`` when not even ``least``."""
    most = (times <= tau[:, None]).sum(axis=1) - 1
    return np.where(most >= least, most, TOO_FEW)


def most_layers(times: np.ndarray, tau: np.ndarray, least: int) -> np.ndarray:
    """Most layers a stage holds within ``tau`` (``t_i(n)`` in any order), or ``TOO_FEW``
    below ``least``."""
    index = np.arange(times.shape[1])
    most = np.max(np.where(times <= tau[:, None], index, -1), axis=1)
    return np.where(most >= least, most, TOO_FEW)
