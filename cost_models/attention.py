"""The attention core of one layer on one rank: fused (FlashAttention / cuDNN, scores kept on
chip) or unfused (scores materialised in HBM), forward; the backward is a multiple of it
(``FLASH_BACKWARD_SLOWDOWN``, applied by the caller).

The fused forward does two GEMMs per block (``S = Q K^T``, ``O = P V``) with a softmax between
them: one exponential per score element. On Blackwell the exponentials, not the tensor cores,
set its pace: the special-function units run 16 ``ex2`` per clock per SM, as on Hopper, while
the tensor cores doubled (FlashAttention-4, Zadouri et al. 2026, arXiv 2603.05451, "feeds and
speeds" of B200: the forward is bound by the exponential unit, the backward by shared memory).
So a block's forward time is the larger of its GEMM time and its exponential time
(``GpuSpec.attention_exp_per_s``: 5 TeraExponentials/s on Blackwell, 10.7 on Blackwell Ultra),
plus the HBM traffic of Q, K, V and O. On Hopper and earlier the GEMMs are the larger.
"""

from __future__ import annotations

import numpy as np

from autopar.costs.terms import TermContext
from autopar.inputs.hardware import BLACKWELL_GENERATIONS
from autopar.inputs.specs import ModelSpec
from cost_models.gemm import (
    BYTES_BF16,
    gemm_dtype,
    gemm_efficiency,
    gemm_time_s,
    memory_time_s,
    peak_of,
    shape_factor,
)

FLASH_BACKWARD_SLOWDOWN = 1.15
"""Flash-attention backward runs at lower FLOP/s than its forward: FlashAttention-2 paper
(Dao 2023) reports up to 73% of A100 peak forward and 63% backward (ratio 1.16)."""
BLACKWELL_BACKWARD_SLOWDOWN = 2.0
"""The same on Blackwell (and Blackwell Ultra), where the fused-attention backward is bound by
shared memory, whose bandwidth (128 B per clock per SM) did not grow with the tensor cores
(FlashAttention-4, arXiv 2603.05451: "the main performance bottleneck lies ... in the
shared-memory traffic during the BWD computation"). The factor is fitted on the dense Blackwell
rows, jointly with the GPUs' GEMM efficiencies (``benchmarks/fit_blackwell.py`` scans it): with
Hopper's 1.15 the attention-heavy Llama 3 8B and 70B rows and the GEMM-heavy 405B rows need
GEMM efficiencies 15% apart on one GPU; at 2.0 one efficiency per GPU fits all three (largest
dense |error| 14.7% -> 11.7%)."""
BACKWARD_SLOWDOWN: dict[str, float] = {
    "blackwell": BLACKWELL_BACKWARD_SLOWDOWN,
    "blackwell-ultra": BLACKWELL_BACKWARD_SLOWDOWN,
}


SFU_SPEEDUP: dict[str, float] = {"blackwell-ultra": 2.0}
"""Exponentials per clock per SM over Blackwell's 16: Blackwell Ultra doubles the special
function units' ``ex2`` throughput for attention (NVIDIA technical blog "Inside NVIDIA
Blackwell Ultra", 2025: "2x attention-layer acceleration"; 10.7 against 5 TeraExponentials/s)
and nothing else of the SM: its shared memory still moves 128 B per clock per SM. The
fused-attention backward is bound by that shared memory (FlashAttention-4, arXiv 2603.05451),
so it keeps Blackwell's pace: ``flash_block_time_s(backward=True)`` divides the exponential rate
by this factor, which prices the backward as the forward would run on Blackwell's units."""


ATTENTION_TILE = 128
"""Query and key rows of one fused-attention tile on Hopper and Blackwell (FlashAttention-3 and
-4 use 128 x 128 tiles for head sizes 64-128; FlashAttention-4, arXiv 2603.05451, two 128-row
query tiles per CTA). A tile the mask only partly covers is computed whole and masked element
by element; only tiles wholly outside the mask are skipped (cudnn-frontend's SM100 kernels bound
the key loop by the sliding window's first tile, ``compute_kv_loop_bounds``)."""


