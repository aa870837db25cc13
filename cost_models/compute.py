"""Compute time of one micro-batch on one pipeline stage (DESIGN §4 "Compute time").

Each GEMM is timed as ``FLOPs / achievable FLOP/s + bytes / achievable HBM bandwidth`` (a
roofline whose two sides add: see ``gemm_time_s``). The achievable FLOP/s is the dense peak of
the precision times an efficiency that falls for small per-rank shapes (small ``h/tp``, small
``mbs*s/cp``, small head dim):

    efficiency(m, n, k) = GEMM_EFFICIENCY * prod over d in (m, n, k) of d / (d + GEMM_HALF_DIM)

(a saturating curve per dimension: tiles under-filled and wave quantisation hit small dimensions;
calibrated on ``data/published/``, see ``benchmarks/README.md``). Memory-bound elementwise work
(norms, residual adds, dropout, activation functions, rotary embeddings, softmax when attention
scores are materialised, FP8 casts, the loss) costs bytes / (HBM bandwidth * HBM_EFFICIENCY).

Per layer forward: QKV, attention core, output projection, MLP, elementwise. Backward = 2 x the
GEMM FLOPs (data and weight gradients) and 2 x the elementwise bytes; the flash-attention
backward is slower per FLOP than its forward (FLASH_BACKWARD_SLOWDOWN). Recompute adds one forward
of the layer (full) or of the attention core (selective).

Precision: FP8 runs the GEMMs the stack lists (``StackSpec.fp8_gemms``: by default the four
linear layers of a block; the attention core with ``attention``, the output layer with
``logits``) at the FP8 peak times ``FP8_GEMM_EFFICIENCY`` and pays the quantisation of their
inputs and output gradients in HBM bytes, per recipe (``FP8_CAST_BYTES``). A measured GEMM
profile (``ctx.gemm.gemm_flop_per_s(m, n, k, dtype)``) replaces the efficiency curve when one is
given.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.costs.terms import Grid, TermContext
from autopar.inputs.specs import ModelSpec
from cost_models.flops import (
    RECOMPUTE_FULL,
    RECOMPUTE_SELECTIVE,
    attention_keys,
    kind_flop_per_token,
    logits_flop_per_token,
)
from cost_models.shapes import (
    MLA_REPLICATED,
    heaviest_stage,
    kv_size,
    mamba_in_proj_size,
    mla_projection_sizes,
    padded_vocab,
    query_size,
)
from cost_models.switches import fp8_gemm, switch

GEMM_EFFICIENCY = 0.83
"""Fraction of the datasheet dense peak a large GEMM sustains in training (clocks under load,
epilogues, launch gaps). Calibrated on data/published (benchmarks/README.md)."""
H200_FP8_TO_BF16_EFFICIENCY = 0.891
"""Measured, not fitted: on one H200 (``benchmarks/data/h200_gemm_profile.yaml``, 563 shapes of
real models per dtype), the efficiency this module's roofline needs to reproduce each measured
GEMM (FLOP time = measured time - operand traffic time, over peak x shape factor) has median
0.662 for FP8 (against the 1,979 TFLOP/s FP8 peak) and 0.743 for BF16 (against 989): FP8 GEMMs
reach 0.891 of BF16's fraction of peak (the main loop halves; scaling, epilogue and the BF16
output do not). ``tests/test_fp8.py`` recomputes it from the profile."""
FP8_GEMM_EFFICIENCY = GEMM_EFFICIENCY * H200_FP8_TO_BF16_EFFICIENCY
"""FP8 GEMM efficiency against the FP8 peak, for every GPU: the calibrated BF16 efficiency
times the measured H200 FP8:BF16 ratio (the same roofline model on both sides)."""
BLOCKWISE_GEMM_SLOWDOWN = 1.10
"""Blockwise FP8 (1x128 activation and 128x128 weight scales, DeepSeek-V3 style) on Hopper
applies the scales in the main loop (promotion to FP32 on CUDA cores every 128 of K): DeepGEMM
reports ~1,550 TFLOP/s on H800 against ~1,700 for tensor-wise cuBLAS FP8 GEMMs of the same
shapes. MXFP8 on Blackwell scales in hardware (no slowdown)."""
GEMM_HALF_DIM = 32.0
"""GEMM dimension at which that dimension alone halves the efficiency (tile size order: cuBLAS
tiles are 64-256 wide). Calibrated on data/published."""
HBM_EFFICIENCY = 0.80
"""Fraction of datasheet HBM bandwidth that streaming kernels reach (STREAM-like copies reach
80-90% on A100/H100)."""
FLASH_BACKWARD_SLOWDOWN = 1.15
"""Flash-attention backward runs at lower FLOP/s than its forward: FlashAttention-2 paper
(Dao 2023) reports up to 73% of A100 peak forward and 63% backward (ratio 1.16)."""
HIDDEN_ELEMENTWISE_BYTES = 30.0
"""Bytes moved per hidden-size element per layer, forward, outside the GEMMs: two norms (read +
write, 2 x 4 B), two residual adds (read 2, write 1: 2 x 6 B), two dropouts (read, write, 1-byte
mask: 2 x 5 B). Korthikanti et al. 2022 Table 2 lists the same tensors."""
SCORE_ELEMENTWISE_BYTES = 9.0
"""Bytes per attention-score element, forward, when scores are materialised (no flash
attention), outside the two batched GEMMs: scaled-masked softmax read 2 + write 2, dropout read 2
+ write 2 + mask 1 (Megatron's fused softmax path). The GEMMs' own score write and probability
read (2 + 2) are their operand traffic in ``gemm_time_s``; counting them here too (13 B) made
every unfused-attention run slower by up to 12% (the 1.7B row of Narayanan Table 1)."""
FP8_CAST_BYTES: dict[str, float] = {
    "delayed": 4.0,
    "current": 6.0,
    "blockwise": 4.0,
    "mxfp8": 4.0,
}
"""HBM bytes per element to quantise a BF16 GEMM operand for forward and backward use: read 2,
write the row-wise FP8 copy 1 and the column-wise (transposed) copy 1 that Hopper's TN-only FP8
GEMMs need for the weight gradient (Transformer Engine ``cast_transpose``). Current (tensor-wise)
scaling first needs the tensor's amax, one more read of 2 B (TE ``Float8CurrentScalingQuantizer``
computes amax, then casts). Blockwise and MXFP8 compute block scales in the cast pass (scale
bytes are 1/128 and 1/32 of the data). Weights are quantised once per step (TE caches them over
micro-batches: ``is_first_microbatch``) and not counted."""
FP8_FUSED_CAST_BYTES = 1.0
"""With delayed scaling the scale is known before the tensor is produced, so LayerNorm (QKV,
FC1 inputs) and the MLP activation (FC2 input) write FP8 directly (TE ``LayerNormLinear``,
``LayerNormMLP``): only the extra transposed copy (1 B) remains."""
FUSED_PRODUCERS: frozenset[str] = frozenset({"qkv", "fc1", "fc2"})
LOSS_BYTES_PER_LOGIT = 52.0
"""HBM bytes per logit of Megatron's unfused vocab-parallel cross entropy, forward + backward
(``megatron/core/tensor_parallel/cross_entropy.py``): BF16 -> FP32 copy (read 2, write 4), max
(read 4), subtract max (read 4, write 4), exp (read 4, write 4), sum (read 4), normalise to the
softmax kept for backward (read 4, write 4); backward scales it in place (read 4, write 4) and
casts the gradient to BF16 (read 4, write 2)."""
FUSED_LOSS_BYTES_PER_LOGIT = 8.0
"""The same with a fused cross entropy (``StackSpec.cross_entropy_fusion``): the BF16 logits read
twice forward (online max and sum), once backward, and the BF16 gradient written (2 B each)."""
BYTES_BF16 = 2.0


def gemm_efficiency(ctx: TermContext, *, fp8: bool) -> float:
    """Fraction of the dense peak a large GEMM sustains: the GPU preset's measured value where it
    has one (``GpuSpec.gemm_efficiency``: Hopper, from the H200 profile), else
    ``GEMM_EFFICIENCY``; FP8 scales it by the measured FP8:BF16 ratio
    (``H200_FP8_TO_BF16_EFFICIENCY``) unless the preset measured FP8 too. Both times the stack's
    ``kernel_efficiency`` (older libraries on the same GPU)."""
    gpu = ctx.cluster.gpu
    bf16 = gpu.gemm_efficiency or GEMM_EFFICIENCY
    kernels = ctx.training.stack.kernel_efficiency
    if not fp8:
        return bf16 * kernels
    return (gpu.fp8_gemm_efficiency or bf16 * H200_FP8_TO_BF16_EFFICIENCY) * kernels


def gemm_time_s(
    m: np.ndarray,
    n: np.ndarray,
    k: np.ndarray,
    *,
    ctx: TermContext,
    fp8: bool,
    measured_ok: bool = True,
) -> np.ndarray:
    """Roofline time of one ``(m x k) @ (k x n)`` GEMM (module docstring), or FLOPs over the
    measured rate of the nearest profiled shapes when the profile has some and ``measured_ok``
    (the attention core is a fused kernel, not a profiled GEMM: it keeps the roofline)."""
    m, n, k = (np.asarray(x, dtype=np.float64) for x in (m, n, k))
    flop = 2.0 * m * n * k
    gpu = ctx.cluster.gpu
    measured = None
    if ctx.gemm is not None and measured_ok:
        measured = ctx.gemm.gemm_flop_per_s(m, n, k, "fp8" if fp8 else "bf16")
    if measured is not None:
        # A measured GEMM already pays its own operand traffic: wall time is FLOPs / rate, at the
        # stack's share of the profiled libraries' rate.
        rate = np.asarray(measured, dtype=np.float64) * ctx.training.stack.kernel_efficiency
        return flop / rate
    shape = (m / (m + GEMM_HALF_DIM)) * (n / (n + GEMM_HALF_DIM)) * (k / (k + GEMM_HALF_DIM))
    eff = gemm_efficiency(ctx, fp8=fp8)
    if fp8 and ctx.training.stack.fp8_recipe == "blockwise":
        eff = eff / BLOCKWISE_GEMM_SLOWDOWN
    rate = gpu.peak_flop_per_s("fp8" if fp8 else "bf16") * eff * shape
    in_bytes = 1.0 if fp8 else BYTES_BF16
    traffic = in_bytes * (m * k + k * n) + BYTES_BF16 * m * n
    # Additive, not max: operand loads and the output write are only partly hidden behind the
    # tensor-core main loop in training-sized GEMMs; the sum fits H100 (twice A100's FLOP:byte
    # ratio) and A100 with one efficiency (benchmarks/README.md compares max and sum).
    return flop / rate + traffic / (gpu.hbm_bytes_per_s * HBM_EFFICIENCY)


def memory_time_s(num_bytes: np.ndarray, ctx: TermContext) -> np.ndarray:
    """Time of memory-bound work moving ``num_bytes`` through HBM."""
    return np.asarray(num_bytes, dtype=np.float64) / (
        ctx.cluster.gpu.hbm_bytes_per_s * HBM_EFFICIENCY
    )


def cast_bytes_per_element(ctx: TermContext, gemm: str, *, forward: bool) -> float:
    """HBM bytes to quantise one element of ``gemm``'s input (forward) or output gradient
    (backward) for the stack's FP8 recipe; 0 when ``gemm`` runs in BF16."""
    if not fp8_gemm(ctx, gemm):
        return 0.0
    recipe = ctx.training.stack.fp8_recipe
    if forward and recipe == "delayed" and gemm in FUSED_PRODUCERS:
        return FP8_FUSED_CAST_BYTES
    return FP8_CAST_BYTES[recipe]


