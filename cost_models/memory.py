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

**Activations** (Korthikanti et al. 2022, Table 2, derived tensor by tensor so GQA, SwiGLU,
squared-ReLU and MoE follow from the shapes), bytes per token of one layer, ``t = tp``:

- outside the TP region (divided by ``t`` only with sequence parallelism): norm inputs ``2*2h``,
  QKV input ``2h``, FC1 input ``2h``, two dropout masks ``2*1h`` (Megatron's default dropout 0.1)
  = ``10h`` (Korthikanti's 10);
- inside the TP region (divided by ``t``): Q, K, V ``2*(q + 2kv)``, attention output ``2q``,
  FC1 output ``2*up`` (gate and up for SwiGLU), FC2 input ``2f``; for MHA + GELU with ``f = 4h``
  this is Korthikanti's ``24/t``; plus ``5*a*s`` for materialised scores when neither flash
  attention nor recompute of the core is used, and the FP32 log-sum-exp ``4*a`` with flash
  attention;
- full recompute keeps only each layer's input ``2h`` (``/t`` with SP) plus one layer's full
  activations while it is recomputed (``RecomputeWorkspaceMemory``).

The sequence is ``s / cp`` (CP shards every activation; Megatron's estimator ignores CP).

**Megatron-compatible mode** (``megatron_compatible=True``) reproduces
``theoretical_memory_usage.py`` for the golden test (DESIGN §6): per layer ``s*b*h*(18 + 4f/h)/t``
with SP + selective recompute (this ignores GQA and counts SwiGLU's ``f`` once), else
``s*b*h*(10 + 24/t) * 1.05``; optimizer sharded over ``dp``; full ``s`` under CP; no logits,
workspace or recompute working set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.specs import GIB, ModelSpec
from autopar.terms import Grid, TermContext
from cost_models.compute import mlp_up_width
from cost_models.flops import RECOMPUTE_FULL, RECOMPUTE_SELECTIVE
from cost_models.pipeline import first_stage_layers
from cost_models.shapes import (
    dense_block_params,
    dense_layer_params,
    expert_params,
    kv_size,
    padded_vocab,
    query_size,
    stage_layers,
)
from cost_models.switches import switch

BYTES_WEIGHT = 2.0
"""BF16 model weights (FP8 training keeps BF16 weights; casts are transient)."""
BYTES_OPTIMIZER = 12.0
"""FP32 master weights + Adam first and second moments."""
MEGATRON_ACTIVATION_OVERHEAD = 1.05
"""Megatron ``compute_activation_memory_without_sp``: 5% for temporaries."""
CUDA_CONTEXT_BYTES = 1.0 * GIB
"""CUDA context, cuBLAS / cuDNN workspaces and handles (order of 0.5-1 GiB per process)."""
NCCL_BUFFER_BYTES = 1.0 * GIB
"""NCCL channel buffers of the TP, DP, PP (and CP/EP) communicators (NCCL_BUFFSIZE 4 MiB per
channel and peer; several communicators)."""
ALLOCATOR_FRAGMENTATION = 0.03
"""Share of device memory the PyTorch caching allocator holds but cannot hand out (block
rounding and split blocks; ``torch.cuda.memory_reserved() - memory_allocated()`` at steady state
is typically a few percent in Megatron runs). A layout planned to the last GiB runs out of
memory in practice; for more headroom set ``memory_reserve_gib`` in the cluster file."""
LOGITS_BYTES_PER_ELEMENT = 6.0
"""Logits kept for the loss: BF16 output of the output layer and the FP32 softmax that the
vocab-parallel cross entropy saves for backward (Megatron ``cross_entropy.py``)."""


def _axes(grid: Grid, *names: str) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(grid[name], dtype=np.float64) for name in names)


def fp8_linear_gemms(ctx: TermContext) -> frozenset[str]:
    """The linear layers that run in FP8 (empty in BF16 training)."""
    if ctx.training.precision != "fp8":
        return frozenset()
    return frozenset(ctx.training.stack.fp8_gemms)


def first_stage_dense_params(model: ModelSpec, tp: np.ndarray, pp: np.ndarray) -> np.ndarray:
    """Dense-grid parameters on one rank of the first stage: its layers, the input embedding
    (and learned positions), and the output layer when ``pp == 1`` and embeddings are untied
    (Megatron ``theoretical_memory_usage.py``, "most loaded model shard")."""
    h = model.hidden_size
    embedding = padded_vocab(model, tp) * h
    positions = model.max_position_embeddings * h * int(model.learned_position_embeddings)
    output = np.where((pp == 1) & (not model.tied_embeddings), embedding, 0.0)
    stage_share = first_stage_layers(model.num_layers, pp) / model.num_layers
    return (dense_block_params(model) * stage_share + embedding + positions + output) / tp


def dense_shard_degree(grid: Grid, ctx: TermContext, *, megatron_compatible: bool) -> np.ndarray:
    """Ranks the dense optimizer state is sharded over: ``dp*cp = num_gpus/(tp*pp)``, or ``dp``
    in Megatron-compatible mode."""
    tp, pp, cp = _axes(grid, "tp", "pp", "cp")
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
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "zero")
    megatron_compatible: bool = False

    def __post_init__(self) -> None:
        assert self.part in _PARTS, self.part
        object.__setattr__(self, "name", self.name or f"dense_{self.part}_bytes")
        object.__setattr__(self, "category", self.category or self.part)

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, pp, zero = _axes(grid, "tp", "pp", "zero")
        params = first_stage_dense_params(ctx.model, tp, pp)
        bytes_per_param, stage = _bytes_per_param(self.part, ctx)
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


def _bytes_per_param(part: str, ctx: TermContext) -> tuple[float, int]:
    """Bytes per parameter of ``part`` and the ZeRO stage from which it is sharded."""
    bytes_per_param, stage = _PARTS[part]
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
        pp, ep, etp, zero = _axes(grid, "pp", "ep", "etp", "zero")
        model = ctx.model
        if not model.is_moe:
            return np.zeros(len(pp))
        params = stage_layers(model.num_moe_layers, pp) * expert_params(model) / (ep * etp)
        bytes_per_param, stage = _bytes_per_param(self.part, ctx)
        shards = ctx.training.num_gpus / (etp * ep * pp)
        return params * bytes_per_param / np.where(zero >= stage, shards, 1.0)


def layer_activation_bytes_per_token(
    model: ModelSpec,
    *,
    tp: np.ndarray,
    sp: np.ndarray,
    keys: np.ndarray,
    flash_attention: bool,
    dropout: bool,
    recompute: np.ndarray,
    fp8_gemms: frozenset[str] = frozenset(),
) -> np.ndarray:
    """Bytes one dense layer keeps per token of a micro-batch for backward (module docstring).

    ``keys`` is the attention span (``s``); it matters only for materialised scores.
    ``fp8_gemms`` names the linear layers that run in FP8: Transformer Engine saves their input
    for the weight gradient as the FP8 copy it already made (1 B/element instead of 2;
    ``transformer_engine/pytorch/module/linear.py`` and ``layernorm_linear.py`` save the
    quantised ``inputmat`` / ``ln_out``): QKV input ``h``, FC1 input ``h``, FC2 input ``f`` halve;
    the output projection's FP8 input (``q`` bytes) is kept besides the BF16 attention output
    that flash attention saves (``dot_product_attention``)."""
    h, q, kv = model.hidden_size, query_size(model), kv_size(model)
    f = model.ffn_hidden_size
    heads = model.num_attention_heads
    qkv_in = 1.0 if "qkv" in fp8_gemms else 2.0
    fc1_in = 1.0 if "fc1" in fp8_gemms else 2.0
    fc2_in = 1.0 if "fc2" in fp8_gemms else 2.0
    outside = (4.0 + qkv_in + fc1_in + (2.0 if dropout else 0.0)) * h
    inside = 2.0 * (q + 2 * kv) + (3.0 if "proj" in fp8_gemms else 2.0) * q
    inside = inside + 2.0 * mlp_up_width(model, f) + fc2_in * f
    scores = 4.0 * heads if flash_attention else 5.0 * heads * keys
    stores_scores = flash_attention | (np.asarray(recompute) == 0)
    inside = inside + np.where(stores_scores, scores, 0.0)
    sp_divisor = np.where(np.asarray(sp) == 1, tp, 1.0)
    full_layer = outside / sp_divisor + inside / tp
    return np.where(np.asarray(recompute) == RECOMPUTE_FULL, 2.0 * h / sp_divisor, full_layer)


def megatron_layer_activation_bytes_per_token(
    model: ModelSpec, *, tp: np.ndarray, sp: np.ndarray, recompute: np.ndarray
) -> np.ndarray:
    """Megatron ``theoretical_memory_usage.py``: ``h*(18 + 4f/h)/t`` with SP + selective,
    else ``h*(10 + 24/t)`` (times 1.05, applied by the caller)."""
    h, f = model.hidden_size, model.ffn_hidden_size
    with_sp = (np.asarray(sp) == 1) & (np.asarray(recompute) == RECOMPUTE_SELECTIVE)
    return np.where(with_sp, h * (18.0 + 4.0 * f / h) / tp, h * (10.0 + 24.0 / tp))


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerActivationMemory:
    """Activations of one micro-batch on the first stage: ``num_layers/pp`` layers (attention of
    every layer, MLP of the dense ones; MoE MLPs are ``ExpertActivationMemory``), plus the
    embedding's dropout mask and token ids (Megatron: ``8*s*b + s*b*h`` per micro-batch)."""

    name: str = "layer_activations_bytes"
    category: str = "activations"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "mbs", "recompute", "sp")
    flash_attention: bool | None = None
    dropout: bool | None = None
    """Dropout masks (Megatron's default ``--hidden-dropout 0.1``); ``None``: as the stack says
    (NeMo and Megatron-Bridge recipes train without dropout)."""
    megatron_compatible: bool = False

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, pp, cp, mbs = _axes(grid, "tp", "pp", "cp", "mbs")
        model, s = ctx.model, ctx.training.seq_len
        if self.megatron_compatible:
            return self._megatron(grid, ctx)
        tokens = mbs * s / cp
        dropout = switch(self.dropout, ctx, "dropout")
        fp8 = fp8_linear_gemms(ctx)
        per_token = layer_activation_bytes_per_token(
            model,
            tp=tp,
            sp=grid["sp"],
            keys=s,
            flash_attention=switch(self.flash_attention, ctx, "flash_attention"),
            dropout=dropout,
            recompute=grid["recompute"],
            fp8_gemms=fp8,
        )
        moe_share = model.num_moe_layers / model.num_layers
        fc2_in = 1.0 if "fc2" in fp8 else 2.0
        mlp = (
            2.0 * mlp_up_width(model, model.ffn_hidden_size) + fc2_in * model.ffn_hidden_size
        ) / tp
        mlp = np.where(np.asarray(grid["recompute"]) == RECOMPUTE_FULL, 0.0, mlp)
        layers = first_stage_layers(model.num_layers, pp) * tokens * (per_token - moe_share * mlp)
        sp_divisor = np.where(np.asarray(grid["sp"]) == 1, tp, 1.0)
        embedding = tokens * (8.0 + (model.hidden_size if dropout else 0.0) / sp_divisor)
        return layers + embedding

    def _megatron(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, pp, mbs = _axes(grid, "tp", "pp", "mbs")
        model, s = ctx.model, ctx.training.seq_len
        tokens = mbs * s
        per_token = megatron_layer_activation_bytes_per_token(
            model, tp=tp, sp=grid["sp"], recompute=grid["recompute"]
        )
        with_sp = (np.asarray(grid["sp"]) == 1) & (
            np.asarray(grid["recompute"]) == RECOMPUTE_SELECTIVE
        )
        embedding = tokens * (8.0 + model.hidden_size)
        vocab = padded_vocab(model, tp)
        logits_sp = tokens * model.hidden_size * 4.0 * (1.0 + vocab / model.hidden_size) / tp
        logits_no_sp = 2.0 * (tokens * vocab / tp + tokens * model.hidden_size)
        logits = np.where(pp == 1, np.where(with_sp, logits_sp, logits_no_sp), 0.0)
        layers = stage_layers(model.num_layers, pp) * tokens * per_token
        with_sp_total = layers + embedding / tp + logits
        without_sp_total = (layers + embedding + logits) * MEGATRON_ACTIVATION_OVERHEAD
        return np.where(with_sp, with_sp_total, without_sp_total)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertActivationMemory:
    """MoE-layer MLP activations of one micro-batch on the first stage. Per routed token copy
    (``top_k`` per token; ``mbs*s/(tp*cp)`` tokens per rank with SP): the permuted input and the
    expert output before un-permutation (``2*2h``), FC1 output ``2*up`` and FC2 input ``2f`` of the
    expert; plus the shared expert as a dense TP MLP and the router's FP32 logits. Full recompute
    keeps nothing here (the layer input is counted by ``LayerActivationMemory``)."""

    name: str = "expert_activations_bytes"
    category: str = "activations"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "mbs", "recompute")

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, pp, cp, mbs = _axes(grid, "tp", "pp", "cp", "mbs")
        model = ctx.model
        if not model.is_moe:
            return np.zeros(len(tp))
        tokens = mbs * ctx.training.seq_len / cp
        fe = model.expert_ffn_hidden_size
        copy = 4.0 * model.hidden_size + 2.0 * mlp_up_width(model, fe) + 2.0 * fe
        routed = tokens / tp * model.experts_per_token * copy
        fs = model.shared_expert_ffn_hidden_size
        shared = tokens * (2.0 * mlp_up_width(model, fs) + 2.0 * fs) / tp if fs else 0.0
        router = tokens / tp * 4.0 * model.num_experts
        per_layer = routed + shared + router
        full = np.asarray(grid["recompute"]) == RECOMPUTE_FULL
        return np.where(full, 0.0, stage_layers(model.num_moe_layers, pp) * per_layer)


@dataclass(frozen=True, slots=True, kw_only=True)
class LogitsMemory:
    """Logits of one micro-batch for the loss, ``s*b*V/t`` elements at ``LOGITS_BYTES_PER_ELEMENT``
    (the OOM culprit with 128k vocabularies). They live on the last stage, which holds one
    micro-batch at a time; with ``pp > 1`` the first stage's ``pp`` in-flight micro-batches
    dominate, so this counts only when ``pp == 1`` (as Megatron's estimator does)."""

    name: str = "logits_bytes"
    category: str = "activations"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "mbs")

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, pp, cp, mbs = _axes(grid, "tp", "pp", "cp", "mbs")
        tokens = mbs * ctx.training.seq_len / cp
        logits = tokens * padded_vocab(ctx.model, tp) / tp * LOGITS_BYTES_PER_ELEMENT
        return np.where(pp == 1, logits, 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecomputeWorkspaceMemory:
    """With full recompute, one layer's complete activations exist while that layer is
    recomputed and back-propagated (Korthikanti et al. 2022 §4.1: "memory to store the
    activations of one layer")."""

    name: str = "recompute_workspace_bytes"
    category: str = "activations"
    depends_on: tuple[str, ...] = ("tp", "cp", "mbs", "recompute", "sp")
    flash_attention: bool | None = None

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, cp, mbs = _axes(grid, "tp", "cp", "mbs")
        s = ctx.training.seq_len
        none = np.zeros(len(tp))
        per_token = layer_activation_bytes_per_token(
            ctx.model,
            tp=tp,
            sp=grid["sp"],
            keys=s,
            flash_attention=switch(self.flash_attention, ctx, "flash_attention"),
            dropout=ctx.training.stack.dropout,
            recompute=none,
            fp8_gemms=fp8_linear_gemms(ctx),
        )
        full = np.asarray(grid["recompute"]) == RECOMPUTE_FULL
        return np.where(full, mbs * s / cp * per_token, 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkspaceMemory:
    """CUDA context and library workspaces, NCCL buffers and the caching allocator's
    fragmentation: ``CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES + ALLOCATOR_FRAGMENTATION * memory``
    regardless of the layout (DESIGN §4 "workspace ... allocator fragmentation")."""

    name: str = "workspace_bytes"
    category: str = "other"
    depends_on: tuple[str, ...] = ()

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        fragmentation = ALLOCATOR_FRAGMENTATION * ctx.cluster.gpu.memory_bytes
        return np.asarray(CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES + fragmentation)