def windowed_keys(window: int, seq_len: int) -> int:
    """The ``seq_len`` to give ``attention_core_time_s`` (whose fused path counts half the keys,
    as for a causal mask) for a causal sliding window of ``window`` keys: a query tile covers
    its ``ATTENTION_TILE`` rows' keys plus the window before them, all computed, so each query
    pays ``window + ATTENTION_TILE`` keys, never more than the causal ``seq_len / 2``."""
    return int(min(seq_len, 2 * (window + ATTENTION_TILE)))


FP8_UNWINDOWED_BACKWARD: frozenset[str] = BLACKWELL_GENERATIONS
"""GPU generations whose FP8 fused-attention backward computes the whole causal triangle of a
sliding-window layer (the forward skips the tiles outside the window, the backward does not).
Measured, not fitted: NVIDIA's cuDNN SDPA training benchmark (cudnn-frontend @3929da2,
``benchmark/sdpa_benchmark_training/results/gpt_oss/gb200/gpt_oss_20260424_100011.csv`` and
``gb300/gpt_oss_20260424_100022.csv``, cuDNN 9.22; head size 64, 128-token causal window,
2 x 128 heads) times the BF16 backward linear in the sequence (GB200: 0.237 / 0.465 / 0.911 /
1.818 / 3.692 ms at 2,048 ... 32,768) but the FP8 (current scaling) and MXFP8 backward
quadratic (FP8 0.536 / 1.731 / 6.176 / 23.23 / 90.35 ms, MXFP8 0.642 / 2.080 / 7.427 / 27.94 /
108.4 ms: x3.2-3.9 per doubling), while the FP8 forward stays linear (0.101 / 0.195 / 0.385 /
0.766 / 1.529 ms). At 4,096 the FP8 backward is 3.7x (MXFP8 4.5x) the BF16 one and runs the
whole causal triangle's FLOPs at 795 (660) TFLOP/s, two thirds of cuDNN's causal FP8 rate at
head size 128 and that length (1,178 TFLOP/s, ``attention_measured``): the kernel a causal layer
runs. Transformer Engine runs GPT-OSS's sink attention in FP8 on these GPUs since v2.15
(``attention/dot_product_attention/utils.py`` L882 "Filter: Softmax type" at v2.15: FusedAttention
with ``fp8_dpa`` needs compute capability 10.0 and cuDNN 9.21; v2.10-v2.14 refuse FP8 with sinks;
the MXFP8 attention of TE PR #2719), which the 26.08 GPT-OSS recipes turn
on (``fp8_dot_product_attention = True``, Megatron-Bridge v0.6.0
``perf_recipes/gpt_oss/common.py`` ``_apply_gpt_oss_120b_full_iter_fp8mx_configs``). Hopper has
no FP8 backward at head size 64 (cudnn-frontend ``results/h200_919_only_cudnn/
gpt_oss_20260227_034819.csv``: "hidden_dim shoud be equal to 128"), so it is not listed."""


def windowed_backward(ctx: TermContext) -> bool:
    """Whether the fused-attention backward of a sliding-window layer skips the key tiles
    outside the window as its forward does (``windowed_keys``): not in FP8 on the generations of
    ``FP8_UNWINDOWED_BACKWARD``, whose backward costs what a causal layer's does."""
    fp8 = gemm_dtype(ctx, "attention") == "fp8"
    return not (fp8 and ctx.cluster.gpu.generation in FP8_UNWINDOWED_BACKWARD)


def backward_slowdown(ctx: TermContext) -> float:
    """How much slower per FLOP the fused-attention backward runs than its forward on the GPU."""
    return BACKWARD_SLOWDOWN.get(ctx.cluster.gpu.generation, FLASH_BACKWARD_SLOWDOWN)