def linear_time_s(
    m: np.ndarray, n: np.ndarray, k: np.ndarray, *, ctx: TermContext, gemm: str
) -> np.ndarray:
    """Forward of one linear layer (``gemm`` names it for the stack's FP8 choice): the GEMM and,
    in FP8, the quantisation of its input."""
    cast = memory_time_s(cast_bytes_per_element(ctx, gemm, forward=True) * m * k, ctx)
    return gemm_time_s(m, n, k, ctx=ctx, fp8=fp8_gemm(ctx, gemm)) + cast


def linear_backward_time_s(
    m: np.ndarray, n: np.ndarray, k: np.ndarray, *, ctx: TermContext, gemm: str
) -> np.ndarray:
    """Backward of one linear layer: data + weight gradient GEMMs and, in FP8, the quantisation
    of the output gradient."""
    cast = memory_time_s(cast_bytes_per_element(ctx, gemm, forward=False) * m * n, ctx)
    return 2.0 * gemm_time_s(m, n, k, ctx=ctx, fp8=fp8_gemm(ctx, gemm)) + cast


def attention_core_time_s(
    model: ModelSpec,
    *,
    tokens: np.ndarray,
    seq_len: int,
    tp: np.ndarray,
    mbs: np.ndarray,
    flash_attention: bool,
    ctx: TermContext,
    head_dim: float | None = None,
) -> np.ndarray:
    """Forward of the attention core of one layer on one rank (``tokens = mbs*s/cp`` queries
    against ``seq_len`` keys, ``heads/tp`` heads). Flash attention skips the masked half of a
    causal score matrix and never writes it; the unfused path computes it all and runs the
    softmax / dropout over it in HBM. ``head_dim`` overrides ``kv_channels`` (MLA: the mean of
    the score and value head sizes)."""
    d = head_dim or model.kv_channels
    heads = model.num_attention_heads / np.asarray(tp, dtype=np.float64)
    queries = tokens / mbs
    batch = mbs * heads
    fp8 = fp8_gemm(ctx, "attention")
    if flash_attention:
        # Two GEMMs of 2*q*s*d each, causal: half of both.
        return batch * flash_block_time_s(queries, seq_len, d, ctx=ctx, fp8=fp8)
    one = gemm_time_s(queries, seq_len, d, ctx=ctx, fp8=fp8, measured_ok=False)
    scores = memory_time_s(SCORE_ELEMENTWISE_BYTES * batch * queries * seq_len, ctx)
    return 2.0 * batch * one + scores


