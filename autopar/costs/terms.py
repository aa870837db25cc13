"""The pluggable cost-model interface (STYLE §2.3) and its float evaluation.

A cost model is a frozen ``CostModel``: plain tuples of terms, each a small frozen dataclass with a
``name`` (unit suffix), a ``category`` (where it shows in a breakdown; a new category gets its
own row), ``depends_on`` (grid axes from ``autopar.base.axes.GRID_AXES``) and a pure, vectorised
``evaluate(grid, ctx)``. ``CostModel`` checks its terms when it is built: every declared axis
exists, and each term evaluates on a grid that holds only its declared axes (a term that reads
an axis it did not declare would be tabulated wrongly by the solver).

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

import dataclasses
import difflib
import functools
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from autopar.base.axes import AXIS, GRID_AXES
from autopar.base.errors import InputError
from autopar.costs.comm import CollectiveModel, DatasheetCollectives
from autopar.inputs.specs import ClusterSpec, GpuSpec, ModelSpec, SearchOptions, TrainingSpec
from autopar.layout.plan import Layout

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
    "offload",
)
MEMORY_CATEGORIES: tuple[str, ...] = (
    "weights",
    "gradients",
    "optimizer",
    "activations",
    "other",
    "reserve",
)


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


@runtime_checkable
class DecisionSource(Protocol):
    """Choices a cost model makes inside a term rather than on an axis (the MoE token
    dispatcher: the term prices the fastest allowed one), named per layout for the report and
    the launch configs: ``{"moe_token_dispatcher": ["alltoall", ...]}``."""

    def decide(self, grid: Grid, ctx: TermContext) -> dict[str, list[str]]: ...


@runtime_checkable
class CheckpointTerm(Protocol):
    """What one distributed checkpoint makes the most loaded server write (``evaluate``,
    ``_bytes``; its GPUs share its storage bandwidth) and the most loaded rank write
    (``rank_bytes``: what an asynchronous save first copies to host memory)."""

    name: str
    category: str
    depends_on: tuple[str, ...]

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray: ...

    def rank_bytes(self, grid: Grid, ctx: TermContext) -> np.ndarray: ...


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
    decisions: DecisionSource | None = None
    """Choices made inside terms, reported with each estimate (``Estimate.choices``)."""
    checkpoint: CheckpointTerm | None = None
    """Bytes one checkpoint makes a server and a rank write (``cost_models.checkpoint``): with
    it, estimates carry goodput under failures (``autopar.costs.goodput``) and the search can
    minimise the expected time per useful step; ``None``: no failure figures."""

    def __post_init__(self) -> None:
        for term in self.all_terms():
            _check_term(term)
        if self.checkpoint is not None:
            _check_term(self.checkpoint)

    def all_terms(self) -> tuple[CostTerm | ResourceTerm, ...]:
        return (
            *self.step_terms,
            *self.microbatch_terms,
            self.slots,
            *self.static_memory_terms,
            *self.microbatch_memory_terms,
            self.in_flight,
        )


class _DeclaredGrid(dict):
    """A grid that names the axis a term reads without declaring it."""

    def __init__(self, term_name: str, columns: dict[str, np.ndarray]) -> None:
        super().__init__(columns)
        self.term_name = term_name

    def __missing__(self, axis: str) -> np.ndarray:
        raise InputError(
            f"reads grid axis {axis!r} but depends_on declares only {tuple(self)}",
            source=f"cost term {self.term_name}",
            field="depends_on",
        )


def _sample_values(axis: str) -> tuple[int, ...]:
    """Values an axis takes when a term is checked: every mode of a mode axis, both values of a
    flag, 1 and 2 for a size (2 and 4 micro-batches, so that pipelines fill)."""
    spec = AXIS[axis]
    if spec.kind == "mode":
        return tuple(range(len(spec.choices)))
    if spec.kind == "flag":
        return (0, 1)
    return (2, 4) if axis == "grad_accum" else (1, 2)


def _sample_grid(axes: tuple[str, ...]) -> dict[str, np.ndarray]:
    if not axes:
        return {}
    columns = [_sample_values(a) for a in axes]
    rows = np.array(list(itertools.product(*columns)), dtype=np.int64).reshape(-1, len(axes))
    return {a: rows[:, i] for i, a in enumerate(axes)}


@functools.cache
def _sample_contexts() -> tuple[TermContext, ...]:
    """A dense and an MoE model on an H100-like node: enough to run every branch a term takes
    on the axes (the check reads which axes a term uses, not its values)."""
    gpu = GpuSpec(
        name="sample",
        memory_bytes=80 * 2**30,
        peak_bf16_flop_per_s=989e12,
        peak_fp8_flop_per_s=1979e12,
        hbm_bytes_per_s=3.35e12,
        nvlink_bytes_per_s=450e9,
        nic_bytes_per_s=50e9,
        gpus_per_node=8,
    )
    cluster = ClusterSpec(gpu=gpu, gpus_per_node=8)
    training = TrainingSpec(num_gpus=64, global_batch_sequences=64, seq_len=1024)
    dense = ModelSpec(
        name="sample-dense",
        num_layers=4,
        hidden_size=256,
        num_attention_heads=8,
        num_kv_heads=2,
        ffn_hidden_size=512,
        vocab_size=1024,
    )
    moe = dataclasses.replace(
        dense,
        name="sample-moe",
        num_experts=8,
        experts_per_token=2,
        moe_ffn_hidden_size=128,
        shared_expert_ffn_hidden_size=128,
    )
    return tuple(
        TermContext(
            model=model,
            cluster=cluster,
            training=training,
            options=SearchOptions(),
            comm=DatasheetCollectives(cluster),
        )
        for model in (dense, moe)
    )


def _check_term(term: CostTerm | ResourceTerm) -> None:
    """Raise ``InputError`` if ``term`` declares an unknown axis or reads an undeclared one
    (once per distinct term: frozen terms are hashable, and the check is memoised)."""
    try:
        hash(term)
    except TypeError:
        _check_term_now(term)
    else:
        _check_term_once(term)


@functools.cache
def _check_term_once(term: CostTerm | ResourceTerm) -> None:
    _check_term_now(term)


def _check_term_now(term: CostTerm | ResourceTerm) -> None:
    name = getattr(term, "name", type(term).__name__)
    depends_on = tuple(getattr(term, "depends_on", ()))
    for axis in depends_on:
        if axis not in AXIS:
            close = difflib.get_close_matches(str(axis), GRID_AXES, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InputError(
                f"unknown grid axis {axis!r} (axes: {', '.join(GRID_AXES)}){hint}",
                source=f"cost term {name}",
                field="depends_on",
            )
    axes = tuple(dict.fromkeys(depends_on))
    for ctx in _sample_contexts():
        grid = _sample_grid(axes)
        size = len(next(iter(grid.values()))) if grid else 1
        try:
            values = np.asarray(term.evaluate(_DeclaredGrid(name, grid), ctx), dtype=np.float64)
        except KeyError as err:  # a term that copied the grid before reading a missing axis
            axis = err.args[0] if err.args else "?"
            raise InputError(
                f"reads grid axis {axis!r} but depends_on declares only {axes}",
                source=f"cost term {name}",
                field="depends_on",
            ) from None
        try:
            np.broadcast_to(values, (size,))
        except ValueError:
            raise InputError(
                f"evaluate returned shape {values.shape} for a grid of {size} rows",
                source=f"cost term {name}",
                field="evaluate",
            ) from None


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
    """Seconds per category (``TIME_CATEGORIES``, then any other category a term names); the
    pipeline bubble is ``(slots - grad_accum)`` micro-batch times."""
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
    """Bytes per category (``MEMORY_CATEGORIES``, then any other category a term names) and
    their ``total``."""
    size = len(next(iter(grid.values())))
    out: dict[str, np.ndarray] = {category: np.zeros(size) for category in MEMORY_CATEGORIES}
    in_flight = np.broadcast_to(cost_model.in_flight.evaluate(grid, ctx), (size,))
    _by_category(cost_model.static_memory_terms, grid, ctx, size, np.ones(size), out)
    _by_category(cost_model.microbatch_memory_terms, grid, ctx, size, in_flight, out)
    out["total"] = sum((out[c] for c in list(out)), np.zeros(size))
    return out
