"""Compute time of one micro-batch on one pipeline stage (DESIGN §4 "Compute time"): the
dense layers (``DenseComputeTime``), the routed experts (``ExpertComputeTime``) and the output
layer with its loss (``LogitsComputeTime``).

GEMMs are priced by ``cost_models.gemm`` (roofline per number format and GPU), the attention core
by ``cost_models.attention``. Per layer forward: QKV, attention core, output projection, MLP,
elementwise (norms, residual adds, dropout, activations, rotary embeddings: bytes / HBM
bandwidth). Backward = 2 x the GEMM FLOPs (data and weight gradients) and 2 x the elementwise
bytes; the flash-attention backward is slower per FLOP than its forward
(``FLASH_BACKWARD_SLOWDOWN``). Recompute adds one forward of the layer (full) or of the
attention core (selective).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from autopar.costs.terms import Grid, Phases, TermContext
from autopar.inputs.specs import ModelSpec
from cost_models.attention import (  # noqa: F401  (re-exported for the other terms)
    FLASH_BACKWARD_SLOWDOWN,
    SCORE_ELEMENTWISE_BYTES,
    attention_core_time_s,
    backward_slowdown,
    flash_block_time_s,
    windowed_backward,
    windowed_keys,
)
from cost_models.flops import (
    RECOMPUTE_FULL,
    RECOMPUTE_SELECTIVE,
    attention_keys,
    kind_flop_per_token,
    logits_flop_per_token,
)
from cost_models.gemm import (  # noqa: F401  (re-exported: the names moved from here)
    BYTES_BF16,
    GEMM_EFFICIENCY,
    GEMM_HALF_DIM,
    H200_FP8_TO_BF16_EFFICIENCY,
    HBM_EFFICIENCY,
    cast_bytes_per_element,
    gemm_dtype,
    gemm_time_s,
    linear_time_s,
    linear_times_s,
    memory_time_s,
)
from cost_models.rope import rope_bytes
from cost_models.shapes import (
    MLA_REPLICATED,
    heaviest_stage,
    kv_size,
    mamba_in_proj_size,
    mla_projection_sizes,
    padded_vocab,
    query_size,
)
from cost_models.switches import switch

NORM_BYTES = 4.0
"""HBM bytes per hidden element of one norm's forward (read the BF16 input, write the output):
what selective ``layernorm`` recompute adds per sublayer."""
HIDDEN_ELEMENTWISE_BYTES = 30.0
"""Bytes moved per hidden-size element per layer, forward, outside the GEMMs: two norms (read +
write, 2 x 4 B), two residual adds (read 2, write 1: 2 x 6 B), two dropouts (read, write, 1-byte
mask: 2 x 5 B). Korthikanti et al. 2022 Table 2 lists the same tensors."""
LOSS_BYTES_PER_LOGIT = 52.0
"""HBM bytes per logit of Megatron's unfused vocab-parallel cross entropy, forward + backward
(``megatron/core/tensor_parallel/cross_entropy.py``): BF16 -> FP32 copy (read 2, write 4), max
(read 4), subtract max (read 4, write 4), exp (read 4, write 4), sum (read 4), normalise to the
softmax kept for backward (read 4, write 4); backward scales it in place (read 4, write 4) and
casts the gradient to BF16 (read 4, write 2)."""
FUSED_LOSS_BYTES_PER_LOGIT = 8.0
"""The same with a fused cross entropy (``StackSpec.cross_entropy_fusion``): the BF16 logits read
twice forward (online max and sum), once backward, and the BF16 gradient written (2 B each)."""
LOSS_FORWARD_BYTES_PER_LOGIT = 38.0
"""The forward's share of ``LOSS_BYTES_PER_LOGIT`` (copy 6, max 4, subtract 8, exp 8, sum 4,
normalise 8; the backward's scale 8 and cast 6 are the rest)."""
FUSED_LOSS_FORWARD_BYTES_PER_LOGIT = 4.0
"""The forward's share of ``FUSED_LOSS_BYTES_PER_LOGIT`` (the two reads of the logits)."""
NATIVE_LOSS_BYTES_PER_LOGIT = 32.0
"""The same for Megatron's ``native`` fused cross entropy (``StackSpec.cross_entropy_impl``;
``fusions/fused_cross_entropy.py`` L12-84 at core_v0.17.0: the arithmetic of
``LOSS_BYTES_PER_LOGIT`` in four ``jit_fuser`` functions, ``torch.compile`` since torch 2.2,
``jit.py`` L16-33, each one fused pass): the BF16 -> FP32 copy with its max (read 2, write 4),
subtract and exp in place with the sum (read 4, write 4), normalise in place (read 4, write 4);
backward, the in-place scaling of the saved softmax and its BF16 cast (read 4, write 4 + 2)."""
NATIVE_LOSS_FORWARD_BYTES_PER_LOGIT = 22.0
"""The forward's share of ``NATIVE_LOSS_BYTES_PER_LOGIT`` (copy 6, exp 8, normalise 8)."""