def flash_block_time_s(
    queries: np.ndarray, keys: np.ndarray, head_dim: int, *, ctx: TermContext, fp8: bool
) -> np.ndarray:
    """One head's fused attention over a ``queries x keys`` block, forward, as the time of one
    ``(q x d) @ (d x k)`` GEMM (both GEMMs of the block, half of each when causal): the FLOPs at
    the GEMM efficiency of those shapes, plus HBM traffic of Q, O (``q*d``) and K, V (``k*d``)
    only. The ``q x k`` scores stay in on-chip memory (Dao et al. 2022, FlashAttention §3.1), so
    unlike ``gemm_time_s`` no output of ``q*k`` elements is written."""
    q, k = (np.asarray(x, dtype=np.float64) for x in (queries, keys))
    shape = (
        (q / (q + GEMM_HALF_DIM))
        * (k / (k + GEMM_HALF_DIM))
        * (head_dim / (head_dim + GEMM_HALF_DIM))
    )
    eff = gemm_efficiency(ctx, fp8=fp8)
    rate = ctx.cluster.gpu.peak_flop_per_s("fp8" if fp8 else "bf16") * eff * shape
    traffic = BYTES_BF16 * head_dim * (q + k)
    return 2.0 * q * k * head_dim / rate + memory_time_s(traffic, ctx)


