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

Precision: FP8 runs the linear-layer GEMMs at the FP8 peak and pays the casts (bytes); the
attention core stays in BF16 (Transformer Engine's default FP8 recipe, NeMo 24.07 / Megatron-Core
r0.8 era). A measured GEMM profile (``ctx.gemm.gemm_flop_per_s(m, n, k, dtype)``) replaces the
efficiency curve when one is given.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.specs import ModelSpec
from autopar.terms import Grid, TermContext
from cost_models.flops import RECOMPUTE_FULL, RECOMPUTE_SELECTIVE
from cost_models.shapes import kv_size, padded_vocab, query_size, stage_layers

GEMM_EFFICIENCY = 0.85
"""Fraction of the datasheet dense peak a large GEMM sustains in training (clocks under load,
epilogues, launch gaps). Calibrated on data/published (benchmarks/README.md)."""
FP8_GEMM_EFFICIENCY = 0.60
"""The same for FP8 GEMMs against the FP8 peak: the main loop halves but operand scaling, the
epilogue and the BF16 output do not, so FP8 GEMMs run ~1.4x BF16 rather than 2x (Transformer
Engine GEMM benchmarks on H100 show 1.3-1.5x). Calibrated on the NeMo 24.07 FP8 rows."""
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
SCORE_ELEMENTWISE_BYTES = 13.0
"""Bytes per attention-score element, forward, when scores are materialised (no flash
attention): scaled-masked softmax read 2 + write 2, dropout read 2 + write 2 + mask 1, the two
batched GEMMs write the scores 2 and read the probabilities 2 (Megatron fused softmax path)."""
FP8_CAST_BYTES = 3.0
"""Bytes per GEMM-input element to cast BF16 -> FP8 (read 2, write 1), forward inputs and backward
output gradients (Transformer Engine delayed scaling; weights are cast once per step)."""
LOSS_BYTES_PER_LOGIT = 16.0
"""Vocab-parallel cross entropy, forward + backward: logits read as BF16 and FP32 softmax written
and read back, gradient written (Megatron ``cross_entropy.py``)."""
BYTES_BF16 = 2.0


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
        # A measured GEMM already pays its own operand traffic: wall time is FLOPs / rate.
        return flop / np.asarray(measured, dtype=np.float64)
    shape = (m / (m + GEMM_HALF_DIM)) * (n / (n + GEMM_HALF_DIM)) * (k / (k + GEMM_HALF_DIM))
    eff = FP8_GEMM_EFFICIENCY if fp8 else GEMM_EFFICIENCY
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


def linear_time_s(m: np.ndarray, n: np.ndarray, k: np.ndarray, *, ctx: TermContext) -> np.ndarray:
    """Forward of one linear layer: the GEMM plus, in FP8, the cast of its input."""
    fp8 = ctx.training.precision == "fp8"
    cast = memory_time_s(FP8_CAST_BYTES * m * k, ctx) if fp8 else 0.0
    return gemm_time_s(m, n, k, ctx=ctx, fp8=fp8) + cast


def linear_backward_time_s(
    m: np.ndarray, n: np.ndarray, k: np.ndarray, *, ctx: TermContext
) -> np.ndarray:
    """Backward of one linear layer: data + weight gradient GEMMs and, in FP8, the gradient cast."""
    fp8 = ctx.training.precision == "fp8"
    cast = memory_time_s(FP8_CAST_BYTES * m * n, ctx) if fp8 else 0.0
    return 2.0 * gemm_time_s(m, n, k, ctx=ctx, fp8=fp8) + cast


