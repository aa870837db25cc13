"""The outer rows of a per-stage search, each with its costs, a lower bound on its best plan and
the best heuristic plan found (an upper bound); the search prunes rows between the two
(``autopar.pipeline.search``).

The space: the layout rules with the even-split rule (``layers vs PP``) replaced by ``pp*vpp <=
layers + 2`` (every chunk but the first and the last holds a layer; Megatron's
``pipeline_parallel_layer_layout.py`` lets the embedding and the loss stand alone), and one
``recompute`` value: the plan carries each stage's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from autopar.base.axes import AXIS, GRID_AXES
from autopar.base.deadline import check_deadline
from autopar.costs.stage_costs import StageCosts, probe_stage_costs
from autopar.costs.stage_figures import pipeline_time_s, stage_totals
from autopar.costs.terms import CostModel, TermContext
from autopar.inputs.specs import Problem
from autopar.layout.rules import layout_rules
from autopar.layout.space import Space, space_of
from autopar.layout.stages import StagePlan, StageRecompute, even_plan, placed_chunks
from autopar.pipeline.encoding import Bounds, PlanContext, Shape, least_layers, shapes_of
from autopar.pipeline.lower_bound import balanced_bound, lower_bound

SPLIT_FAMILY = "layers vs PP"
HEURISTIC_OPTIONS = 12
"""Recompute options the heuristic plans try per stage (full counts spaced geometrically)."""


def per_stage_space(problem: Problem) -> Space:
    """The space of ``problem`` for per-stage plans (module docstring)."""
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
    """The outer rows (``ctx.grid``), their costs, their bounds with the best heuristic plan of
    each, and the plan of least peak memory of each (for explanations)."""

    ctx: PlanContext
    bounds: Bounds
    """Lower bounds and, as upper bounds, the best heuristic plans (``inf`` where none fits)."""
    peak_bytes: np.ndarray
    """Smallest peak stage memory over the heuristic plans of each row."""
    peak_plans: tuple[StagePlan | None, ...]
    plan_steps: Mapping[tuple[Shape, StagePlan], tuple[np.ndarray, np.ndarray]]
    """Over every row of a shape, the step (by the formula) and the peak stage bytes of each
    uniform-recompute plan the heuristics scored there (the even splits among them), so that
    ``autopar.pipeline.result.even_alternatives`` need not score them again."""

    @property
    def grid(self) -> Mapping[str, np.ndarray]:
        return self.ctx.grid

    @property
    def costs(self) -> StageCosts:
        return self.ctx.costs


def uniform_recomputes(modes: tuple[str, ...], max_chunk: int) -> list[StageRecompute]:
    """Every recompute one stage may take: none, selective, full for 1..``max_chunk`` layers."""
    out = []
    if "none" in modes:
        out.append(StageRecompute("none", 0))
    if "selective" in modes:
        out.append(StageRecompute("selective", 0))
    if "full" in modes:
        out += [StageRecompute("full", k) for k in range(1, max_chunk + 1)]
    return out


class _Heuristics:
    """The best heuristic plan and the least peak memory of every row, as they are found
    (``candidates`` freezes them)."""

    def __init__(self, ctx: PlanContext) -> None:
        size = len(ctx.grid["pp"])
        self.ctx = ctx
        self.best_s = np.full(size, np.inf)
        self.peak = np.full(size, np.inf)
        self.plans: list[StagePlan | None] = [None] * size
        self.peak_plans: list[StagePlan | None] = [None] * size
        self.plan_steps: dict[tuple[Shape, StagePlan], tuple[np.ndarray, np.ndarray]] = {}

    def consider(
        self,
        index: np.ndarray,
        layers: tuple[int, ...],
        shape: Shape,
        *,
        whole: bool = False,
        sub: StageCosts | None = None,
    ) -> None:
        """The plan with chunk layers ``layers`` and the cheapest recompute per stage that
        fits, on the rows ``index`` (``whole``: every row of ``shape``, whose uniform plans'
        steps are then kept in ``plan_steps``; ``sub``: the costs of those rows, if taken)."""
        p, v, modes = shape.pp, shape.vpp, self.ctx.modes
        sub = self.ctx.costs.take(index) if sub is None else sub
        m = self.ctx.microbatches(index)
        keep = self.plan_steps if whole else None
        step, recompute, most = _best_recompute(layers, shape, sub, m, self.ctx, keep=keep)
        better = step < self.best_s[index]
        made: dict[tuple, StagePlan] = {}
        for j in np.flatnonzero(better):
            rec = recompute[j]
            if rec not in made:
                made[rec] = StagePlan(
                    pp=p, vpp=v, chunk_layers=layers, recompute=rec, placement=shape.placement
                )
            self.plans[index[j]] = made[rec]
        self.best_s[index] = np.where(better, step, self.best_s[index])
        lower_peak = most < self.peak[index]
        saving = StagePlan(
            pp=p,
            vpp=v,
            chunk_layers=layers,
            recompute=(_most_saving(modes, layers),) * p,
            placement=shape.placement,
        )
        for r in index[lower_peak]:
            self.peak_plans[r] = saving
        self.peak[index] = np.minimum(self.peak[index], most)


def candidates(
    problem: Problem,
    space: Space,
    ctx: TermContext,
    cost_model: CostModel,
    *,
    deadline: float | None = None,
) -> Candidates:
    """Every outer row with its costs, lower bound and best heuristic plan.

    Heuristic plans: the even split, then, on the rows whose lower bound beats the best plan so
    far, the water-filled stage layer counts of the bound; each spread over the stage's chunks
    with the fewest layers where the most micro-batches are in flight, and each stage given the
    cheapest recompute that fits (exact for given layer counts: stages fit independently)."""
    grid = space.pruned_grid(GRID_AXES)
    costs = probe_stage_costs(cost_model, ctx, grid, deadline=deadline)
    plan_ctx = PlanContext(
        grid=grid,
        costs=costs,
        modes=allowed_modes(problem),
        capacity_bytes=float(ctx.cluster.usable_memory_bytes),
    )
    found = _Heuristics(plan_ctx)
    lower = np.full(len(grid["pp"]), np.inf)
    shapes = shapes_of(grid)
    for shape, index in shapes.items():
        check_deadline(deadline)  # --time-limit covers the plan search (issue 15)
        lower[index] = _even_plans(found, shape, index)
    bound = float(np.min(found.best_s)) if len(lower) else np.inf
    for shape, index in shapes.items():
        check_deadline(deadline)
        # The water-filling bound where the balanced one does not already rule the row out.
        open_rows = index[lower[index] <= bound * (1 + 1e-9)]
        if len(open_rows):
            lower[open_rows] = _water_filled_plans(found, shape, open_rows, lower, bound)
    bounds = Bounds.of(lower, found.best_s, found.plans)
    peak = np.array(found.peak)
    peak.flags.writeable = False
    return Candidates(
        ctx=plan_ctx,
        bounds=bounds,
        peak_bytes=peak,
        peak_plans=tuple(found.peak_plans),
        plan_steps=MappingProxyType(found.plan_steps),
    )


def _even_plans(found: _Heuristics, shape: Shape, index: np.ndarray) -> np.ndarray:
    """Consider the even split (and, with several layer kinds, the balanced one) on the rows of
    ``shape``; returns their balanced lower bound."""
    ctx, p, v = found.ctx, shape.pp, shape.vpp
    m = ctx.microbatches(index)
    even = even_plan(ctx.num_layers, p, v, StageRecompute(), shape.placement)
    counts = tuple(even.stage_layers(i) for i in range(p))
    sub = ctx.costs.take(index)  # the rows' costs, taken once for every use below
    found.consider(index, _spread(counts, shape, int(m[0])), shape, whole=True, sub=sub)
    if len(set(ctx.costs.layer_kinds)) > 1:
        balanced = _balanced_counts(sub, shape)
        if balanced != counts:
            found.consider(index, _spread(balanced, shape, int(m[0])), shape, whole=True, sub=sub)
    return balanced_bound(sub, shape, m)


def _water_filled_plans(
    found: _Heuristics, shape: Shape, open_rows: np.ndarray, lower: np.ndarray, bound: float
) -> np.ndarray:
    """The water-filling lower bound of ``open_rows`` (at least their ``lower``), after
    considering the plans of its stage counts where it beats ``bound``."""
    ctx = found.ctx
    m = ctx.microbatches(open_rows)
    tight, split = lower_bound(ctx.costs.take(open_rows), shape, m, ctx.modes, ctx.capacity_bytes)
    tight = np.maximum(lower[open_rows], tight)
    vectors: dict[tuple[int, ...], list[int]] = {}
    for j in np.flatnonzero(tight < bound * (1 + 1e-9)):
        n = _trim([int(c[j]) for c in split], shape, ctx.num_layers)
        if n is not None:
            vectors.setdefault(n, []).append(int(j))
    for n, rows in vectors.items():
        chosen = open_rows[np.array(rows)]
        found.consider(chosen, _spread(n, shape, int(ctx.microbatches(chosen)[0])), shape)
    return tight


def _balanced_counts(costs: StageCosts, shape: Shape) -> tuple[int, ...]:
    """Stage layer counts that minimise the slowest stage without recompute, for the first
    row's per-layer times (layers of several kinds; a linear-partition dynamic programme over
    stages in order, exact for one chunk per stage and a heuristic otherwise)."""
    p, v, last = shape.pp, shape.vpp, shape.last_stage
    kinds = costs.layer_kinds
    num_layers = len(kinds)
    layer_t = np.array([costs.time_s[k][0, 0] for k in kinds])
    prefix = np.concatenate([[0.0], np.cumsum(layer_t)])
    fixed = [
        float(costs.every_time_s[0])
        + (float(costs.first_time_s[0]) if i == 0 else 0.0)
        + (float(costs.last_time_s[0]) if i == last else 0.0)
        for i in range(p)
    ]
    least = [least_layers(p, v, i, num_layers, shape.placement) for i in range(p)]
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


def _most_saving(modes, layers) -> StageRecompute:
    if "full" in modes:
        return StageRecompute("full", max(layers))
    return StageRecompute("selective", 0) if "selective" in modes else StageRecompute()


def _trim(n: list[int], shape: Shape, num_layers: int) -> tuple[int, ...] | None:
    """Water-filled stage counts cut down to the layer count (from the first stage on, which
    holds the most micro-batches in flight), or ``None`` when they do not reach it."""
    if min(n) < 0 or sum(n) < num_layers:
        return None
    p, v = shape.pp, shape.vpp
    least = [least_layers(p, v, i, num_layers, shape.placement) for i in range(p)]
    surplus = sum(n) - num_layers
    for i in range(p):
        cut = min(surplus, n[i] - least[i])
        n[i] -= cut
        surplus -= cut
    return tuple(n)


def _spread(counts: Sequence[int], shape: Shape, m: int) -> tuple[int, ...]:
    """Chunk layer counts from stage counts: a stage's chunks differ by at most one layer, the
    extra layers where the fewest micro-batches are in flight; the first chunk (with the
    embedding) holds none when the stage's other chunks can take its layers."""
    p, v = shape.pp, shape.vpp
    chunk = [0] * (p * v)
    for i, n in enumerate(counts):
        mine = list(placed_chunks(p, v, i, shape.placement))
        weights = shape.schedule.in_flight(p, v, m, i)
        if i == 0 and v > 1 and n >= v - 1:
            mine, weights = mine[1:], weights[1:]
        base, extra = divmod(n, len(mine))
        order = sorted(range(len(mine)), key=lambda j: (weights[j], -j))
        for rank, j in enumerate(order):
            chunk[mine[j]] = base + (1 if rank < extra else 0)
    return tuple(chunk)