def mlp_up_width(model: ModelSpec, ffn: int) -> int:
    """Output width of the first MLP GEMM: gate and up for SwiGLU."""
    return (2 if model.gated_mlp else 1) * ffn


def mlp_activation_bytes(model: ModelSpec, ffn_elements: np.ndarray) -> np.ndarray:
    """Forward elementwise bytes of the activation function over ``ffn_elements`` outputs."""
    reads = 2.0 if model.gated_mlp else 1.0
    return BYTES_BF16 * (reads + 1.0) * ffn_elements


def mlp_time_s(
    model: ModelSpec, ffn: int, *, tokens: np.ndarray, tp: np.ndarray, ctx: TermContext
) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) of one MLP of inner size ``ffn`` sharded over ``tp``."""
    h = model.hidden_size
    up = mlp_up_width(model, ffn) / tp
    down = ffn / tp
    forward = linear_time_s(tokens, up, h, ctx=ctx, gemm="fc1") + linear_time_s(
        tokens, h, down, ctx=ctx, gemm="fc2"
    )
    backward = linear_backward_time_s(tokens, up, h, ctx=ctx, gemm="fc1") + linear_backward_time_s(
        tokens, h, down, ctx=ctx, gemm="fc2"
    )
    act = memory_time_s(mlp_activation_bytes(model, tokens * down), ctx)
    return forward + act, backward + 2.0 * act


def attention_block_time_s(
    model: ModelSpec, *, tokens: np.ndarray, tp: np.ndarray, ctx: TermContext
) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) of the QKV and output projections (+ rotary embedding)."""
    h, q, kv = model.hidden_size, query_size(model), kv_size(model)
    qkv = (q + 2 * kv) / tp
    forward = linear_time_s(tokens, qkv, h, ctx=ctx, gemm="qkv") + linear_time_s(
        tokens, h, q / tp, ctx=ctx, gemm="proj"
    )
    backward = linear_backward_time_s(tokens, qkv, h, ctx=ctx, gemm="qkv") + linear_backward_time_s(
        tokens, h, q / tp, ctx=ctx, gemm="proj"
    )
    rope = (
        0.0
        if model.learned_position_embeddings
        else memory_time_s(2.0 * BYTES_BF16 * tokens * (q + kv) / tp, ctx)
    )
    return forward + rope, backward + 2.0 * rope