def attention_core_time_s(
    model: ModelSpec,
    *,
    tokens: np.ndarray,
    seq_len: int,
    tp: np.ndarray,
    mbs: np.ndarray,
    flash_attention: bool,
    ctx: TermContext,
) -> np.ndarray:
    """Forward of the attention core of one layer on one rank (``tokens = mbs*s/cp`` queries
    against ``seq_len`` keys, ``heads/tp`` heads). Flash attention skips the masked half of a
    causal score matrix and never writes it; the unfused path computes it all and runs the
    softmax / dropout over it in HBM."""
    d = model.kv_channels
    heads = model.num_attention_heads / np.asarray(tp, dtype=np.float64)
    queries = tokens / mbs
    batch = mbs * heads
    one = gemm_time_s(queries, seq_len, d, ctx=ctx, fp8=False, measured_ok=False)
    if flash_attention:
        return batch * one  # two GEMMs of 2*q*s*d each, causal: half of both
    scores = memory_time_s(SCORE_ELEMENTWISE_BYTES * batch * queries * seq_len, ctx)
    return 2.0 * batch * one + scores


def mlp_up_width(model: ModelSpec, ffn: int) -> int:
    """Output width of the first MLP GEMM: gate and up for SwiGLU."""
    return (2 if model.mlp_kind == "swiglu" else 1) * ffn


def mlp_activation_bytes(model: ModelSpec, ffn_elements: np.ndarray) -> np.ndarray:
    """Forward elementwise bytes of the activation function over ``ffn_elements`` outputs."""
    reads = 2.0 if model.mlp_kind == "swiglu" else 1.0
    return BYTES_BF16 * (reads + 1.0) * ffn_elements


def mlp_time_s(
    model: ModelSpec, ffn: int, *, tokens: np.ndarray, tp: np.ndarray, ctx: TermContext
) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) of one MLP of inner size ``ffn`` sharded over ``tp``."""
    h = model.hidden_size
    up = mlp_up_width(model, ffn) / tp
    down = ffn / tp
    forward = linear_time_s(tokens, up, h, ctx=ctx) + linear_time_s(tokens, h, down, ctx=ctx)
    backward = linear_backward_time_s(tokens, up, h, ctx=ctx) + linear_backward_time_s(
        tokens, h, down, ctx=ctx
    )
    act = memory_time_s(mlp_activation_bytes(model, tokens * down), ctx)
    return forward + act, backward + 2.0 * act


def attention_block_time_s(
    model: ModelSpec, *, tokens: np.ndarray, tp: np.ndarray, ctx: TermContext
) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) of the QKV and output projections (+ rotary embedding)."""
    h, q, kv = model.hidden_size, query_size(model), kv_size(model)
    qkv = (q + 2 * kv) / tp
    forward = linear_time_s(tokens, qkv, h, ctx=ctx) + linear_time_s(tokens, h, q / tp, ctx=ctx)
    backward = linear_backward_time_s(tokens, qkv, h, ctx=ctx) + linear_backward_time_s(
        tokens, h, q / tp, ctx=ctx
    )
    rope = (
        0.0
        if model.learned_position_embeddings
        else memory_time_s(2.0 * BYTES_BF16 * tokens * (q + kv) / tp, ctx)
    )
    return forward + rope, backward + 2.0 * rope


def recompute_factor(recompute: np.ndarray, code: int) -> np.ndarray:
    return (np.asarray(recompute) == code).astype(np.float64)


