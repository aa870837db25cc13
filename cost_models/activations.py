"""Activation memory of the most loaded rank (DESIGN §4 "Memory per GPU"): what each layer keeps
for its backward per token, the layers and micro-batches held at the peak, and the one layer
recomputed at a time under full recompute.

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
``s*b*h*(10 + 24/t) * 1.05``; full ``s`` under CP; no recompute working set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.base.axes import PIPELINE_SCHEDULES
from autopar.costs.terms import Grid, TermContext
from autopar.inputs.specs import ModelSpec
from autopar.inputs.stack import DEFAULT_RECOMPUTE_MODULES
from cost_models.compute import mlp_up_width
from cost_models.flops import RECOMPUTE_FULL, RECOMPUTE_SELECTIVE, attention_keys
from cost_models.gemm import FP4_GEMMS, OPERAND_BYTES, gemm_dtype
from cost_models.memory import axes_of, micro_batch_logits_bytes, without_unread
from cost_models.shapes import (
    ONE_F_ONE_B,
    kv_size,
    mamba_in_proj_size,
    padded_vocab,
    peak_in_flight_stage_bytes,
    query_size,
    stage_layers,
)
from cost_models.switches import switch

MEGATRON_ACTIVATION_OVERHEAD = 1.05
"""Megatron ``compute_activation_memory_without_sp``: 5% for temporaries."""
SCHEDULE_AXES: tuple[str, ...] = ("vpp", "grad_accum", "schedule")
"""What the activations held at the peak depend on besides the stage (the schedule's order)."""


def _unless_one_f_one_b(depends_on: tuple[str, ...], domains) -> tuple[str, ...]:
    """``depends_on`` without the schedule's axes when every schedule of the space is 1F1B-like
    (the held activations are then the stage-level count, ``shapes.ONE_F_ONE_B``)."""
    others = set(PIPELINE_SCHEDULES) - set(ONE_F_ONE_B)
    return without_unread(depends_on, domains, SCHEDULE_AXES, others)


def _schedule_of(grid: Grid) -> dict[str, np.ndarray]:
    """The schedule's axes of ``grid``; none (1F1B's count) for a caller that reads one
    micro-batch's bytes without them (``offload.OffloadTime``)."""
    if not all(axis in grid for axis in SCHEDULE_AXES):
        return {}
    return {axis: np.asarray(grid[axis]) for axis in SCHEDULE_AXES}


def fp8_linear_gemms(ctx: TermContext) -> frozenset[str]:
    """The linear layers (``FP4_GEMMS``: qkv, proj, fc1, fc2) whose inputs Transformer Engine
    keeps as a low-precision copy for backward: those ``gemm_dtype`` runs in FP8 or FP4 (none
    in BF16 training)."""
    return frozenset(gemm for gemm in FP4_GEMMS if gemm_dtype(ctx, gemm) != "bf16")


def saved_copy_bytes(ctx: TermContext) -> float:
    """Bytes per element of the low-precision copy TE keeps of a layer's input for the weight
    gradient: FP8 1 (MXFP8 plus an E8M0 scale per 32), NVFP4 the column-wise FP4 copy with its
    E4M3 scale per 16 (``OPERAND_BYTES``)."""
    if ctx.training.precision == "nvfp4":
        return OPERAND_BYTES["fp4"]
    return 1.0 + (1.0 / 32.0 if ctx.training.stack.fp8_recipe == "mxfp8" else 0.0)


def offload_share(ctx: TermContext) -> float:
    """Share of the layers' activations that stays on the GPU with ``cpu_offload_layers`` of
    ``L`` offloaded: ``(L - N) / L`` (Transformer Engine ``cpu_offload.py``
    ``get_cpu_offload_context``, L748-751: "activation memory usage is equal to (num_layers -
    num_offloaded_layers) * T"). Megatron allows it with ``pp == 1`` only
    (``rules._offload_rules``)."""
    layers = ctx.model.num_layers
    return (layers - min(ctx.training.stack.cpu_offload_layers, layers)) / layers


def mixer_activation_bytes_per_token(
    model: ModelSpec,
    mixer: str,
    *,
    keys: np.ndarray,
    flash_attention: bool,
    stores_scores,
    recompute: np.ndarray,
    fp8_gemms: frozenset[str] = frozenset(),
    copy_bytes: float = 1.0,
    modules: frozenset[str] = frozenset(DEFAULT_RECOMPUTE_MODULES),
) -> tuple[float | np.ndarray, float | np.ndarray]:
    """(outside the TP region, inside it) bytes one token mixer keeps per token (module
    docstring): its norm input and its input outside; inside, attention keeps Q, K, V and its
    output (and the scores or the log-sum-exp). MLA also keeps its two latents (replicated
    over TP: counted outside); under selective recompute it re-runs the up-projections and
    the core from them (Megatron ``--recompute-modules mla_up_proj core_attn``) and keeps only
    the core's output. Mamba-2 runs Megatron's memory-efficient path
    (``mamba_split_conv1d_scan_combined``, ``ssm/mamba_mixer.py``), which keeps the in_proj
    output and recomputes the conv and scan internals, plus the scan output and the gated
    norm's output (the out_proj input). ``fp8_gemms``: Transformer Engine saves an FP8 layer's
    input as its FP8 copy (``copy_bytes``: 1 B/element; ``LayerNormLinear.ln_out``,
    ``Linear.inputmat``; NVFP4 0.5625), and keeps the output projection's low-precision input
    besides the BF16 attention output. ``modules``: what selective recompute re-runs
    (``StackSpec.recompute_modules``)."""
    h = model.hidden_size
    if mixer == "none":
        return 0.0, 0.0
    outside = (2.0 + (copy_bytes if "qkv" in fp8_gemms else 2.0)) * h
    proj_in = copy_bytes if "proj" in fp8_gemms else 2.0
    if mixer == "mamba":
        inner = model.mamba_inner_size
        return outside, 2.0 * mamba_in_proj_size(model) + (2.0 + proj_in) * inner
    heads = model.num_attention_heads
    scores = 4.0 * heads if flash_attention else 5.0 * heads * keys
    scores = np.where(stores_scores, scores, 0.0)
    if mixer == "mla":
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        latents = 2.0 * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)
        output = (1.0 + proj_in) * heads * model.v_head_dim
        inside = 2.0 * heads * (qk + qk + model.v_head_dim) + output + scores
        selective = (np.asarray(recompute) == RECOMPUTE_SELECTIVE) & ("mla_up_proj" in modules)
        return outside + latents, np.where(selective, output, inside)
    q, kv = query_size(model), kv_size(model)
    attention_out = 2.0 + proj_in if "proj" in fp8_gemms else 2.0
    return outside, 2.0 * (q + 2 * kv) + attention_out * q + scores