def recompute_factor(recompute: np.ndarray, code: int) -> np.ndarray:
    return (np.asarray(recompute) == code).astype(np.float64)


MLA_UP_PROJECTIONS = ("q_up", "q", "kv_up")
"""What Megatron's ``--recompute-modules mla_up_proj`` re-runs (with the RoPE)."""


def mla_time_s(
    model: ModelSpec, *, tokens: np.ndarray, tp: np.ndarray, ctx: TermContext
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, backward, up-projection forward) of the MLA projections (+ rotary on the RoPE
    part): the two down-projections run whole on every TP rank (``MLA_REPLICATED``), the others
    split over TP (Megatron ``multi_latent_attention.py``); the last is what selective
    recompute re-runs besides the core."""
    forward = np.zeros_like(np.asarray(tokens, dtype=np.float64))
    backward, up = forward.copy(), forward.copy()
    for name, (fan_in, fan_out) in mla_projection_sizes(model).items():
        split = 1.0 if name in MLA_REPLICATED else tp
        if name == "out":
            k, n = fan_in / split, fan_out
        else:
            k, n = fan_in, fan_out / split
        gemm = "proj" if name == "out" else "qkv"
        one = linear_time_s(tokens, n, k, ctx=ctx, gemm=gemm)
        forward = forward + one
        backward = backward + linear_backward_time_s(tokens, n, k, ctx=ctx, gemm=gemm)
        if name in MLA_UP_PROJECTIONS:
            up = up + one
    rope = memory_time_s(
        2.0 * BYTES_BF16 * tokens * model.qk_rope_head_dim * (model.num_attention_heads / tp + 1),
        ctx,
    )
    return forward + rope, backward + 2.0 * rope, up + rope


MAMBA_ELEMENTWISE_BYTES = 20.0
"""Bytes per ``d_inner`` element of a Mamba-2 mixer outside its GEMMs and scan, forward: the
causal depthwise conv over x, B, C (read + write, 4 B), its SiLU (4 B), the dt softplus and
``D`` skip (4 B), the gated RMSNorm with the z gate (read 2 x 2, write 2: 6 B), casts (2 B)
(Megatron ``ssm/mamba_mixer.py`` forward)."""


def mamba_time_s(
    model: ModelSpec, *, tokens: np.ndarray, tp: np.ndarray, ctx: TermContext
) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) of one Mamba-2 mixer on one rank (heads split over TP). The SSD scan's
    ``7*d_inner*d_state`` FLOPs per token (Megatron ``mamba_layer_flops``) run as batched GEMMs
    over chunks of ``chunk_size`` tokens, ``(Q x N) @ (N x P)`` per head (Dao & Gu 2024 §6), so
    they are timed at the roofline of that shape; its backward is twice the forward."""
    h = model.hidden_size
    in_proj = mamba_in_proj_size(model) / tp
    inner = model.mamba_inner_size / tp
    forward = linear_time_s(tokens, in_proj, h, ctx=ctx, gemm="qkv") + linear_time_s(
        tokens, h, inner, ctx=ctx, gemm="proj"
    )
    backward = linear_backward_time_s(
        tokens, in_proj, h, ctx=ctx, gemm="qkv"
    ) + linear_backward_time_s(tokens, h, inner, ctx=ctx, gemm="proj")
    chunk, p, n = model.mamba_chunk_size, model.mamba_head_dim, model.mamba_state_size
    batches = tokens / chunk * model.mamba_num_heads / tp
    scan = 3.5 * batches * gemm_time_s(chunk, p, n, ctx=ctx, fp8=False, measured_ok=False)
    elementwise = memory_time_s(MAMBA_ELEMENTWISE_BYTES * tokens * inner, ctx)
    return forward + scan + elementwise, backward + 2.0 * (scan + elementwise)