@dataclass(frozen=True, slots=True, kw_only=True)
class DenseComputeTime:
    """Forward + backward (+ recompute) of the transformer layers of one pipeline stage, one
    micro-batch: attention of every layer, the MLP of the dense layers, the elementwise work.
    ``stage_layers`` layers on the fullest stage (``num_layers / pp`` for an even split)."""

    name: str = "dense_compute_s"
    category: str = "compute"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "mbs", "recompute", "sp")
    flash_attention: bool = True
    """Scores never materialised, causal half skipped (FlashAttention / cuDNN fused attention)."""

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        model, s = ctx.model, ctx.training.seq_len
        tp, pp, cp, mbs = (np.asarray(grid[a], dtype=np.float64) for a in ("tp", "pp", "cp", "mbs"))
        tokens = mbs * s / cp
        attn_f, attn_b = attention_block_time_s(model, tokens=tokens, tp=tp, ctx=ctx)
        core_f = attention_core_time_s(
            model,
            tokens=tokens,
            seq_len=s,
            tp=tp,
            mbs=mbs,
            flash_attention=self.flash_attention,
            ctx=ctx,
        )
        core_b = 2.0 * core_f * (FLASH_BACKWARD_SLOWDOWN if self.flash_attention else 1.0)
        mlp_f, mlp_b = mlp_time_s(model, model.ffn_hidden_size, tokens=tokens, tp=tp, ctx=ctx)
        dense_share = model.num_dense_layers / model.num_layers
        hidden = tokens * model.hidden_size / np.where(grid["sp"] == 1, tp, 1.0)
        elem_f = memory_time_s(HIDDEN_ELEMENTWISE_BYTES * hidden, ctx)
        forward = attn_f + core_f + dense_share * mlp_f + elem_f
        backward = attn_b + core_b + dense_share * mlp_b + 2.0 * elem_f
        recompute = (
            recompute_factor(grid["recompute"], RECOMPUTE_FULL) * forward
            + recompute_factor(grid["recompute"], RECOMPUTE_SELECTIVE) * core_f
        )
        return stage_layers(model.num_layers, pp) * (forward + backward + recompute)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertComputeTime:
    """Router, routed experts and shared expert of the MoE layers of one stage, one micro-batch.

    With balanced routing a rank computes ``top_k`` expert MLPs for each token it owns
    (``mbs*s/(tp*cp)`` tokens with sequence parallelism): ``E/ep`` local experts, each seeing
    ``ep*etp*mbs*s*top_k/(tp*cp*E)`` tokens, expert width ``ffn/etp`` (Megatron MoE token
    dispatcher). Token permutation costs bytes. Zero for a dense model."""

    name: str = "expert_compute_s"
    category: str = "compute"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "ep", "etp", "mbs", "recompute")

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        model, s = ctx.model, ctx.training.seq_len
        if not model.is_moe:
            return np.zeros(len(grid["tp"]))
        tp, pp, cp, ep, etp, mbs = (
            np.asarray(grid[a], dtype=np.float64) for a in ("tp", "pp", "cp", "ep", "etp", "mbs")
        )
        copies = mbs * s / (tp * cp) * model.experts_per_token
        per_expert = copies * ep * etp / model.num_experts
        f, b = mlp_time_s(model, model.expert_ffn_hidden_size, tokens=per_expert, tp=etp, ctx=ctx)
        forward = model.num_experts / ep * f
        backward = model.num_experts / ep * b
        permute = memory_time_s(4.0 * BYTES_BF16 * copies * model.hidden_size, ctx)
        if model.shared_expert_ffn_hidden_size:
            sf, sb = mlp_time_s(
                model, model.shared_expert_ffn_hidden_size, tokens=mbs * s / cp, tp=tp, ctx=ctx
            )
            forward, backward = forward + sf, backward + sb
        forward = forward + permute
        backward = backward + 2.0 * permute
        full = recompute_factor(grid["recompute"], RECOMPUTE_FULL)
        return stage_layers(model.num_moe_layers, pp) * (forward + backward + full * forward)


@dataclass(frozen=True, slots=True, kw_only=True)
class LogitsComputeTime:
    """Output layer (logits GEMM over the padded vocabulary / tp) and vocab-parallel cross
    entropy, one micro-batch, forward + backward, on the last stage (never recomputed)."""

    name: str = "logits_compute_s"
    category: str = "compute"
    depends_on: tuple[str, ...] = ("tp", "cp", "mbs")

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, cp, mbs = (np.asarray(grid[a], dtype=np.float64) for a in ("tp", "cp", "mbs"))
        tokens = mbs * ctx.training.seq_len / cp
        vocab = padded_vocab(ctx.model, tp) / tp
        h = ctx.model.hidden_size
        gemm = linear_time_s(tokens, vocab, h, ctx=ctx) + linear_backward_time_s(
            tokens, vocab, h, ctx=ctx
        )
        return gemm + memory_time_s(LOSS_BYTES_PER_LOGIT * tokens * vocab, ctx)
