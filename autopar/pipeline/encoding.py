"""How the plans of one pipeline shape enter the per-stage search: the ``StageEncoding`` protocol
that its three encodings implement (``autopar.pipeline.tables``: per-stage tables, one layer
kind; ``autopar.pipeline.windows``: window tables, several kinds without interleaving;
``autopar.pipeline.boundary``: chunk boundaries and recompute counts, the rest), the per-row
bounds they tighten (``Bounds``), and their link to the layout model (``RowLink``).

A shape is ``(pp, vpp, schedule)``: every outer row of a shape has the same number of stages and
chunks and runs the same pipeline schedule (``autopar.costs.schedule``), so one set of plan
variables serves all its rows, each row's costs entering under its boolean. Times enter CP-SAT
in integer nanoseconds, memory in integer bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from ortools.sat.python import cp_model

from autopar.base.axes import PIPELINE_SCHEDULES
from autopar.costs.schedule import MEGATRON, PipelineSchedule
from autopar.costs.stage_costs import StageCosts
from autopar.costs.stage_schedules import stage_schedule
from autopar.layout.stages import StagePlan, last_stage, placed_chunks, placement_of

NS_PER_S = 1e9
CAPACITY_SLACK_BYTES = 4096
"""Integer memory slack over the float capacity (rounded coefficients, a few hundred terms)."""
PRUNE_TOLERANCE = 1e-9
"""Rows whose lower bound exceeds the best upper bound by more than this (relative) are out."""


def ns(seconds) -> int:
    """Seconds as integer nanoseconds."""
    return int(round(float(seconds) * NS_PER_S))


def whole_bytes(value) -> int:
    return int(round(float(value)))


@dataclass(frozen=True, slots=True)
class Shape:
    """A pipeline shape: ``pp`` stages of ``vpp`` chunks under ``schedule``."""

    pp: int
    vpp: int
    schedule: PipelineSchedule = MEGATRON

    @property
    def name(self) -> str:
        return f"pp{self.pp}v{self.vpp}"

    @property
    def placement(self) -> str:
        """How its plans place chunks on ranks (``autopar.layout.stages.placement_of``)."""
        return placement_of(self.schedule.name)

    @property
    def last_stage(self) -> int:
        """The rank holding the last chunk (``autopar.layout.stages.last_stage``)."""
        return last_stage(self.pp, self.placement)


def shapes_of(grid: Mapping[str, np.ndarray], rows: np.ndarray | None = None) -> dict:
    """``{Shape: rows}``: the rows (all, or those of ``rows``; global indices) of each shape, in
    ``(pp, vpp, schedule)`` order; each row runs its ``schedule`` column's per-stage schedule
    (``autopar.costs.stage_schedules.stage_schedule``; ``MEGATRON`` without that column)."""
    index = np.arange(len(grid["pp"])) if rows is None else np.asarray(rows, dtype=np.int64)
    pp, vpp = grid["pp"][index], grid["vpp"][index]
    codes = grid["schedule"][index] if "schedule" in grid else np.zeros(len(index), np.int64)
    keys = sorted({(int(a), int(b), int(c)) for a, b, c in zip(pp, vpp, codes, strict=True)})
    schedules = {c: stage_schedule(PIPELINE_SCHEDULES[c]) for c in {k[2] for k in keys}}
    out: dict[Shape, np.ndarray] = {}
    for p, v, code in keys:
        shape = Shape(p, v, schedules[code])
        if shape not in out:  # the codes priced alike keep their rows in grid order
            same = [c for c, s in schedules.items() if s == shape.schedule]
            out[shape] = index[(pp == p) & (vpp == v) & np.isin(codes, same)]
    return out


def least_layers(p: int, v: int, stage: int, num_layers: int, placement: str = "loop") -> int:
    """Fewest layers the stage may hold (every chunk but the pipeline's first and last holds
    one: in a V, rank 0 holds both ends)."""
    if p == 1:
        return num_layers
    ends = {0, p * v - 1}
    return sum(c not in ends for c in placed_chunks(p, v, stage, placement))


@dataclass(frozen=True, slots=True)
class PlanContext:
    """What every encoding reads: the outer rows (``grid``), their per-layer costs, the allowed
    recompute modes and the usable memory per GPU."""

    grid: Mapping[str, np.ndarray]
    costs: StageCosts
    modes: tuple[str, ...]
    capacity_bytes: float

    @property
    def num_layers(self) -> int:
        return len(self.costs.layer_kinds)

    def microbatches(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.grid["grad_accum"][rows], dtype=np.int64)


def _frozen(values: np.ndarray) -> np.ndarray:
    out = np.array(values, dtype=np.float64)
    out.flags.writeable = False
    return out


@dataclass(frozen=True, slots=True)
class Bounds:
    """Per outer row: a lower bound on its best step (any plan), an upper bound (the best plan
    known) and that plan. Immutable: tightening returns new ``Bounds`` (read-only arrays)."""

    lower_s: np.ndarray
    upper_s: np.ndarray
    plans: tuple[StagePlan | None, ...]

    @classmethod
    def of(cls, lower_s, upper_s, plans: Sequence[StagePlan | None]) -> Bounds:
        return cls(_frozen(lower_s), _frozen(upper_s), tuple(plans))

    def tightened(
        self,
        rows: np.ndarray,
        lower_s,
        upper_s,
        plan_of: Callable[[int], StagePlan | None],
    ) -> Bounds:
        """These bounds with ``rows`` given a lower bound of at least ``lower_s`` and, where
        ``upper_s`` is better, that upper bound and its plan (``plan_of(j)`` for ``rows[j]``,
        asked only there)."""
        lower = self.lower_s.copy()
        lower[rows] = np.maximum(lower[rows], lower_s)
        upper = self.upper_s.copy()
        better = np.asarray(upper_s) < upper[rows]
        upper[rows] = np.where(better, upper_s, upper[rows])
        plans = list(self.plans)
        for j in np.flatnonzero(better):
            plans[int(rows[j])] = plan_of(int(j))
        return Bounds.of(lower, upper, plans)

    def _out(self, excluded: Sequence[int]) -> np.ndarray:
        mask = np.zeros(len(self.lower_s), dtype=bool)
        mask[list(excluded)] = True
        return mask

    def least_upper(self, excluded: Sequence[int] = ()) -> float:
        upper = np.where(self._out(excluded), np.inf, self.upper_s)
        return float(np.min(upper)) if len(upper) else np.inf

    def best_row(self, excluded: Sequence[int] = ()) -> int | None:
        """The row of the least upper bound among those not excluded (``None``: none fits)."""
        if not np.isfinite(self.least_upper(excluded)):
            return None
        return int(np.argmin(np.where(self._out(excluded), np.inf, self.upper_s)))

    def open_rows(self, excluded: Sequence[int] = (), upper_s: float | None = None) -> np.ndarray:
        """Rows not excluded whose lower bound does not exceed ``upper_s`` (default: the least
        upper bound among them): only they can hold the optimum."""
        upper = self.least_upper(excluded) if upper_s is None else upper_s
        lower = np.where(self._out(excluded), np.inf, self.lower_s)
        return np.flatnonzero(np.isfinite(lower) & (lower <= upper * (1 + PRUNE_TOLERANCE) + 1e-12))

    def rows_for_top(self, top: int) -> np.ndarray:
        """Rows that can hold one of the ``top`` best layouts: lower bound at most the
        ``top``-th least upper bound (the ``i``-th optimum is at most the ``i``-th least upper
        bound); the open rows when fewer than ``top`` rows have a plan that fits."""
        finite = np.sort(self.upper_s[np.isfinite(self.upper_s)])
        if len(finite) < top:
            return self.open_rows()
        return self.open_rows(upper_s=float(finite[top - 1]))


@dataclass(frozen=True, slots=True)
class RowLink:
    """The layout model's side, which every encoding adds to: one boolean per outer row kept
    (exactly one true, channelled to the axes), the step-time objective in nanoseconds and its
    upper end, and the memory capacity in integer bytes."""

    x: Mapping[int, cp_model.IntVar]
    objective: cp_model.IntVar
    max_ns: int
    capacity_bytes: int
    ctx: PlanContext

    def step_at_least(
        self,
        model: cp_model.CpModel,
        row: int,
        shape: Shape,
        slowest: cp_model.IntVar,
        times: Sequence[cp_model.IntVar],
    ) -> None:
        """Under row ``row``'s boolean: objective >= step terms + the schedule's closed form
        ``a * max_i T_i + b * sum_i T_i`` (``PipelineSchedule.step_weights``), scaled by the
        common denominator of ``a`` and ``b`` to stay in integers."""
        m = int(self.ctx.grid["grad_accum"][row])
        a, b = shape.schedule.step_weights(shape.pp, shape.vpp, m)
        scale = math.lcm(a.denominator, b.denominator)
        step = ns(self.ctx.costs.step_time_s[row])
        model.add(
            scale * self.objective
            >= scale * step + int(a * scale) * slowest + int(b * scale) * sum(times)
        ).only_enforce_if(self.x[int(row)])

    def table_row(self, model: cp_model.CpModel, name: str, rows, batches: Sequence[TableBatch]):
        """(an integer naming which of ``rows`` is chosen, by its place among the rows of
        ``batches``, -1 when none is; each row's batch, index there and place)."""
        where, place = {}, 0
        for batch in batches:
            for j, r in enumerate(batch.rows):
                where[int(r)] = (batch, j, place)
                place += 1
        row_var = model.new_int_var(-1, place - 1, f"{name}.row")
        for r in rows:
            model.add(row_var == where[int(r)][2]).only_enforce_if(self.x[int(r)])
        model.add(row_var == -1).only_enforce_if([self.x[int(r)].Not() for r in rows])
        return row_var, where


@dataclass(frozen=True, slots=True)
class TableBatch:
    """Tables built by one ``tighten``: their rows (global indices) and one table per stage."""

    rows: np.ndarray
    tables: tuple


@dataclass(frozen=True, slots=True)
class TableHandle:
    """What a table encoding added: its plan variables (layers per stage, or the stages' first
    layers) and each row's batch, index there and place (``RowLink.table_row``)."""

    plan: list
    where: dict


Fix = tuple[cp_model.IntVar, int]


class StageEncoding(Protocol):
    """One shape's plans in the search (``autopar.pipeline.search`` runs the loop once for all
    three encodings). An encoding covers the rows whose tables it holds: ``tighten`` builds the
    tables of more rows once, and every runner-up solve reuses them."""

    shape: Shape

    def tighten(
        self, bounds: Bounds, rows: np.ndarray, ctx: PlanContext
    ) -> tuple[StageEncoding, Bounds]:
        """This encoding also covering ``rows`` (rows of its shape not yet covered: their
        tables built once), and ``bounds`` with those rows tightened by its exact figures."""
        ...

    def add(self, model: cp_model.CpModel, rows: np.ndarray, link: RowLink) -> Any:
        """The plan variables and constraints of ``rows`` (covered), each row's under its
        boolean; returns the handle ``hint`` and ``decode`` read."""
        ...

    def hint(self, handle: Any, plan: StagePlan) -> list[Fix]:
        """Values of the plan variables that spell ``plan``."""
        ...

    def decode(self, solver: cp_model.CpSolver, handle: Any, row: int) -> StagePlan:
        """The plan of the solution, for the chosen ``row``."""
        ...