def mixer_time_s(
    model: ModelSpec,
    mixer: str,
    *,
    tokens: np.ndarray,
    tp: np.ndarray,
    mbs: np.ndarray,
    flash_attention: bool,
    ctx: TermContext,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, backward, selective-recompute forward) of one layer's token mixer on one rank:
    selective recompute re-executes the attention core (and MLA's up-projections)."""
    zero = np.zeros_like(np.asarray(tokens, dtype=np.float64))
    if mixer == "none":
        return zero, zero, zero
    if mixer == "mamba":
        forward, backward = mamba_time_s(model, tokens=tokens, tp=tp, ctx=ctx)
        return forward, backward, zero
    recomputed = zero
    if mixer == "mla":
        forward, backward, recomputed = mla_time_s(model, tokens=tokens, tp=tp, ctx=ctx)
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        head_dim = 0.5 * (qk + model.v_head_dim)
    else:
        forward, backward = attention_block_time_s(model, tokens=tokens, tp=tp, ctx=ctx)
        head_dim = None
    core = attention_core_time_s(
        model,
        tokens=tokens,
        seq_len=attention_keys(model, mixer, ctx.training.seq_len),
        tp=tp,
        mbs=mbs,
        flash_attention=flash_attention,
        ctx=ctx,
        head_dim=head_dim,
    )
    core_backward = 2.0 * core * (FLASH_BACKWARD_SLOWDOWN if flash_attention else 1.0)
    return forward + core, backward + core_backward, core + recomputed


def critical_stage(
    model: ModelSpec, pp: np.ndarray, seq_len: int
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Layer kinds on the stage with the most forward FLOPs, the output layer (and its MTP
    repeats) counted on the last one, and whether that stage is the last
    (``shapes.heaviest_stage``): every time term reads the same stage."""
    return heaviest_stage(
        model,
        pp,
        weight=lambda kind: kind_flop_per_token(model, kind, seq_len, causal=False),
        last_stage_extra=logits_flop_per_token(model),
    )


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
        model, s = ctx.model, ctx.training.seq_len
        flash = switch(self.flash_attention, ctx, "flash_attention")
        tp, pp, cp, mbs = (np.asarray(grid[a], dtype=np.float64) for a in ("tp", "pp", "cp", "mbs"))
        tokens = mbs * s / cp
        hidden = tokens * model.hidden_size / np.where(grid["sp"] == 1, tp, 1.0)
        half_elem = 0.5 * memory_time_s(HIDDEN_ELEMENTWISE_BYTES * hidden, ctx)
        full = recompute_factor(grid["recompute"], RECOMPUTE_FULL)
        selective = recompute_factor(grid["recompute"], RECOMPUTE_SELECTIVE)
        mlp_f, mlp_b = mlp_time_s(model, model.ffn_hidden_size, tokens=tokens, tp=tp, ctx=ctx)
        total = np.zeros(len(tp))
        for kind, count in stage_counts_for_time(model, grid["pp"], s).items():
            mixer, _, ffn = kind.partition("/")
            forward, backward, core = mixer_time_s(
                model,
                mixer,
                tokens=tokens,
                tp=tp,
                mbs=mbs,
                flash_attention=flash,
                ctx=ctx,
            )
            if ffn == "dense":
                forward, backward = forward + mlp_f, backward + mlp_b
            sublayers = (mixer != "none") + (ffn != "none")
            forward = forward + sublayers * half_elem
            backward = backward + sublayers * 2.0 * half_elem
            total = total + count * (forward + backward + full * forward + selective * core)
        return total


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
``token_dispatcher.py`` ``preprocess``; Megatron-Bridge captures ``moe_router`` and
``moe_preprocess`` in CUDA graphs to hide it). Calibrated on the Megatron-Bridge MoE rows."""
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

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        model, s = ctx.model, ctx.training.seq_len
        if not model.is_moe:
            return np.zeros(len(grid["tp"]))
        tp, cp, ep, etp, mbs = (
            np.asarray(grid[a], dtype=np.float64) for a in ("tp", "cp", "ep", "etp", "mbs")
        )
        skew = self.load_imbalance
        if self.capacity_factor is not None:
            skew = min(skew, self.capacity_factor)
        copies = mbs * s / (tp * cp) * model.experts_per_token
        per_expert = skew * copies * ep * etp / model.num_experts
        f, b = mlp_time_s(model, model.expert_ffn_hidden_size, tokens=per_expert, tp=etp, ctx=ctx)
        forward = model.num_experts / ep * f / GROUPED_GEMM_EFFICIENCY
        backward = model.num_experts / ep * b / GROUPED_GEMM_EFFICIENCY
        permute = memory_time_s(ROUTED_COPY_BYTES * copies * model.hidden_size, ctx)
        # the router GEMM stays in BF16/FP32 (Megatron ``moe/router.py``): never an FP8 GEMM
        router = linear_time_s(
            mbs * s / (tp * cp), model.num_experts, model.hidden_size, ctx=ctx, gemm="router"
        )
        forward = forward + permute + router
        backward = backward + 2.0 * (permute + router)
        if model.shared_expert_ffn_hidden_size:
            sf, sb = mlp_time_s(
                model, model.shared_expert_ffn_hidden_size, tokens=mbs * s / cp, tp=tp, ctx=ctx
            )
            forward, backward = forward + sf, backward + sb
        forward = forward + MOE_LAYER_OVERHEAD_S
        backward = backward + MOE_LAYER_OVERHEAD_S
        full = recompute_factor(grid["recompute"], RECOMPUTE_FULL)
        moe_layers = moe_stage_layers(stage_counts_for_time(model, grid["pp"], s))
        return moe_layers * (forward + backward + full * forward)


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
        tp, cp, mbs = (np.asarray(grid[a], dtype=np.float64) for a in ("tp", "cp", "mbs"))
        tokens = mbs * ctx.training.seq_len / cp
        vocab = padded_vocab(ctx.model, tp) / tp
        h = ctx.model.hidden_size
        gemm = linear_time_s(tokens, vocab, h, ctx=ctx, gemm="logits") + linear_backward_time_s(
            tokens, vocab, h, ctx=ctx, gemm="logits"
        )
        fused = ctx.training.stack.cross_entropy_fusion
        loss = FUSED_LOSS_BYTES_PER_LOGIT if fused else LOSS_BYTES_PER_LOGIT
        heads = 1 + ctx.model.num_mtp_layers  # each MTP module runs the output layer again
        return heads * (gemm + memory_time_s(loss * tokens * vocab, ctx))
