"""The pluggable cost-model interface (STYLE §2.3) and its float evaluation.

A cost model is a frozen ``CostModel``: plain tuples of terms, each a small frozen dataclass with a
``name`` (unit suffix), a ``category`` (where it shows in a breakdown), ``depends_on`` (grid axes
from ``autopar.plan.GRID_AXES``) and a pure, vectorised ``evaluate(grid, ctx)``.

The step time and the peak memory of a layout are composed from the terms as

    step_time_s  = sum(step terms) + slots * sum(microbatch terms)
    memory_bytes = sum(static memory terms) + in_flight * sum(microbatch memory terms)

where ``slots`` (micro-batch slots on the critical path: ``grad_accum + (pp-1)/vpp`` for
1F1B, Narayanan et al. 2021 §2.2) and ``in_flight`` (micro-batches whose activations the most
loaded rank holds, Korthikanti et al. 2022 §4.2.3) are themselves terms of the cost model. This
is the only structure the solver knows: it tabulates every term over its own axes and multiplies
two sums, so the CP-SAT objective *is* the cost model (DESIGN §3).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from autopar.comm import CollectiveModel
from autopar.plan import GRID_AXES, Layout
from autopar.specs import ClusterSpec, ModelSpec, SearchOptions, TrainingSpec

Grid = Mapping[str, np.ndarray]

TIME_CATEGORIES: tuple[str, ...] = (
    "compute",
    "bubble",
    "tp_comm",
    "pp_comm",
    "dp_comm",
    "cp_comm",
    "ep_comm",
    "optimizer",
)
MEMORY_CATEGORIES: tuple[str, ...] = ("weights", "gradients", "optimizer", "activations", "other")


@dataclass(frozen=True, slots=True, kw_only=True)
class TermContext:
    """What terms may read besides the grid: the frozen specs and the collective-time source."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    options: SearchOptions
    comm: CollectiveModel
    """Collective times: datasheet alpha-beta, or a profile measured with nccl-tests."""
    gemm: object | None = None
    """Optional measured GEMM throughput (a profile with ``gemm_flop_per_s(m, n, k, dtype)``)."""


@runtime_checkable
class CostTerm(Protocol):
    """A time (``_s``) or dimensionless term."""

    name: str
    category: str
    depends_on: tuple[str, ...]

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray: ...


@runtime_checkable
class ResourceTerm(Protocol):
    """A per-GPU memory term (``_bytes``); the capacity is the cluster's usable memory."""

    name: str
    category: str
    depends_on: tuple[str, ...]

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray: ...


@runtime_checkable
class FlopCounter(Protocol):
    """Model and executed FLOPs of one optimizer step over all GPUs (for MFU / HFU)."""

    def model_flop(self, grid: Grid, ctx: TermContext) -> np.ndarray: ...

    def hardware_flop(self, grid: Grid, ctx: TermContext) -> np.ndarray: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class CostModel:
    """A set of terms composed as in the module docstring."""

    name: str
    step_terms: tuple[CostTerm, ...]
    """Seconds per optimizer step (DP gradient sync, optimizer update)."""
    microbatch_terms: tuple[CostTerm, ...]
    """Seconds per micro-batch (forward + backward) on the slowest pipeline stage."""
    slots: CostTerm
    """Micro-batch slots on the critical path (dimensionless, >= grad_accum)."""
    static_memory_terms: tuple[ResourceTerm, ...]
    """Bytes held regardless of the schedule (parameters, gradients, optimizer states, buffers)."""
    microbatch_memory_terms: tuple[ResourceTerm, ...]
    """Activation bytes of one micro-batch on the most loaded rank."""
    in_flight: CostTerm
    """Micro-batches whose activations the most loaded rank holds at its peak (dimensionless)."""
    flops: FlopCounter

    def all_terms(self) -> tuple[CostTerm | ResourceTerm, ...]:
        return (
            *self.step_terms,
            *self.microbatch_terms,
            self.slots,
            *self.static_memory_terms,
            *self.microbatch_memory_terms,
            self.in_flight,
        )


def grid_of(layouts: list[Layout]) -> dict[str, np.ndarray]:
    """Layouts as a grid with every axis (one row per layout)."""
    rows = [layout.grid_row() for layout in layouts]
    return {axis: np.array([row[axis] for row in rows], dtype=np.int64) for axis in GRID_AXES}


def _sum(terms: tuple, grid: Grid, ctx: TermContext, size: int) -> np.ndarray:
    total = np.zeros(size)
    for term in terms:
        total = total + np.broadcast_to(term.evaluate(grid, ctx), (size,))
    return total


def _by_category(
    terms: tuple,
    grid: Grid,
    ctx: TermContext,
    size: int,
    scale: np.ndarray,
    out: dict[str, np.ndarray],
) -> None:
    for term in terms:
        value = np.broadcast_to(term.evaluate(grid, ctx), (size,)) * scale
        out[term.category] = out.get(term.category, np.zeros(size)) + value


def step_time_s(cost_model: CostModel, grid: Grid, ctx: TermContext) -> np.ndarray:
    size = len(next(iter(grid.values())))
    slots = cost_model.slots.evaluate(grid, ctx)
    return _sum(cost_model.step_terms, grid, ctx, size) + slots * _sum(
        cost_model.microbatch_terms, grid, ctx, size
    )


def memory_bytes(cost_model: CostModel, grid: Grid, ctx: TermContext) -> np.ndarray:
    size = len(next(iter(grid.values())))
    in_flight = cost_model.in_flight.evaluate(grid, ctx)
    return _sum(cost_model.static_memory_terms, grid, ctx, size) + in_flight * _sum(
        cost_model.microbatch_memory_terms, grid, ctx, size
    )


def time_breakdown_s(cost_model: CostModel, grid: Grid, ctx: TermContext) -> dict[str, np.ndarray]:
    """Seconds per category; the pipeline bubble is ``(slots - grad_accum)`` micro-batch times."""
    size = len(next(iter(grid.values())))
    out: dict[str, np.ndarray] = {category: np.zeros(size) for category in TIME_CATEGORIES}
    slots = np.broadcast_to(cost_model.slots.evaluate(grid, ctx), (size,))
    grad_accum = np.asarray(grid["grad_accum"], dtype=np.float64)
    _by_category(cost_model.step_terms, grid, ctx, size, np.ones(size), out)
    _by_category(cost_model.microbatch_terms, grid, ctx, size, grad_accum, out)
    out["bubble"] = out["bubble"] + (slots - grad_accum) * _sum(
        cost_model.microbatch_terms, grid, ctx, size
    )
    return out


def memory_breakdown_bytes(
    cost_model: CostModel, grid: Grid, ctx: TermContext
) -> dict[str, np.ndarray]:
    size = len(next(iter(grid.values())))
    out: dict[str, np.ndarray] = {category: np.zeros(size) for category in MEMORY_CATEGORIES}
    in_flight = np.broadcast_to(cost_model.in_flight.evaluate(grid, ctx), (size,))
    _by_category(cost_model.static_memory_terms, grid, ctx, size, np.ones(size), out)
    _by_category(cost_model.microbatch_memory_terms, grid, ctx, size, in_flight, out)
    out["total"] = sum((out[c] for c in list(out)), np.zeros(size))
    return out