def mlp_up_width(model: ModelSpec, ffn: int) -> int:
    """Output width of the first MLP GEMM: gate and up for SwiGLU."""
    return (2 if model.gated_mlp else 1) * ffn


def mlp_activation_bytes(model: ModelSpec, ffn_elements: np.ndarray) -> np.ndarray:
    """Forward elementwise bytes of the activation function over ``ffn_elements`` outputs."""
    reads = 2.0 if model.gated_mlp else 1.0
    return BYTES_BF16 * (reads + 1.0) * ffn_elements


EAGER_ACTIVATION_BYTES: dict[str, tuple[float, float]] = {"relu2": (8.0, 20.0)}
"""HBM bytes per MLP-inner element (forward, backward) of an activation that the stack runs as
eager PyTorch ops (``StackSpec.eager_activations``), in place of ``mlp_activation_bytes``'s one
fused pass. ``relu2``, ``torch.pow(F.relu(x), 2)`` without a fuser (NeMo ``nemo/collections/
llm/fn/activation.py`` L34-37 at v2.3.0): forward ``relu`` (read 2, write 2) and ``pow`` (read
2, write 2); backward, autograd's ``pow_backward`` (PyTorch ``FunctionsManual.cpp``: ``grad * (2 *
x.pow(1))``: the copy of ``x.pow(1)`` read 2 write 2, the scale read 2 write 2, the product read
4 write 2) and ``threshold_backward`` for the ReLU (read 4, write 2)."""


def activation_bytes(model: ModelSpec, stack, ffn_elements: np.ndarray) -> tuple:
    """(forward, backward) elementwise bytes of the MLP activation over ``ffn_elements``
    outputs: one fused pass forward and two backward, or the eager op sequence
    (``EAGER_ACTIVATION_BYTES``) for an activation the stack lists in ``eager_activations``."""
    name = model.activation_function
    if name in stack.eager_activations and name in EAGER_ACTIVATION_BYTES:
        forward, backward = EAGER_ACTIVATION_BYTES[name]
        return forward * ffn_elements, backward * ffn_elements
    fused = mlp_activation_bytes(model, ffn_elements)
    return fused, 2.0 * fused


def _two_linears(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, backward, weight-gradient part) of two linear layers in a row, each the sum of
    theirs (``gemm.linear_times_s``)."""
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


def mlp_time_s(
    model: ModelSpec, ffn: int, *, tokens: np.ndarray, tp: np.ndarray, ctx: TermContext
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, backward, its weight-gradient part) of one MLP of inner size ``ffn`` sharded
    over ``tp``."""
    h = model.hidden_size
    up = mlp_up_width(model, ffn) / tp
    down = ffn / tp
    forward, backward, weight = _two_linears(
        linear_times_s(tokens, up, h, ctx=ctx, gemm="fc1"),
        linear_times_s(tokens, h, down, ctx=ctx, gemm="fc2"),
    )
    act_forward, act_backward = activation_bytes(model, ctx.training.stack, tokens * down)
    act_forward, act_backward = memory_time_s(act_forward, ctx), memory_time_s(act_backward, ctx)
    return forward + act_forward, backward + act_backward, weight


