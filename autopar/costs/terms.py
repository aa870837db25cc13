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

Schedules that split the backward (zero bubble: Qi et al. 2024) fill their bubble with some
phases and not others, so ``slots`` may have one value per phase (``PhasedSlots``) and a
micro-batch term may say how its time splits into forward, input-gradient and weight-gradient
backward (``PhasedTerm``; a term that does not say is a third forward, two thirds input
gradient). The micro-batch part is then ``sum over terms of sum over phases slots_phase *
phase`` (``weighted``), the per-phase slots taken at the layout's own phase times
(``microbatch_time_s``); the solver takes them at reference times (``autopar.search.cpsat``), a
lower bound of the same sum (``autopar.costs.schedule_slots.schedule_slots``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from autopar.base.axes import AXIS, GRID_AXES, PIPELINE_SCHEDULES
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


class Phases(NamedTuple):
    """One micro-batch's time of a term by pipeline phase, or (``PhasedSlots``) the slots of
    each phase: forward, backward for the inputs' gradient, backward for the weights' gradient,
    and what a paired step hides (a schedule that issues one micro-batch's forward with
    another's backward hides some communication: Megatron's combined 1F1B)."""

    forward: np.ndarray
    backward_input: np.ndarray
    backward_weight: np.ndarray
    paired_hidden: np.ndarray

    def total(self) -> np.ndarray:
        return self.forward + self.backward_input + self.backward_weight


FORWARD_SHARE = 1.0 / 3.0
"""Forward's share of a term that gives no phases: the backward is twice the forward
(Narayanan et al. 2021 §3.5); none of it is counted as weight gradient."""


@runtime_checkable
class NarrowedTerm(Protocol):
    """A term that reads fewer of its axes in some spaces: ``depends_on_in`` gives those it
    reads given the axes' domains (codes), a subset of ``depends_on`` on which its values are
    the same (a schedule's activations when only 1F1B is searched)."""

    def depends_on_in(self, domains: Mapping[str, tuple[int, ...]]) -> tuple[str, ...]: ...


def term_axes(term: CostTerm, domains: Mapping[str, tuple[int, ...]]) -> tuple[str, ...]:
    """The axes ``term`` reads in a space with these domains (``NarrowedTerm``)."""
    if isinstance(term, NarrowedTerm):
        return tuple(term.depends_on_in(domains))
    return tuple(term.depends_on)


def schedules_in(domains: Mapping[str, tuple[int, ...]]) -> frozenset[str]:
    """The pipeline schedules a space's domains allow (1F1B when it has no schedule axis)."""
    return frozenset(PIPELINE_SCHEDULES[c] for c in domains.get("schedule", (0,)))


@runtime_checkable
class PhasedTerm(Protocol):
    """A micro-batch term that splits its time into ``Phases`` (summing to ``evaluate``)."""

    def phases(self, grid: Grid, ctx: TermContext) -> Phases: ...


@runtime_checkable
class PhasedSlots(Protocol):
    """A slots term with one value per phase, at given phase times (``Phases`` of the whole
    micro-batch, for every row)."""

    def phase_slots(self, grid: Grid, ctx: TermContext, times: Phases) -> Phases: ...

    def ratio_free(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        """Where ``phase_slots`` are the same at every phase time (then the slots taken at any
        reference times are the layout's own: ``autopar.costs.score`` needs no closing)."""
        ...


def slots_ratio_free(slots: CostTerm, grid: Grid, ctx: TermContext, size: int) -> np.ndarray:
    """``PhasedSlots.ratio_free``; everywhere for slots with one value for every phase."""
    if isinstance(slots, PhasedSlots):
        return np.broadcast_to(np.asarray(slots.ratio_free(grid, ctx), dtype=bool), (size,))
    return np.ones(size, dtype=bool)


def scheduled_microbatch_s(
    term: CostTerm, slots: CostTerm, grid: Grid, ctx: TermContext, size: int
) -> np.ndarray:
    """One micro-batch's time of ``term`` as the layout's schedule runs it on average over the
    slots: ``evaluate`` less the share of its paired-step hiding that the schedule's paired
    slots give (``slots.paired_hidden / slots.forward`` of ``Phases.paired_hidden``): for
    figures that charge each stage one time per micro-batch (the per-stage plans,
    ``autopar.costs.stage_costs``); with equal stages ``slots * this`` is the term's part of
    ``microbatch_time_s`` wherever every phase has the same slots (the combined 1F1B)."""
    value = np.broadcast_to(np.asarray(term.evaluate(grid, ctx), dtype=np.float64), (size,))
    if not isinstance(term, PhasedTerm) or not isinstance(slots, PhasedSlots):
        return value
    parts = term_phases(term, grid, ctx, size)
    if not np.any(parts.paired_hidden):
        return value
    at = slot_phases(slots, grid, ctx, parts)
    usable = np.isfinite(at.forward) & (at.forward > 0)
    share = np.divide(at.paired_hidden, at.forward, out=np.zeros(size), where=usable)
    return value - share * parts.paired_hidden


def uniform_slots(slots: Phases) -> np.ndarray:
    """Rows whose slots are one value for every phase with nothing hidden (1F1B): there the
    micro-batch part is ``slots * sum of the terms`` (``microbatch_time_s``)."""
    same = (slots.forward == slots.backward_input) & (slots.forward == slots.backward_weight)
    return same & (slots.paired_hidden == 0)


def term_phases(term: CostTerm, grid: Grid, ctx: TermContext, size: int) -> Phases:
    """``term``'s phases, broadcast to ``size`` rows (``FORWARD_SHARE`` when it gives none)."""
    return term_value_and_phases(term, grid, ctx, size)[1]


def term_value_and_phases(
    term: CostTerm, grid: Grid, ctx: TermContext, size: int
) -> tuple[np.ndarray, Phases]:
    """``term``'s value on every row and its phases (``term_phases``), from one evaluation: a
    ``PhasedTerm``'s value is its phases' sum (what its ``evaluate`` gives, as
    ``autopar.costs.score`` reads it), another's phases are shares of its value."""
    if isinstance(term, PhasedTerm):
        parts = term.phases(grid, ctx)
        phases = Phases(*(np.broadcast_to(np.asarray(x, dtype=np.float64), (size,)) for x in parts))
        return phases.total(), phases
    value = np.broadcast_to(np.asarray(term.evaluate(grid, ctx), dtype=np.float64), (size,))
    zero = np.zeros(size)
    return value, Phases(FORWARD_SHARE * value, (1.0 - FORWARD_SHARE) * value, zero, zero)


def slot_phases(slots: CostTerm, grid: Grid, ctx: TermContext, times: Phases) -> Phases:
    """The slots of each phase at ``times``: ``PhasedSlots.phase_slots``, or ``slots`` for
    every phase and nothing hidden."""
    size = len(times.forward)
    if isinstance(slots, PhasedSlots):
        parts = slots.phase_slots(grid, ctx, times)
        return Phases(*(np.broadcast_to(np.asarray(x, dtype=np.float64), (size,)) for x in parts))
    value = np.broadcast_to(np.asarray(slots.evaluate(grid, ctx), dtype=np.float64), (size,))
    return Phases(value, value, value, np.zeros(size))


def weighted(slots: Phases, phases: Phases) -> np.ndarray:
    """``sum over phases slots * time``, less what the paired steps hide; ``inf`` where a slot
    is (a schedule with no order for that shape)."""
    with np.errstate(invalid="ignore"):
        value = (
            slots.forward * phases.forward
            + slots.backward_input * phases.backward_input
            + slots.backward_weight * phases.backward_weight
            - slots.paired_hidden * phases.paired_hidden
        )
    return np.where(np.isinf(slots.forward), np.inf, value)


def sum_phases(parts: list[Phases], size: int) -> Phases:
    zero = np.zeros(size)
    return Phases(*(sum((p[i] for p in parts), zero) for i in range(4)))


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


def _values(terms: tuple, grid: Grid, ctx: TermContext, size: int) -> list[np.ndarray]:
    """Each term's value on every row (evaluated once, for its sum and its categories)."""
    return [np.broadcast_to(term.evaluate(grid, ctx), (size,)) for term in terms]


def _total(values: list[np.ndarray], size: int) -> np.ndarray:
    total = np.zeros(size)
    for value in values:
        total = total + value
    return total


def _sum(terms: tuple, grid: Grid, ctx: TermContext, size: int) -> np.ndarray:
    return _total(_values(terms, grid, ctx, size), size)


def _by_category(
    terms: tuple,
    values: list[np.ndarray],
    size: int,
    scale: np.ndarray,
    out: dict[str, np.ndarray],
) -> None:
    for term, value in zip(terms, values, strict=True):
        out[term.category] = out.get(term.category, np.zeros(size)) + value * scale


def microbatch_phases(cost_model: CostModel, grid: Grid, ctx: TermContext) -> list[Phases]:
    size = len(next(iter(grid.values())))
    return [term_phases(t, grid, ctx, size) for t in cost_model.microbatch_terms]


class _Pipeline(NamedTuple):
    """Of one grid: each micro-batch term's phases, their sum, the slots at that sum, and the
    terms' values summed (``_pipeline_parts``)."""

    parts: list[Phases]
    phases: Phases
    slots: Phases
    microbatch_sum: np.ndarray


def _pipeline_parts(cost_model: CostModel, grid: Grid, ctx: TermContext, size: int):
    """Each micro-batch term's phases, their sum, the slots at that sum, and the sum of the
    terms' values (each term evaluated once for both)."""
    both = [term_value_and_phases(t, grid, ctx, size) for t in cost_model.microbatch_terms]
    parts = [p for _, p in both]
    phases = sum_phases(parts, size)
    slots = slot_phases(cost_model.slots, grid, ctx, phases)
    return _Pipeline(parts, phases, slots, _total([v for v, _ in both], size))


def microbatch_time_s(cost_model: CostModel, grid: Grid, ctx: TermContext) -> np.ndarray:
    """The pipeline part of the step: the micro-batch terms weighted by the slots of their
    phases, the slots taken at the layout's own phase times (module docstring)."""
    size = len(next(iter(grid.values())))
    return _microbatch_time(_pipeline_parts(cost_model, grid, ctx, size))


def _microbatch_time(pipeline: _Pipeline) -> np.ndarray:
    slots = pipeline.slots
    plain = slots.forward * pipeline.microbatch_sum
    return np.where(uniform_slots(slots), plain, weighted(slots, pipeline.phases))


def step_terms_s(cost_model: CostModel, grid: Grid, ctx: TermContext) -> np.ndarray:
    """The terms paid once per step, summed: ``step_time_s`` without ``microbatch_time_s``."""
    size = len(next(iter(grid.values())))
    return _sum(cost_model.step_terms, grid, ctx, size)


def step_time_s(cost_model: CostModel, grid: Grid, ctx: TermContext) -> np.ndarray:
    return step_terms_s(cost_model, grid, ctx) + microbatch_time_s(cost_model, grid, ctx)


def memory_bytes(cost_model: CostModel, grid: Grid, ctx: TermContext) -> np.ndarray:
    size = len(next(iter(grid.values())))
    in_flight = cost_model.in_flight.evaluate(grid, ctx)
    return _sum(cost_model.static_memory_terms, grid, ctx, size) + in_flight * _sum(
        cost_model.microbatch_memory_terms, grid, ctx, size
    )


def time_breakdown_s(cost_model: CostModel, grid: Grid, ctx: TermContext) -> dict[str, np.ndarray]:
    """Seconds per category (``TIME_CATEGORIES``, then any other category a term names): each
    micro-batch term ``grad_accum`` times, less what the schedule's paired steps hide of it; the
    pipeline bubble is what the schedule adds to that."""
    size = len(next(iter(grid.values())))
    steps = _values(cost_model.step_terms, grid, ctx, size)
    pipeline = _pipeline_parts(cost_model, grid, ctx, size)
    return _breakdown(cost_model, grid, size, steps, pipeline)


def time_figures(
    cost_model: CostModel, grid: Grid, ctx: TermContext
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """``step_time_s``, ``microbatch_time_s`` and ``time_breakdown_s`` of one grid, the terms
    evaluated, their phases and the schedule's slots computed once for the three
    (``estimate_many``)."""
    size = len(next(iter(grid.values())))
    pipeline = _pipeline_parts(cost_model, grid, ctx, size)
    microbatch = _microbatch_time(pipeline)
    steps = _values(cost_model.step_terms, grid, ctx, size)
    step = _total(steps, size) + microbatch
    return step, microbatch, _breakdown(cost_model, grid, size, steps, pipeline)


def _breakdown(cost_model: CostModel, grid: Grid, size: int, steps, pipeline: _Pipeline):
    out: dict[str, np.ndarray] = {category: np.zeros(size) for category in TIME_CATEGORIES}
    grad_accum = np.asarray(grid["grad_accum"], dtype=np.float64)
    _by_category(cost_model.step_terms, steps, size, np.ones(size), out)
    phases, slots = pipeline.parts, pipeline.slots
    counted = np.zeros(size)
    for term, part in zip(cost_model.microbatch_terms, phases, strict=True):
        value = grad_accum * part.total() - slots.paired_hidden * part.paired_hidden
        out[term.category] = out.get(term.category, np.zeros(size)) + value
        counted = counted + value
    out["bubble"] = out["bubble"] + sum(weighted(slots, p) for p in phases) - counted
    return out


def memory_breakdown_bytes(
    cost_model: CostModel, grid: Grid, ctx: TermContext
) -> dict[str, np.ndarray]:
    """Bytes per category (``MEMORY_CATEGORIES``, then any other category a term names) and
    their ``total``."""
    size = len(next(iter(grid.values())))
    out: dict[str, np.ndarray] = {category: np.zeros(size) for category in MEMORY_CATEGORIES}
    in_flight = np.broadcast_to(cost_model.in_flight.evaluate(grid, ctx), (size,))
    static, micro = cost_model.static_memory_terms, cost_model.microbatch_memory_terms
    _by_category(static, _values(static, grid, ctx, size), size, np.ones(size), out)
    _by_category(micro, _values(micro, grid, ctx, size), size, in_flight, out)
    out["total"] = sum((out[c] for c in list(out)), np.zeros(size))
    return out
