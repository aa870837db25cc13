"""Per-GPU memory of the most loaded rank (DESIGN §4 "Memory per GPU").

The most loaded rank is on the first pipeline stage: its ``num_layers / pp`` layers, the input
embedding (and, with ``pp == 1``, the output layer and the logits), and ``in_flight``
micro-batches of activations (``pipeline.InFlightMicrobatches``).

**Parameters and optimizer** (Megatron ``theoretical_memory_usage.py``,
``compute_weight_and_optimizer_memory``): BF16 weights 2 B/param, FP32 gradient buffer
(``main_grad``) 4 B/param, FP32 master weights + Adam m and v 12 B/param: 18 B/param, or
``6 + 12/d`` with the distributed optimizer (ZeRO-1). autopar shards over ``d = dp*cp`` (Megatron
shards the optimizer over the data-parallel group *with* context parallelism; its estimator
divides by ``dp`` only, which overstates memory when ``cp > 1``). ZeRO-2 also divides the
gradient buffer by ``d``, ZeRO-3 the weights (plus one gathered layer in flight). Routed-expert
parameters live on the expert grid: divided by ``etp*ep*pp`` and sharded over expert-DP
``num_gpus / (etp*ep*pp)`` (Megatron's estimator divides them by ``tp`` like dense weights).

**Activations** are ``cost_models.activations``; this module holds the parameters and optimizer
states, the logits and the runtime reserve. In Megatron-compatible mode
(``megatron_compatible=True``, the golden test of DESIGN §6) the optimizer is sharded over ``dp``
only and there are no logits or workspace, as in ``theoretical_memory_usage.py``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from autopar.base.axes import PIPELINE_SCHEDULES
from autopar.costs.schedule_orders import V_SHAPED
from autopar.costs.terms import Grid, TermContext, schedules_in
from autopar.inputs.specs import GIB, ModelSpec
from cost_models.shapes import (
    all_stage_kinds,
    dense_layer_params,
    expert_params,
    kind_params,
    mtp_extra_params,
    norm_params,
    padded_vocab,
)

BYTES_WEIGHT = 2.0
"""BF16 model weights (FP8 training keeps BF16 weights; casts are transient)."""
BYTES_OPTIMIZER = 12.0
"""FP32 master weights + Adam first and second moments."""
CUDA_CONTEXT_BYTES = 1.0 * GIB
"""CUDA context with the PyTorch, cuBLAS and cuDNN kernels and workspaces: about 300 MB with lazy
module loading (the default on Linux since CUDA 12.2), over 1000 MB before CUDA 11.7
(pytorch/pytorch#107667); cuBLAS workspaces per stream and handle on top."""
NCCL_BUFFER_BYTES = 1.0 * GIB
"""NCCL buffers of the communicators a rank uses (TP, DP, PP, CP, EP groups): linear in the
channels, more on H100 NVLink than on PCIe (NVIDIA/nccl#986); measured 544 MB per 2-GPU and 688 MB
per larger group on 4 A100s over NVLink (NVIDIA/nccl#964), a 512 MiB shared network buffer per
communicator in NCCL 2.28 (NVIDIA/nccl#2363); NVLS buffers more still, which Megatron-Bridge's
performance recipes switch off (``NCCL_NVLS_ENABLE=0``). 1 GiB is the low end of that evidence:
the published runs bound the whole reserve (``WorkspaceMemory``)."""
ALLOCATOR_FRAGMENTATION = 0.03
"""Share of device memory the PyTorch caching allocator holds but cannot hand out. Without
virtual-memory stitching it averages 15% (up to 33%) on A100-80GB over eight LLMs with
recompute and ZeRO (GMLake, ASPLOS'24, arXiv 2401.08156); PyTorch's expandable segments, which
Megatron-Bridge's recipes set (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``), map
segments the same way and leave a few percent. For more headroom set ``--memory-reserve-gib``."""
LOGITS_BYTES_PER_ELEMENT = 6.0
"""Logits kept for the loss: BF16 output of the output layer and the FP32 softmax that the
vocab-parallel cross entropy saves for backward (Megatron ``cross_entropy.py``)."""


V_CODES = [PIPELINE_SCHEDULES.index(name) for name in sorted(V_SHAPED)]


def v_shaped_rows(grid: Grid) -> np.ndarray:
    """Rows whose schedule puts a rank's two chunks in a V (ZB-V, DualPipeV): the first rank
    also holds the last stage (``autopar.costs.schedule_orders``); none without a schedule
    column (a space with no V schedule: ``without_unread``)."""
    if "schedule" not in grid:
        return np.zeros(len(np.atleast_1d(grid["tp"])), dtype=bool)
    return np.isin(np.asarray(grid["schedule"]), V_CODES)


def without_unread(depends_on: tuple[str, ...], domains, unread: tuple[str, ...], needs) -> tuple:
    """``depends_on`` less ``unread`` when no schedule of the space is in ``needs``
    (``autopar.costs.terms.NarrowedTerm``: the term's values do not change along them)."""
    if schedules_in(domains) & frozenset(needs):
        return depends_on
    return tuple(a for a in depends_on if a not in unread)


def axes_of(grid: Grid, *names: str) -> tuple[np.ndarray, ...]:
    """The grid's ``names`` columns as float arrays."""
    return tuple(np.asarray(grid[name], dtype=np.float64) for name in names)


@functools.lru_cache(maxsize=1024)
def stage_layer_param_sums(
    model: ModelSpec, pp: int, *, v_shaped: bool = False
) -> tuple[tuple[float, bool, bool], ...]:
    """Per rank: dense-grid layer parameters (MTP modules on the last stage), whether it holds
    the input embedding (first stage) and the output layer (last stage). A V-shaped schedule
    (ZB-V, DualPipeV) puts virtual stages ``r`` and ``2*pp-1-r`` on rank ``r``, so rank 0 holds
    both ends (``autopar.costs.schedule_orders``). Memoised: a pure function of the frozen,
    hashable model and two scalars, asked once per part (weights, gradients, optimizer) and per
    term of every solve; the tuples are immutable."""
    stages = 2 * pp if v_shaped else pp
    sums = []
    for stage, counts in enumerate(all_stage_kinds(model, stages)):
        params = float(sum(n * kind_params(model, kind) for kind, n in counts.items()))
        last = stage == stages - 1
        if last:
            params += model.num_mtp_layers * mtp_extra_params(model) + norm_params(model)
        sums.append((params, stage == 0, last))
    if not v_shaped:
        return tuple(sums)
    return tuple(
        (a[0] + b[0], a[1] or b[1], a[2] or b[2])
        for a, b in zip(sums[:pp], reversed(sums[pp:]), strict=True)
    )


def stage_dense_params(
    model: ModelSpec, tp: np.ndarray, pp: int, *, v_shaped: bool = False
) -> list[np.ndarray]:
    """Per rank of a ``pp``-rank pipeline, its dense-grid parameters over all its TP ranks
    (one value per entry of ``tp``: the vocabulary is padded to ``128 * tp``): its layers, the
    input embedding (and learned positions) on the first stage, the untied output layer and
    the MTP modules on the last; both ends on rank 0 under a V-shaped schedule
    (``stage_layer_param_sums``)."""
    head, output = _end_params(model, tp)
    return [
        params + head * first + output * last
        for params, first, last in stage_layer_param_sums(model, pp, v_shaped=v_shaped)
    ]


def _end_params(model: ModelSpec, tp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per entry of ``tp``, the parameters the first stage adds (input embedding and learned
    positions) and those the last adds (the untied output layer): ``stage_dense_params``."""
    h = model.hidden_size
    embedding = padded_vocab(model, tp) * h
    positions = model.max_position_embeddings * h * int(model.learned_position_embeddings)
    output = embedding * (0.0 if model.tied_embeddings else 1.0)
    return embedding + positions, output


@functools.lru_cache(maxsize=1024)
def _ends_and_rest(model: ModelSpec, pp: int, v_shaped: bool) -> tuple[tuple, float]:
    """``stage_layer_param_sums`` split into the ranks that hold an end (first or last stage:
    at most two) and the most parameters of the others (``-inf`` without one). Those others'
    ``stage_dense_params`` are their layer sums exactly (``+ 0.0`` twice), so the most loaded
    rank is the largest of the ends' values and that one number. Memoised as
    ``stage_layer_param_sums``."""
    sums = stage_layer_param_sums(model, pp, v_shaped=v_shaped)
    ends = tuple(s for s in sums if s[1] or s[2])
    return ends, max((s[0] for s in sums if not (s[1] or s[2])), default=-np.inf)


def stage_moe_layers(model: ModelSpec, pp: int) -> list[int]:
    """Per stage of a ``pp``-stage pipeline, its MoE layers (MTP ones included)."""
    return [
        sum(n for kind, n in counts.items() if kind.endswith("/moe"))
        for counts in all_stage_kinds(model, pp)
    ]


def first_stage_dense_params(
    model: ModelSpec, tp: np.ndarray, pp: np.ndarray, v_shaped: np.ndarray | bool = False
) -> np.ndarray:
    """Dense-grid parameters on one rank of the most loaded stage (``stage_dense_params`` / tp;
    Megatron ``theoretical_memory_usage.py``, "most loaded model shard"; for a uniform model
    that is the first stage, as there); both ends on rank 0 for the rows of a V-shaped
    schedule."""
    tp, pp, v_shaped = np.broadcast_arrays(
        np.atleast_1d(np.asarray(tp, dtype=np.float64)),
        np.atleast_1d(np.asarray(pp)),
        np.atleast_1d(np.asarray(v_shaped, dtype=bool)),
    )
    tp_values, tp_at = _distinct(tp)
    pp_values, pp_at = _distinct(pp)
    n = len(pp_values)
    codes, at = _distinct((tp_at * n + pp_at) * 2 + v_shaped)
    tps, pps = tp_values.tolist(), pp_values.tolist()
    combos = tuple((tps[c // (2 * n)], int(pps[c // 2 % n]), bool(c % 2)) for c in codes.tolist())
    return _most_loaded_params(model, combos)[at] / tp


def _distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of a 1-D array without NaN, the inverse
    found by ``searchsorted`` (half the time on a grid's few hundred keys)."""
    distinct = np.unique(values)
    return distinct, np.searchsorted(distinct, values)


@functools.lru_cache(maxsize=4096)
def _most_loaded_params(model: ModelSpec, combos: tuple[tuple[float, int, bool], ...]):
    """Per ``(tp, pp, v_shaped)`` of ``combos``, the dense-grid parameters of the most loaded
    rank over all its TP ranks: the largest of ``stage_dense_params`` (``_ends_and_rest``),
    each computed as there on a one-element ``tp``. Memoised: a pure function of the frozen
    model and a tuple of scalars (a grid's distinct keys), asked by every dense memory, DP and
    optimizer term of a solve; the array is read-only."""
    out = np.zeros(len(combos))
    for i, (tp, pp, v_shaped) in enumerate(combos):
        ends, most = _ends_and_rest(model, pp, v_shaped)
        head, output = _end_params(model, np.array([tp]))
        for params, first, last in ends:
            most = max(most, float((params + head * first + output * last)[0]))
        out[i] = most
    out.flags.writeable = False
    return out


def dense_shard_degree(grid: Grid, ctx: TermContext, *, megatron_compatible: bool) -> np.ndarray:
    """Ranks the dense optimizer state is sharded over: ``dp*cp = num_gpus/(tp*pp)``, or ``dp``
    in Megatron-compatible mode."""
    tp, pp, cp = axes_of(grid, "tp", "pp", "cp")
    degree = ctx.training.num_gpus / (tp * pp)
    return degree / cp if megatron_compatible else degree


@dataclass(frozen=True, slots=True, kw_only=True)
class DenseParamMemory:
    """Weights, gradients or optimizer states of the dense grid on the most loaded rank.

    ``part`` is one of ``weights`` (2 B/param), ``gradients`` (4 B), ``optimizer`` (12 B); the
    ZeRO stage at which that part is sharded over ``dp*cp`` is 3, 2 and 1 respectively."""

    part: str
    name: str = ""
    category: str = ""
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "zero", "schedule")
    megatron_compatible: bool = False

    def __post_init__(self) -> None:
        assert self.part in _PARTS, self.part
        object.__setattr__(self, "name", self.name or f"dense_{self.part}_bytes")
        object.__setattr__(self, "category", self.category or self.part)

    def depends_on_in(self, domains) -> tuple[str, ...]:
        """Without ``schedule`` in a space with no V-shaped schedule."""
        return without_unread(self.depends_on, domains, ("schedule",), V_SHAPED)

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, pp, zero = axes_of(grid, "tp", "pp", "zero")
        params = first_stage_dense_params(ctx.model, tp, pp, v_shaped_rows(grid))
        bytes_per_param, stage = part_bytes_per_param(self.part, ctx)
        shards = dense_shard_degree(grid, ctx, megatron_compatible=self.megatron_compatible)
        total = params * bytes_per_param / np.where(zero >= stage, shards, 1.0)
        if self.part == "weights" and not self.megatron_compatible:
            # ZeRO-3 gathers the next layer while computing this one (prefetch): 2 layers.
            gathered = 2.0 * dense_layer_params(ctx.model) / tp * BYTES_WEIGHT
            total = total + np.where(zero >= 3, gathered, 0.0)
        return total


_PARTS: dict[str, tuple[float | None, int]] = {
    "weights": (BYTES_WEIGHT, 3),
    "gradients": (None, 2),  # TrainingSpec.grad_bytes: FP32 main_grad (Megatron) or BF16 (NeMo)
    "optimizer": (BYTES_OPTIMIZER, 1),
}


def part_bytes_per_param(part: str, ctx: TermContext) -> tuple[float, int]:
    """Bytes per parameter of ``part`` and the ZeRO stage from which it is sharded. With BF16
    Adam moments (``StackSpec.optimizer_state_dtype``) the optimizer keeps 4 + 2 + 2 bytes."""
    bytes_per_param, stage = _PARTS[part]
    if part == "optimizer" and ctx.training.stack.optimizer_state_dtype == "bf16":
        return BYTES_OPTIMIZER - 4.0, stage
    return (ctx.training.grad_bytes if bytes_per_param is None else bytes_per_param), stage


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertParamMemory:
    """Routed-expert weights, gradients or optimizer states on one rank: ``E/ep`` experts of width
    ``ffn/etp`` for ``moe_layers/pp`` layers, sharded over expert-DP
    ``num_gpus/(etp*ep*pp)`` at the same ZeRO stages as ``DenseParamMemory``."""

    part: str
    name: str = ""
    category: str = ""
    depends_on: tuple[str, ...] = ("pp", "ep", "etp", "zero")

    def __post_init__(self) -> None:
        assert self.part in _PARTS, self.part
        object.__setattr__(self, "name", self.name or f"expert_{self.part}_bytes")
        object.__setattr__(self, "category", self.category or self.part)

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        pp, ep, etp, zero = axes_of(grid, "pp", "ep", "etp", "zero")
        model = ctx.model
        if not model.is_moe:
            return np.zeros(len(pp))
        params = stage_expert_layers(model, grid["pp"]) * expert_params(model) / (ep * etp)
        bytes_per_param, stage = part_bytes_per_param(self.part, ctx)
        shards = ctx.training.num_gpus / (etp * ep * pp)
        return params * bytes_per_param / np.where(zero >= stage, shards, 1.0)


def stage_expert_layers(model: ModelSpec, pp: np.ndarray) -> np.ndarray:
    """MoE layers (MTP ones included) on the stage that holds the most of them."""
    pp = np.atleast_1d(np.asarray(pp))
    out = np.zeros(len(pp))
    for value in np.unique(pp):
        out[pp == value] = max(stage_moe_layers(model, int(value)))
    return out


def micro_batch_logits_bytes(grid: Grid, ctx: TermContext) -> np.ndarray:
    """Logits of one micro-batch for the loss on one rank of the last stage: ``s*b*V/(t*cp)``
    elements at ``LOGITS_BYTES_PER_ELEMENT``, the vocabulary padded to ``128 * tp``."""
    tp, cp, mbs = axes_of(grid, "tp", "cp", "mbs")
    tokens = mbs * ctx.training.seq_len / cp
    return tokens * padded_vocab(ctx.model, tp) / tp * LOGITS_BYTES_PER_ELEMENT


@dataclass(frozen=True, slots=True, kw_only=True)
class LogitsMemory:
    """Logits of one micro-batch for the loss (``micro_batch_logits_bytes``, the OOM culprit
    with 128k vocabularies). They live on the last stage, which under 1F1B holds one
    micro-batch at a time; with ``pp > 1`` the first stage's ``pp`` in-flight micro-batches
    dominate, so this counts only when ``pp == 1`` (as Megatron's estimator does). Under the
    other schedules (GPipe and Looped BFS hold every micro-batch's logits, a V puts the last
    stage on the first rank) the activation peak counts them with the last stage's
    micro-batches (``activations.LayerActivationMemory``, ``shapes.peak_in_flight_stage_bytes``
    ``last_stage_extra``); those rows have ``pp > 1``."""

    name: str = "logits_bytes"
    category: str = "activations"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "mbs")

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        (pp,) = axes_of(grid, "pp")
        return np.where(pp == 1, micro_batch_logits_bytes(grid, ctx), 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkspaceMemory:
    """The memory a training process holds besides its tensors, kept free on every GPU whatever
    the layout (DESIGN §4 "workspace ... allocator fragmentation"): ``CUDA_CONTEXT_BYTES +
    NCCL_BUFFER_BYTES + ALLOCATOR_FRAGMENTATION * memory``, 4.4 GiB on an 80 GB H100. Its own
    memory category, ``reserve``, shows next to the capacity. The published runs bound it: the
    tightest, Nemotron-4 340B FP8 at TP 8 PP 8 VP 12 on H100 (NeMo 24.07), leaves 4.7 GiB for it
    beside its predicted tensors, the next 8.4 GiB (``benchmarks/README.md``, reserve)."""

    name: str = "workspace_bytes"
    category: str = "reserve"
    depends_on: tuple[str, ...] = ()

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        fragmentation = ALLOCATOR_FRAGMENTATION * ctx.cluster.gpu.memory_bytes
        return np.asarray(CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES + fragmentation)