SCORE_ELEMENTWISE_BYTES = 9.0
"""Bytes per attention-score element, forward, when scores are materialised (no flash
attention), outside the two batched GEMMs: scaled-masked softmax read 2 + write 2, dropout read 2
+ write 2 + mask 1 (Megatron's fused softmax path). The GEMMs' own score write and probability
read (2 + 2) are their operand traffic in ``gemm_time_s``; counting them here too (13 B) made
every unfused-attention run slower by up to 12% (the 1.7B row of Narayanan Table 1)."""
EXP_EFFICIENCY = 0.48
"""Fraction of the exponential units' rate a fused-attention forward sustains, from one
published kernel benchmark, not fitted on training runs: FlashAttention-4 reaches 1,613
TFLOP/s on B200 (BF16, head dim 128) and is "up to 1.3x faster than cuDNN 9.13" (arXiv
2603.05451 abstract), so cuDNN, the fused attention Transformer Engine runs, sustains about
1,240 TFLOP/s; at 4 x 128 FLOPs per score element that is 2.4e12 elements/s, 0.48 of B200's
5e12 exponentials/s."""


def flash_block_time_s(
    queries: np.ndarray,
    keys: np.ndarray,
    head_dim: float,
    *,
    ctx: TermContext,
    dtype: str,
    backward: bool = False,
) -> np.ndarray:
    """One head's fused attention over a ``queries x keys`` block, forward, as the time of one
    ``(q x d) @ (d x k)`` GEMM (both GEMMs of the block, half of each when causal): the FLOPs at
    the GEMM efficiency of those shapes or, when slower, the ``q*k/2`` exponentials at
    ``EXP_EFFICIENCY`` of the GPU's rate (module docstring); plus HBM traffic of Q, O (``q*d``)
    and K, V (``k*d``) only. The ``q x k`` scores stay in on-chip memory (Dao et al. 2022,
    FlashAttention §3.1), so unlike ``gemm_time_s`` no output of ``q*k`` elements is written.
    ``backward``: the same block at the pace the backward scales from (``SFU_SPEEDUP``); the
    caller multiplies it by ``2 * backward_slowdown``."""
    q, k = (np.asarray(x, dtype=np.float64) for x in (queries, keys))
    rate = peak_of(ctx, dtype) * gemm_efficiency(ctx, dtype=dtype) * shape_factor(q, k, head_dim)
    mma = 2.0 * q * k * head_dim / rate
    exp_per_s = ctx.cluster.gpu.attention_exp_per_s
    if exp_per_s is not None and backward:
        exp_per_s = exp_per_s / SFU_SPEEDUP.get(ctx.cluster.gpu.generation, 1.0)
    if exp_per_s is not None:
        mma = np.maximum(mma, 0.5 * q * k / (exp_per_s * EXP_EFFICIENCY))
    traffic = BYTES_BF16 * head_dim * (q + k)
    return mma + memory_time_s(traffic, ctx)


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
    backward: bool = False,
) -> np.ndarray:
    """Forward of the attention core of one layer on one rank (``tokens = mbs*s/cp`` queries
    against ``seq_len`` keys, ``heads/tp`` heads). Flash attention skips the masked half of a
    causal score matrix and never writes it; the unfused path computes it all and runs the
    softmax / dropout over it in HBM. ``head_dim`` overrides ``kv_channels`` (MLA: the mean of
    the score and value head sizes). ``backward``: the block time the backward scales from
    (``flash_block_time_s``)."""
    d = head_dim or model.kv_channels
    heads = model.num_attention_heads / np.asarray(tp, dtype=np.float64)
    queries = tokens / mbs
    batch = mbs * heads
    dtype = gemm_dtype(ctx, "attention")
    if flash_attention:
        # Two GEMMs of 2*q*s*d each, causal: half of both.
        return batch * flash_block_time_s(
            queries, seq_len, d, ctx=ctx, dtype=dtype, backward=backward
        )
    one = gemm_time_s(queries, seq_len, d, ctx=ctx, dtype=dtype, measured_ok=False)
    scores = memory_time_s(SCORE_ELEMENTWISE_BYTES * batch * queries * seq_len, ctx)
    return 2.0 * batch * one + scores