def kind_activation_bytes_per_token(
    model: ModelSpec,
    kind: str,
    *,
    tp: np.ndarray,
    sp: np.ndarray,
    keys: np.ndarray,
    flash_attention: bool,
    dropout: bool,
    recompute: np.ndarray,
    fp8_gemms: frozenset[str] = frozenset(),
    copy_bytes: float = 1.0,
    modules: frozenset[str] = frozenset(DEFAULT_RECOMPUTE_MODULES),
) -> np.ndarray:
    """Bytes one layer of ``kind`` keeps per token for backward, its MoE experts excepted
    (``ExpertActivationMemory``); ``keys`` is the attention span (it matters only for
    materialised scores); ``fp8_gemms`` as ``mixer_activation_bytes_per_token`` (FC1 and FC2
    inputs at 1 B when they run in FP8). Selective recompute of ``layernorm`` (in ``modules``)
    drops the two norms' outputs: each is re-run from its input, which stays (Megatron
    ``transformer_layer.py``, output-discarding checkpoints)."""
    mixer, _, ffn = kind.partition("/")
    h = model.hidden_size
    recompute = np.asarray(recompute)
    stores_scores = flash_attention | (recompute == 0)
    outside, inside = mixer_activation_bytes_per_token(
        model,
        mixer,
        keys=keys,
        flash_attention=flash_attention,
        stores_scores=stores_scores,
        recompute=recompute,
        fp8_gemms=fp8_gemms,
        copy_bytes=copy_bytes,
        modules=modules,
    )
    norms = (recompute == RECOMPUTE_SELECTIVE) & ("layernorm" in modules)
    if mixer not in ("none", "mamba"):
        outside = outside - np.where(norms, (copy_bytes if "qkv" in fp8_gemms else 2.0) * h, 0.0)
    if ffn == "moe":
        # norm input and the router / dispatcher input (the norm's output)
        outside = outside + np.where(norms, 2.0, 4.0) * h
    if ffn == "dense":
        fc1_in = np.where(norms, 0.0, copy_bytes if "fc1" in fp8_gemms else 2.0)
        outside = outside + (2.0 + fc1_in) * h
        inside = inside + 2.0 * mlp_up_width(model, model.ffn_hidden_size)
        inside = inside + (copy_bytes if "fc2" in fp8_gemms else 2.0) * model.ffn_hidden_size
    sublayers = (mixer != "none") + (ffn != "none")
    outside = outside + (1.0 * h if dropout else 0.0) * sublayers
    sp_divisor = np.where(np.asarray(sp) == 1, tp, 1.0)
    full_layer = outside / sp_divisor + inside / tp
    return np.where(np.asarray(recompute) == RECOMPUTE_FULL, 2.0 * h / sp_divisor, full_layer)


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
    """Bytes one dense attention layer keeps per token of a micro-batch for backward (module
    docstring)."""
    return kind_activation_bytes_per_token(
        model,
        "attention/dense",
        tp=tp,
        sp=sp,
        keys=keys,
        flash_attention=flash_attention,
        dropout=dropout,
        recompute=recompute,
        fp8_gemms=fp8_gemms,
    )


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
    """Activations of one micro-batch on the stage whose activations in flight peak (the first
    one unless later stages hold more or heavier layers: ``peak_in_flight_stage_bytes``): each
    of its layers by kind (mixers, dense MLPs; MoE MLPs are ``ExpertActivationMemory``), plus the
    embedding's dropout mask and token ids (Megatron: ``8*s*b + s*b*h`` per micro-batch)."""

    name: str = "layer_activations_bytes"
    category: str = "activations"
    depends_on: tuple[str, ...] = (
        "tp",
        "pp",
        "cp",
        "mbs",
        "recompute",
        "sp",
        *SCHEDULE_AXES,
    )
    flash_attention: bool | None = None
    dropout: bool | None = None
    """Dropout masks (Megatron's default ``--hidden-dropout 0.1``); ``None``: as the stack says
    (NeMo and Megatron-Bridge recipes train without dropout)."""
    megatron_compatible: bool = False

    def depends_on_in(self, domains) -> tuple[str, ...]:
        return _unless_one_f_one_b(self.depends_on, domains)

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, pp, cp, mbs = axes_of(grid, "tp", "pp", "cp", "mbs")
        model, s = ctx.model, ctx.training.seq_len
        if self.megatron_compatible:
            return self._megatron(grid, ctx)
        tokens = mbs * s / cp
        flash = switch(self.flash_attention, ctx, "flash_attention")
        dropout = switch(self.dropout, ctx, "dropout")
        fp8 = fp8_linear_gemms(ctx)
        sp_divisor = np.where(np.asarray(grid["sp"]) == 1, tp, 1.0)
        embedding = tokens * (8.0 + (model.hidden_size if dropout else 0.0) / sp_divisor)

        def layer_bytes(kind: str) -> np.ndarray:
            per_token = kind_activation_bytes_per_token(
                model,
                kind,
                tp=tp,
                sp=grid["sp"],
                keys=attention_keys(model, kind.split("/")[0], s),
                flash_attention=flash,
                dropout=dropout,
                recompute=grid["recompute"],
                fp8_gemms=fp8,
                copy_bytes=saved_copy_bytes(ctx),
                modules=frozenset(ctx.training.stack.recompute_modules),
            )
            return tokens * per_token * offload_share(ctx)

        return peak_in_flight_stage_bytes(
            model,
            grid["pp"],
            layer_bytes,
            first_stage_extra=embedding,
            last_stage_extra=micro_batch_logits_bytes(grid, ctx),
            **_schedule_of(grid),
        )

    def _megatron(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, pp, mbs = axes_of(grid, "tp", "pp", "mbs")
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
    """MoE-layer MLP activations of one micro-batch on the stage whose activations in flight peak
    (``peak_in_flight_stage_bytes``). Per routed token copy
    (``top_k`` per token; ``mbs*s/(tp*cp)`` tokens per rank with SP): the permuted input and the
    expert output before un-permutation (``2*2h``), FC1 output ``2*up`` and FC2 input ``2f`` of the
    expert; plus the shared expert as a dense TP MLP and the router's FP32 logits. Full recompute
    keeps nothing here (the layer input is counted by ``LayerActivationMemory``)."""

    name: str = "expert_activations_bytes"
    category: str = "activations"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "mbs", "recompute", *SCHEDULE_AXES)

    def depends_on_in(self, domains) -> tuple[str, ...]:
        return _unless_one_f_one_b(self.depends_on, domains)

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, pp, cp, mbs = axes_of(grid, "tp", "pp", "cp", "mbs")
        model = ctx.model
        if not model.is_moe:
            return np.zeros(len(tp))
        tokens = mbs * ctx.training.seq_len / cp
        fe = model.expert_ffn_hidden_size
        # FP8: Transformer Engine keeps the FP8 copies of the two GEMM inputs for backward.
        fp8, low = fp8_linear_gemms(ctx), saved_copy_bytes(ctx)
        fc1_in = low if "fc1" in fp8 else 2.0
        fc2_in = low if "fc2" in fp8 else 2.0
        h = model.hidden_size
        # selective recompute of moe_act re-runs the activation from FC1's output: FC2's input
        # is not kept
        moe_act = (np.asarray(grid["recompute"]) == RECOMPUTE_SELECTIVE) & (
            "moe_act" in ctx.training.stack.recompute_modules
        )
        fc2_in = np.where(moe_act, 0.0, fc2_in)
        copy = (fc1_in + 2.0) * h + 2.0 * mlp_up_width(model, fe) + fc2_in * fe
        routed = tokens / tp * model.experts_per_token * copy
        fs = model.shared_expert_ffn_hidden_size
        shared = tokens * (2.0 * mlp_up_width(model, fs) + 2.0 * fs) / tp if fs else 0.0
        router = tokens / tp * 4.0 * model.num_experts
        per_layer = routed + shared + router
        full = np.asarray(grid["recompute"]) == RECOMPUTE_FULL
        per_layer = per_layer * offload_share(ctx)
        peak = peak_in_flight_stage_bytes(
            model,
            grid["pp"],
            lambda kind: per_layer if kind.endswith("/moe") else 0.0,
            **_schedule_of(grid),
        )
        return np.where(full, 0.0, peak)


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
        tp, cp, mbs = axes_of(grid, "tp", "cp", "mbs")
        flash = switch(self.flash_attention, ctx, "flash_attention")
        s = ctx.training.seq_len
        none = np.zeros(len(tp))
        per_token = np.zeros(len(tp))
        for kind in set(ctx.model.layer_kinds):
            per_token = np.maximum(
                per_token,
                kind_activation_bytes_per_token(
                    ctx.model,
                    kind,
                    tp=tp,
                    sp=grid["sp"],
                    keys=attention_keys(ctx.model, kind.split("/")[0], s),
                    flash_attention=flash,
                    dropout=ctx.training.stack.dropout,
                    recompute=none,
                    fp8_gemms=fp8_linear_gemms(ctx),
                    copy_bytes=saved_copy_bytes(ctx),
                ),
            )
        full = np.asarray(grid["recompute"]) == RECOMPUTE_FULL
        return np.where(full, mbs * s / cp * per_token, 0.0)