def attention_block_time_s(
    model: ModelSpec, *, tokens: np.ndarray, tp: np.ndarray, ctx: TermContext
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, backward, its weight-gradient part) of the QKV and output projections (+ rotary
    embedding)."""
    h, q, kv = model.hidden_size, query_size(model), kv_size(model)
    qkv = (q + 2 * kv) / tp
    forward, backward, weight = _two_linears(
        linear_times_s(tokens, qkv, h, ctx=ctx, gemm="qkv"),
        linear_times_s(tokens, h, q / tp, ctx=ctx, gemm="proj"),
    )
    if model.learned_position_embeddings:
        return forward, backward, weight
    elements = tokens * (q + kv) / tp
    forward_bytes, backward_bytes = rope_bytes(model)
    rope_f = memory_time_s(forward_bytes * elements, ctx)
    return forward + rope_f, backward + memory_time_s(backward_bytes * elements, ctx), weight


def recompute_factor(recompute: np.ndarray, code: int) -> np.ndarray:
    return (np.asarray(recompute) == code).astype(np.float64)


MLA_UP_PROJECTIONS = ("q_up", "q", "kv_up")
"""What Megatron's ``--recompute-modules mla_up_proj`` re-runs (with the RoPE)."""


def mla_time_s(
    model: ModelSpec, *, tokens: np.ndarray, tp: np.ndarray, ctx: TermContext
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(forward, backward, up-projection forward, backward's weight-gradient part) of the MLA
    projections (+ rotary on the RoPE part): the two down-projections run whole on every TP
    rank (``MLA_REPLICATED``), the others split over TP (Megatron ``multi_latent_attention.py``);
    the up-projections are what selective recompute re-runs besides the core."""
    forward = np.zeros_like(np.asarray(tokens, dtype=np.float64))
    backward, up, weight = forward.copy(), forward.copy(), forward.copy()
    for name, (fan_in, fan_out) in mla_projection_sizes(model).items():
        split = 1.0 if name in MLA_REPLICATED else tp
        if name == "out":
            k, n = fan_in / split, fan_out
        else:
            k, n = fan_in, fan_out / split
        gemm = "proj" if name == "out" else "qkv"
        one, back, grad = linear_times_s(tokens, n, k, ctx=ctx, gemm=gemm)
        forward = forward + one
        backward = backward + back
        weight = weight + grad
        if name in MLA_UP_PROJECTIONS:
            up = up + one
    rope = memory_time_s(
        2.0 * BYTES_BF16 * tokens * model.qk_rope_head_dim * (model.num_attention_heads / tp + 1),
        ctx,
    )
    return forward + rope, backward + 2.0 * rope, up + rope, weight


MAMBA_ELEMENTWISE_BYTES = 20.0
"""Bytes per ``d_inner`` element of a Mamba-2 mixer outside its GEMMs and scan, forward: the
causal depthwise conv over x, B, C (read + write, 4 B), its SiLU (4 B), the dt softplus and
``D`` skip (4 B), the gated RMSNorm with the z gate (read 2 x 2, write 2: 6 B), casts (2 B)
(Megatron ``ssm/mamba_mixer.py`` forward)."""


def mamba_time_s(
    model: ModelSpec, *, tokens: np.ndarray, tp: np.ndarray, ctx: TermContext
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, backward, its weight-gradient part) of one Mamba-2 mixer on one rank (heads
    split over TP). The SSD scan's ``7*d_inner*d_state`` FLOPs per token (Megatron
    ``mamba_layer_flops``) run as batched GEMMs over chunks of ``chunk_size`` tokens,
    ``(Q x N) @ (N x P)`` per head (Dao & Gu 2024 §6), so they are timed at the roofline of
    that shape; its backward is twice the forward."""
    h = model.hidden_size
    in_proj = mamba_in_proj_size(model) / tp
    inner = model.mamba_inner_size / tp
    forward, backward, weight = _two_linears(
        linear_times_s(tokens, in_proj, h, ctx=ctx, gemm="qkv"),
        linear_times_s(tokens, h, inner, ctx=ctx, gemm="proj"),
    )
    chunk, p, n = model.mamba_chunk_size, model.mamba_head_dim, model.mamba_state_size
    batches = tokens / chunk * model.mamba_num_heads / tp
    scan = 3.5 * batches * gemm_time_s(chunk, p, n, ctx=ctx, dtype="bf16", measured_ok=False)
    elementwise = memory_time_s(MAMBA_ELEMENTWISE_BYTES * tokens * inner, ctx)
    return forward + scan + elementwise, backward + 2.0 * (scan + elementwise), weight


def mixer_time_s(
    model: ModelSpec,
    mixer: str,
    *,
    tokens: np.ndarray,
    tp: np.ndarray,
    mbs: np.ndarray,
    flash_attention: bool,
    ctx: TermContext,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(forward, backward, selective-recompute forward, backward's weight-gradient part) of one
    layer's token mixer on one rank: selective recompute re-executes what the stack's
    ``recompute_modules`` name, the attention core (``core_attn``) and MLA's up-projections
    (``mla_up_proj``); the attention core has no weights."""
    zero = np.zeros_like(np.asarray(tokens, dtype=np.float64))
    if mixer == "none":
        return zero, zero, zero, zero
    if mixer == "mamba":
        forward, backward, weight = mamba_time_s(model, tokens=tokens, tp=tp, ctx=ctx)
        return forward, backward, zero, weight
    recomputed = zero
    if mixer == "mla":
        forward, backward, recomputed, weight = mla_time_s(model, tokens=tokens, tp=tp, ctx=ctx)
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        head_dim = 0.5 * (qk + model.v_head_dim)
    else:
        forward, backward, weight = attention_block_time_s(model, tokens=tokens, tp=tp, ctx=ctx)
        head_dim = None
    keys = attention_keys(model, mixer, ctx.training.seq_len)
    if mixer == "sliding" and flash_attention and keys < ctx.training.seq_len:
        keys = windowed_keys(keys, ctx.training.seq_len)
    shape = dict(tokens=tokens, seq_len=keys, tp=tp, mbs=mbs, ctx=ctx, head_dim=head_dim)
    core = attention_core_time_s(model, flash_attention=flash_attention, **shape)
    core_backward = 2.0 * core
    if flash_attention:
        if mixer == "sliding" and not windowed_backward(ctx):
            # the FP8 backward on Blackwell runs the whole causal triangle (measured)
            shape = {**shape, "seq_len": ctx.training.seq_len}
        paced = attention_core_time_s(model, flash_attention=True, backward=True, **shape)
        core_backward = 2.0 * backward_slowdown(ctx) * paced
    modules = ctx.training.stack.recompute_modules
    rerun = (core if "core_attn" in modules else zero) + (
        recomputed if "mla_up_proj" in modules else zero
    )
    return forward + core, backward + core_backward, rerun, weight


def critical_stage(
    model: ModelSpec, pp: np.ndarray, seq_len: int
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Layer kinds on the stage with the most forward FLOPs, the output layer (and its MTP
    repeats) counted on the last one, and whether that stage is the last
    (``shapes.heaviest_stage``): every time term reads the same stage. Found once per
    distinct ``pp`` (``_critical_stages``) and taken onto the rows."""
    pp = np.atleast_1d(np.asarray(pp, dtype=np.int64))
    values = np.unique(pp)
    at = np.searchsorted(values, pp)
    counts, is_last = _critical_stages(model, tuple(values.tolist()), seq_len)
    return {kind: count[at] for kind, count in counts.items()}, is_last[at]


@functools.lru_cache(maxsize=1024)
def _critical_stages(model: ModelSpec, pps: tuple[int, ...], seq_len: int):
    """``heaviest_stage`` of each pipeline depth of ``pps`` (``critical_stage``). Memoised: a
    pure function of the frozen model and scalars, asked by every time term of a solve on its
    own keys (a row's figures depend on its ``pp`` alone); the arrays are read-only."""
    weight = functools.partial(kind_flop_per_token, model, seq_len=seq_len, causal=False)
    extra = logits_flop_per_token(model)
    counts, is_last = heaviest_stage(model, np.array(pps), weight=weight, last_stage_extra=extra)
    for array in (*counts.values(), is_last):
        array.flags.writeable = False
    return counts, is_last


def stage_counts_for_time(model: ModelSpec, pp: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
    """Layer-kind counts of ``critical_stage``."""
    return critical_stage(model, pp, seq_len)[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class DenseComputeTime:
    """Forward + backward (+ recompute) of the layers of the most loaded pipeline stage, one
    micro-batch: each layer's token mixer (attention, sliding-window, MLA or Mamba-2), dense
    MLPs and the elementwise work; MoE MLPs are ``ExpertComputeTime``. With dense-first layers or
    MTP modules the stages differ, and the stage with the most FLOPs sets the pace."""

    name: str = "dense_compute_s"
    category: str = "compute"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "mbs", "recompute", "sp")
    flash_attention: bool | None = None
    """Scores never materialised, causal half skipped (FlashAttention / cuDNN fused attention);
    ``None``: as the stack says."""

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        return self.phases(grid, ctx).total()

    def phases(self, grid: Grid, ctx: TermContext) -> Phases:
        """Forward; backward for the inputs (recompute runs in it, before the gradients); the
        weight-gradient GEMMs (``linear_times_s``' third)."""
        model, s = ctx.model, ctx.training.seq_len
        flash = switch(self.flash_attention, ctx, "flash_attention")
        tp, pp, cp, mbs = (np.asarray(grid[a], dtype=np.float64) for a in ("tp", "pp", "cp", "mbs"))
        tokens = mbs * s / cp
        hidden = tokens * model.hidden_size / np.where(grid["sp"] == 1, tp, 1.0)
        half_elem = 0.5 * memory_time_s(HIDDEN_ELEMENTWISE_BYTES * hidden, ctx)
        full = recompute_factor(grid["recompute"], RECOMPUTE_FULL)
        selective = recompute_factor(grid["recompute"], RECOMPUTE_SELECTIVE)
        # selective layernorm recompute re-runs each sublayer's norm (read and write 2 B each)
        norm = memory_time_s(NORM_BYTES * hidden, ctx)
        norm = norm if "layernorm" in ctx.training.stack.recompute_modules else 0.0 * norm
        mlp = mlp_time_s(model, model.ffn_hidden_size, tokens=tokens, tp=tp, ctx=ctx)
        out = [np.zeros(len(tp)) for _ in range(3)]
        for kind, count in stage_counts_for_time(model, grid["pp"], s).items():
            mixer, _, ffn = kind.partition("/")
            forward, backward, core, weight = mixer_time_s(
                model,
                mixer,
                tokens=tokens,
                tp=tp,
                mbs=mbs,
                flash_attention=flash,
                ctx=ctx,
            )
            if ffn == "dense":
                forward, backward, weight = forward + mlp[0], backward + mlp[1], weight + mlp[2]
            sublayers = (mixer != "none") + (ffn != "none")
            forward = forward + sublayers * half_elem
            backward = backward + sublayers * 2.0 * half_elem
            rerun = core + sublayers * norm
            out[0] = out[0] + count * forward
            out[1] = out[1] + count * (backward - weight + full * forward + selective * rerun)
            out[2] = out[2] + count * weight
        return Phases(*out, np.zeros(len(tp)))


GROUPED_GEMM_EFFICIENCY = 0.8
"""Rate of the routed experts' grouped GEMMs relative to one dense GEMM of the same per-expert
shape: many GEMMs of uneven ``m`` in one launch (TE ``GroupedLinear`` / cuBLAS grouped GEMM;
DeepSeek's DeepGEMM reports grouped FP8 GEMMs at 55-75% of the H800 peak against 80-90% for
large dense GEMMs). Calibrated on the Megatron-Bridge MoE rows (benchmarks/README.md)."""
ROUTED_COPY_BYTES = 16.0
"""HBM bytes per element of each routed token copy per MoE layer forward, outside the GEMMs:
permute (read + write, 4 B), the dispatcher's send and receive buffers (4 B), the combine
buffers (4 B) and the probability-weighted unpermute (4 B) (Megatron ``moe_utils.permute`` /
``unpermute``; ``token_dispatcher.py``); backward moves twice as much."""
MOE_LAYER_OVERHEAD_S = 1e-3
"""Fixed time of one MoE layer's forward (and again backward) outside GEMMs and bulk copies:
router top-k and auxiliary-loss kernels on ``[tokens, E]``, permutation-index computation and
the dispatcher's device-to-host sync of per-expert token counts (Megatron
``token_dispatcher.py`` ``preprocess``). Calibrated on the H100 Megatron-Bridge MoE rows, which
ran without CUDA graphs. With graphs (``StackSpec.cuda_graphs`` ``layers`` or ``full``) the
router and the preprocessing replay from the graph (Megatron-Bridge's Blackwell MoE recipes
capture ``moe_router`` and ``moe_preprocess``; the full-iteration ones pad experts to a fixed
capacity so that no count goes to the host): 0. Under layer graphs the counts' device-to-host
sync stays (Megatron core_v0.17.0 ``token_dispatcher.py`` L440-445 only moves the copy before
the EP all-to-all; ``experts.py`` L344 ``tokens_per_expert.tolist()``), but the Blackwell Qwen3
rows with layer graphs bound its cost near zero (the 1 ms kept there: +23% to +29%,
benchmarks/README.md "Blackwell")."""
MOE_LOAD_IMBALANCE = 1.0
"""Tokens on the busiest expert rank over the mean, for dropless routing. 1.0 is the balanced
case the published MoE benchmarks force (Megatron ``--moe-router-force-load-balancing``,
Megatron-Bridge performance recipes); real auxiliary-loss-balanced training runs a few tens of
percent above it (Megatron MoE README, "load balancing")."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertComputeTime:
    """Router, routed experts and shared expert of the MoE layers of the most loaded stage, one
    micro-batch.

    With balanced routing a rank computes ``top_k`` expert MLPs for each token it owns
    (``mbs*s/(tp*cp)`` tokens with sequence parallelism): ``E/ep`` local experts, each seeing
    ``ep*etp*mbs*s*top_k/(tp*cp*E)`` tokens, expert width ``ffn/etp`` (Megatron
    ``moe/token_dispatcher.py``, ``moe/experts.py`` ``TEGroupedMLP``). Small per-expert GEMMs
    lose efficiency through the shape factor of ``gemm_time_s`` (grouped GEMM of ``E/ep``
    experts with ``m`` = tokens per expert). Dropless routing pays ``load_imbalance`` on the
    busiest rank; token dropping caps it at ``capacity_factor`` (Megatron
    ``--moe-expert-capacity-factor``). Token permutation costs bytes. Zero for a dense model."""

    name: str = "expert_compute_s"
    category: str = "compute"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "ep", "etp", "mbs", "recompute")
    load_imbalance: float = MOE_LOAD_IMBALANCE
    capacity_factor: float | None = None
    """``None``: dropless; else tokens per expert are capped at this multiple of the mean."""
    dispatcher: str | None = None
    """The token dispatcher, as ``communication.EpCommTime`` takes it: with ``flex`` under EP
    overlap the routed-copy bytes move off the compute stream (``routed_copy_exposure``)."""
    ep_overlap: bool | None = None
    """Megatron ``--overlap-moe-expert-parallel-comm``; ``None``: the stack's."""

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        return self.phases(grid, ctx).total()

    def phases(self, grid: Grid, ctx: TermContext) -> Phases:
        """As ``DenseComputeTime.phases``; the grouped GEMMs' weight gradients are ``W``."""
        model, s = ctx.model, ctx.training.seq_len
        if not model.is_moe:
            zero = np.zeros(len(grid["tp"]))
            return Phases(zero, zero, zero, zero)
        tp, cp, ep, etp, mbs = (
            np.asarray(grid[a], dtype=np.float64) for a in ("tp", "cp", "ep", "etp", "mbs")
        )
        skew = self.load_imbalance
        if self.capacity_factor is not None:
            skew = min(skew, self.capacity_factor)
        copies = mbs * s / (tp * cp) * model.experts_per_token
        per_expert = skew * copies * ep * etp / model.num_experts
        f, b, w = mlp_time_s(
            model, model.expert_ffn_hidden_size, tokens=per_expert, tp=etp, ctx=ctx
        )
        local = model.num_experts / ep / GROUPED_GEMM_EFFICIENCY
        forward, backward, weight = local * f, local * b, local * w
        path_f, path_b = expert_path_s(ctx, rows=per_expert * model.num_experts / ep, etp=etp)
        forward, backward = forward + path_f, backward + path_b
        # lazy: communication imports this module (the dispatcher choice is priced there)
        from cost_models.communication import routed_copy_exposure

        exposure = routed_copy_exposure(grid, ctx, self.dispatcher, self.ep_overlap)
        permute = exposure * routed_copy_time_s(grid, ctx)
        # the router GEMM stays in BF16/FP32 (Megatron ``moe/router.py``): never an FP8 GEMM
        router = linear_time_s(
            mbs * s / (tp * cp), model.num_experts, model.hidden_size, ctx=ctx, gemm="router"
        )
        forward = forward + permute + router
        backward = backward + 2.0 * (permute + router)
        weight = weight + router  # the router's weight gradient, one GEMM of its forward's size
        if model.shared_expert_ffn_hidden_size:
            sf, sb, sw = mlp_time_s(
                model, model.shared_expert_ffn_hidden_size, tokens=mbs * s / cp, tp=tp, ctx=ctx
            )
            forward, backward, weight = forward + sf, backward + sb, weight + sw
        overhead = MOE_LAYER_OVERHEAD_S if ctx.training.stack.cuda_graphs == "none" else 0.0
        forward = forward + overhead
        backward = backward + overhead
        full = recompute_factor(grid["recompute"], RECOMPUTE_FULL)
        moe_act = 0.0
        if "moe_act" in ctx.training.stack.recompute_modules:
            # selective moe_act recompute re-runs the experts' activation
            width = model.expert_ffn_hidden_size / etp
            act = mlp_activation_bytes(model, per_expert * width) * model.num_experts / ep
            if model.clamped_glu and not ctx.training.stack.moe_fused_mlp:
                act = act + CLAMP_PASS_BYTES[0] * width * per_expert * model.num_experts / ep
            moe_act = recompute_factor(grid["recompute"], RECOMPUTE_SELECTIVE) * memory_time_s(
                act, ctx
            )
        moe_layers = moe_stage_layers(stage_counts_for_time(model, grid["pp"], s))
        return Phases(
            moe_layers * forward,
            moe_layers * (backward - weight + full * forward + moe_act),
            moe_layers * weight,
            np.zeros(len(tp)),
        )


def routed_copy_time_s(grid: Grid, ctx: TermContext) -> np.ndarray:
    """Forward time of one MoE layer's routed-copy bytes (``ROUTED_COPY_BYTES``) on one rank;
    the backward moves twice as much."""
    tp, cp, mbs = (np.asarray(grid[a], dtype=np.float64) for a in ("tp", "cp", "mbs"))
    copies = mbs * ctx.training.seq_len / (tp * cp) * ctx.model.experts_per_token
    return memory_time_s(ROUTED_COPY_BYTES * copies * ctx.model.hidden_size, ctx)


CLAMP_PASS_BYTES = (16.0, 20.0)
"""HBM bytes per element of each GLU half (forward, backward) that a clamped GLU adds on the
unfused expert path (Megatron ``fused_bias_geglu.py`` ``weighted_bias_quick_geglu_impl``
L410-442, GPT-OSS): ``x_glu.clamp`` and ``x_linear.clamp`` (read 2, write 2 each) and the
``torch.cat`` of the halves (read 4, write 4) before the fused kernel; backward, the two clamp
masks (read the gradient and the input, write: 6 each) and the concatenation of their
gradients (8)."""
EAGER_BIAS_BYTES = (28.0, 36.0)
"""HBM bytes per hidden element of each routed copy (forward, backward) for the experts' FC2
bias on the unfused path (Megatron ``experts.py`` ``TEGroupedMLP._apply_bias`` L345-380: per
expert ``t + b * p`` with the FP32 router probabilities, then ``torch.cat`` and a cast): ``b*p``
written in FP32 (4), the add (read 2 + 4, write 4), the concatenation (read 4, write 4), the cast
to BF16 (read 4, write 2); backward, the cast's gradient (read 2, write 4), ``t``'s BF16 gradient
(read 4, write 2) and the bias and probability gradients, each a product (read 4, write 4) then
a reduction (read 4)."""


def expert_path_s(ctx: TermContext, *, rows: np.ndarray, etp: np.ndarray) -> tuple:
    """(forward, backward) time the routed experts' MLP spends outside the grouped GEMMs and the
    activation ``mlp_time_s`` prices, on ``rows`` routed token copies of one rank:

    - unfused (``StackSpec.moe_fused_mlp`` off, Megatron's ``bias_act_func``): a clamped GLU's
      pre-pass (``CLAMP_PASS_BYTES``) and biased experts' eager FC2 bias (``EAGER_BIAS_BYTES``);
    - fused on NVIDIA Blackwell with MXFP8 or NVFP4 experts (Transformer Engine
      ``ops/fused/grouped_mlp.py``: cuDNN CuTe-DSL grouped GEMM + GLU + quantize, compute
      capability 10): the activation and the FC2 input's cast run in the FC1 GEMM's epilogue,
      the activation gradient and the FC1 output gradient's cast in the FC2 dgrad's: those
      passes are saved (negative)."""
    model, stack = ctx.model, ctx.training.stack
    width = model.expert_ffn_hidden_size / etp
    if not stack.moe_fused_mlp:
        fwd = np.zeros_like(rows)
        bwd = np.zeros_like(rows)
        if model.clamped_glu:
            fwd, bwd = fwd + CLAMP_PASS_BYTES[0] * width, bwd + CLAMP_PASS_BYTES[1] * width
        if model.linear_bias:
            h = model.hidden_size
            fwd, bwd = fwd + EAGER_BIAS_BYTES[0] * h, bwd + EAGER_BIAS_BYTES[1] * h
        return memory_time_s(fwd * rows, ctx), memory_time_s(bwd * rows, ctx)
    dtype = gemm_dtype(ctx, "fc1")
    block_scaled = dtype == "fp4" or (dtype == "fp8" and stack.fp8_recipe == "mxfp8")
    if not (block_scaled and ctx.cluster.gpu.runs("nvfp4")):
        return np.zeros_like(rows), np.zeros_like(rows)
    up = mlp_up_width(model, model.expert_ffn_hidden_size) / etp
    act = mlp_activation_bytes(model, width)
    fwd = act + cast_bytes_per_element(ctx, "fc2", forward=True) * width
    bwd = 2.0 * act + cast_bytes_per_element(ctx, "fc1", forward=False) * up
    return -memory_time_s(fwd * rows, ctx), -memory_time_s(bwd * rows, ctx)


def loss_bytes_per_logit(stack) -> tuple[float, float]:
    """(forward + backward, forward) HBM bytes per logit of the stack's cross entropy."""
    if not stack.cross_entropy_fusion:
        return LOSS_BYTES_PER_LOGIT, LOSS_FORWARD_BYTES_PER_LOGIT
    if stack.cross_entropy_impl == "native":
        return NATIVE_LOSS_BYTES_PER_LOGIT, NATIVE_LOSS_FORWARD_BYTES_PER_LOGIT
    return FUSED_LOSS_BYTES_PER_LOGIT, FUSED_LOSS_FORWARD_BYTES_PER_LOGIT


def moe_stage_layers(counts: dict[str, np.ndarray]) -> np.ndarray:
    """MoE layers among a stage's layer-kind counts."""
    moe = [n for kind, n in counts.items() if kind.endswith("/moe")]
    return sum(moe) if moe else np.zeros(len(next(iter(counts.values()))))


@dataclass(frozen=True, slots=True, kw_only=True)
class LogitsComputeTime:
    """Output layer (logits GEMM over the padded vocabulary / tp) and vocab-parallel cross
    entropy, one micro-batch, forward + backward, on the last stage (never recomputed), once
    more per MTP module. Counted on the critical path, as if the last stage were the most loaded
    (exact for an even split; an upper bound when another stage carries more layers)."""

    name: str = "logits_compute_s"
    category: str = "compute"
    depends_on: tuple[str, ...] = ("tp", "cp", "mbs")

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        return self.phases(grid, ctx).total()

    def phases(self, grid: Grid, ctx: TermContext) -> Phases:
        """The logits GEMM and the loss's forward bytes; the data gradient and the loss's
        backward bytes; the output layer's weight gradient."""
        tp, cp, mbs = (np.asarray(grid[a], dtype=np.float64) for a in ("tp", "cp", "mbs"))
        tokens = mbs * ctx.training.seq_len / cp
        vocab = padded_vocab(ctx.model, tp) / tp
        h = ctx.model.hidden_size
        forward, backward, weight = linear_times_s(tokens, vocab, h, ctx=ctx, gemm="logits")
        total, first = loss_bytes_per_logit(ctx.training.stack)
        loss = memory_time_s(total * tokens * vocab, ctx)
        share = first / total
        heads = 1 + ctx.model.num_mtp_layers  # each MTP module runs the output layer again
        return Phases(
            heads * (forward + share * loss),
            heads * (backward - weight + (1.0 - share) * loss),
            heads * weight,
            np.zeros(len(tp)),
        )