def _best_recompute(layers, shape: Shape, costs: StageCosts, m, ctx: PlanContext, *, keep=None):
    """For chunk layer counts ``layers``: per row, the step time with each stage's cheapest
    recompute that fits (inf when a stage fits with none), the recompute per stage, and the
    smallest peak memory reachable; ``keep`` (a dict) takes each uniform plan's step and peak
    stage bytes per row."""
    p, v = shape.pp, shape.vpp
    max_chunk = max(layers)
    options = uniform_recomputes(ctx.modes, max_chunk)
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
        plan = StagePlan(
            pp=p,
            vpp=v,
            chunk_layers=tuple(layers),
            recompute=(rec,) * p,
            placement=shape.placement,
        )
        fig = stage_totals(plan, costs, m, schedule=shape.schedule)
        if keep is not None:
            keep[(shape, plan)] = (fig.step_time_s, fig.memory_bytes.max(axis=1))
        fits = fig.memory_bytes <= ctx.capacity_bytes
        take = fits & (fig.time_s < best_t)
        best_t = np.where(take, fig.time_s, best_t)
        choice = np.where(take, o, choice)
        least_memory = np.minimum(least_memory, fig.memory_bytes.max(axis=1))
    feasible = np.isfinite(best_t).all(axis=1)
    step = np.full(rows, np.inf)
    if feasible.any():
        step[feasible] = costs.step_time_s[feasible] + pipeline_time_s(
            best_t[feasible], m[feasible], v, schedule=shape.schedule
        )
    distinct, which = np.unique(choice, axis=0, return_inverse=True)
    per_choice = [tuple(options[c] for c in row) for row in distinct]
    recompute = [per_choice[j] for j in np.ravel(which)]
    return step, recompute, least_memory
