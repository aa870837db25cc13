"""Measured fused-attention throughput on Blackwell and Blackwell Ultra: cuDNN's SDPA training
kernels as NVIDIA's cudnn-frontend benchmark publishes them, forward and backward, per head size,
key-loop length and number format. No constant here is fitted on training runs. Not yet what
the model prices (``attention.flash_block_time_s`` keeps the exponential bound and the fitted
backward factor): ``benchmarks/attention_cudnn.py`` applies it in-process and prints what it
does to the Blackwell rows (benchmarks/README.md "Blackwell rows": the medians improve, the
maxima rise until the cost the fitted factor stands in for is modelled).

Source: cudnn-frontend ``benchmark/sdpa_benchmark_training/results/`` at commit 3929da2 (cuDNN
9.22.0, frontend 1.21.1, GB200 and GB300, batch 2, causal ``top_left`` mask, non-deterministic
backward as Transformer Engine runs it by default): ``llama3.1/gb200/llama3.1_20260424_100750.csv``
and ``llama3.1/gb300/llama3.1_20260424_100757.csv`` (64 query / 8 KV heads, head size 128),
``dsv3/gb200/dsv3_20260424_101009.csv`` and ``dsv3/gb300/dsv3_20260424_101002.csv`` (128 heads,
Q/K 192, V 128: MLA), ``gpt_oss/gb200/gpt_oss_20260424_100011.csv`` and
``gpt_oss/gb300/gpt_oss_20260424_100022.csv`` (head size 64, 128-token sliding window); and the
1,024-token window of ``gb200_919_only_cudnn/gpt_oss_20260226_175022.csv`` /
``gb300_919_only_cudnn/gpt_oss_20260226_185932.csv`` (cuDNN 9.19, at commit df73764).
cuDNN 9.18 and 9.19 (commits b8c0656, df73764; batch 1) give the Llama shape within 8% of
9.22 at sequences 2,048-16,384 (GB200 forward at 8,192: 1,563 / 1,598 / 1,574 TFLOP/s), so the
figures stand for the containers of 2025-26.

The benchmark counts FLOPs as ``2 x (unmasked score elements) x (d_qk + d_vo)`` forward and
``2 x elements x (3 d_qk + 2 d_vo)`` backward (``benchmark_single_sdpa.py`` ``flops``): with
``d = (d_qk + d_vo) / 2`` (the head size ``attention_core_time_s`` takes for MLA) that is the
model's forward ``4 d`` per element and 2.5 times it backward, so the rates below are FLOP/s in
the model's count (the MLA backward's ``3 x 192 + 2 x 128 = 832`` against ``2.5 x 320 = 800``
is divided out).

The rates depend on the key-loop length, the keys per query row (``seq / 2`` causal), not on the
mask: the same Llama files' ``no_mask`` rows at half the sequence agree within 2% at causal
sequences 4,096-8,192 (GB200 forward: causal 8,192 1,574 TFLOP/s, full 4,096 1,599), within 6%
up to 16,384 (the backward at 32,768: 12%). Short loops pay each query tile's
prologue and epilogue (Q load, O store, softmax rescale) over fewer key tiles; the 128-token
window pays it over two key tiles (``attention.windowed_keys``) and runs at half the rate of the
1,024-token window, which these tables express as a key-loop length of 256 against 1,152.
"""

from __future__ import annotations

import numpy as np

from autopar.costs.terms import TermContext

KEYS_PER_QUERY = (1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
"""Keys per query row of the causal rows at sequence 2,048 ... 32,768 (half the sequence)."""
WINDOW_KEYS_PER_QUERY = (256.0, 1152.0)
"""Keys per query row a 128 / 1,024-token causal window computes: the window plus one 128-row
tile (``attention.windowed_keys``); the benchmark counts only the window, the rates below are
scaled to the computed keys (x 256 / 128 and x 1,152 / 1,024), at sequence 8,192."""
_MLA_BACKWARD = 800.0 / 832.0
"""The model's backward FLOPs over the benchmark's for Q/K 192, V 128 (module docstring)."""

CUDNN_SDPA_TFLOP_PER_S: dict[tuple[str, str, int], tuple[tuple[float, ...], ...]] = {
    # (generation, attention dtype, head size) -> (keys per query, forward, backward TFLOP/s)
    ("blackwell", "bf16", 128): (
        KEYS_PER_QUERY,
        (1097.0, 1408.0, 1574.0, 1708.0, 1622.0),
        (885.0, 1148.0, 1332.0, 1328.0, 1226.0),
    ),
    ("blackwell", "fp8", 128): (
        KEYS_PER_QUERY,
        (1420.0, 1805.0, 2047.0, 2154.0, 2197.0),
        (831.0, 1178.0, 1454.0, 1632.0, 1687.0),
    ),
    ("blackwell", "bf16", 160): (
        KEYS_PER_QUERY,
        (1072.0, 1406.0, 1585.0, 1678.0, 1743.0),
        tuple(_MLA_BACKWARD * r for r in (846.0, 1057.0, 1193.0, 1134.0, 1076.0)),
    ),
    ("blackwell", "fp8", 160): (
        KEYS_PER_QUERY,
        (1659.0, 2095.0, 2397.0, 2486.0, 2447.0),
        tuple(_MLA_BACKWARD * r for r in (1312.0, 1692.0, 1959.0, 1968.0, 1857.0)),
    ),
    ("blackwell", "bf16", 64): (
        WINDOW_KEYS_PER_QUERY,
        (2.0 * 165.0, 1.125 * 609.0),
        (2.0 * 187.0, 1.125 * 646.0),
    ),
    ("blackwell-ultra", "bf16", 128): (
        KEYS_PER_QUERY,
        (1373.0, 1703.0, 1856.0, 1915.0, 1953.0),
        (967.0, 1248.0, 1435.0, 1507.0, 1490.0),
    ),
    ("blackwell-ultra", "fp8", 128): (
        KEYS_PER_QUERY,
        (1954.0, 2532.0, 2897.0, 3054.0, 3108.0),
        (944.0, 1396.0, 1781.0, 2035.0, 2128.0),
    ),
    ("blackwell-ultra", "bf16", 160): (
        KEYS_PER_QUERY,
        (1285.0, 1590.0, 1825.0, 1967.0, 1991.0),
        tuple(_MLA_BACKWARD * r for r in (914.0, 1143.0, 1291.0, 1302.0, 1289.0)),
    ),
    ("blackwell-ultra", "fp8", 160): (
        KEYS_PER_QUERY,
        (2290.0, 2788.0, 3128.0, 3305.0, 3364.0),
        tuple(_MLA_BACKWARD * r for r in (1511.0, 1982.0, 2310.0, 2459.0, 2406.0)),
    ),
    ("blackwell-ultra", "bf16", 64): (
        WINDOW_KEYS_PER_QUERY,
        (2.0 * 172.0, 1.125 * 718.0),
        (2.0 * 198.0, 1.125 * 668.0),
    ),
}
"""cuDNN SDPA throughput in the model's FLOP count (module docstring): GB200 for Blackwell,
GB300 for Blackwell Ultra; FP8 is the per-tensor-scaled FP8 attention of those files (head size
64 has BF16 only: its FP8 backward is not a training kernel there, 8-78 TFLOP/s)."""


MEASURED_PEAK_BF16_FLOP_PER_S: dict[str, float] = {
    "blackwell": 2500e12,
    "blackwell-ultra": 2500e12,
}
"""Dense BF16 datasheet peak of the GPU each generation's table was measured on (GB200 and
GB300 NVL72: 2.5 PFLOP/s, ``autopar/presets/gpus/gb200-nvl72.yaml``, ``gb300-nvl72.yaml``). A
same-silicon SKU with a lower peak (B200, B300: 2.25 PFLOP/s) has it from lower clocks, which
slow the attention kernel as they slow its tensor cores, exponential units and shared memory
alike: ``measured_attention_flop_per_s`` scales the rates by the peaks' ratio (no fit)."""


def _curve(
    generation: str, dtype: str, head_dim: int, backward: bool
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    entry = CUDNN_SDPA_TFLOP_PER_S.get((generation, dtype, head_dim))
    entry = entry or CUDNN_SDPA_TFLOP_PER_S.get((generation, "bf16", head_dim))
    if entry is None:
        return None
    return entry[0], entry[2 if backward else 1]


def measured_attention_flop_per_s(
    generation: str,
    peak_bf16_flop_per_s: float,
    dtype: str,
    head_dim: float,
    keys_per_query: np.ndarray,
    *,
    backward: bool,
) -> np.ndarray | None:
    """FLOP/s (model count) of cuDNN's fused attention on ``generation`` at ``head_dim`` and
    ``keys_per_query``, or None where nothing is measured. Linear in log2(keys per query)
    between the measured lengths and in the head size between the measured sizes (64, 128,
    160), held at the ends; scaled by ``peak_bf16_flop_per_s`` over the measured GPU's
    (``MEASURED_PEAK_BF16_FLOP_PER_S``)."""
    sizes = sorted({d for g, _, d in CUDNN_SDPA_TFLOP_PER_S if g == generation})
    if not sizes:
        return None
    keys = np.log2(np.maximum(np.asarray(keys_per_query, dtype=np.float64), 1.0))

    def rate_at(size: int) -> np.ndarray:
        lengths, rates = _curve(generation, dtype, size, backward)
        return np.interp(keys, np.log2(lengths), rates)

    d = float(np.clip(head_dim, sizes[0], sizes[-1]))
    upper = next(s for s in sizes if s >= d)
    lower = max(s for s in sizes if s <= d)
    clocks = 1e12 * peak_bf16_flop_per_s / MEASURED_PEAK_BF16_FLOP_PER_S[generation]
    if upper == lower:
        return clocks * rate_at(upper)
    weight = (d - lower) / (upper - lower)
    return clocks * ((1.0 - weight) * rate_at(lower) + weight * rate_at(upper))


MEASURED_BACKWARD_SLOWDOWN = 1.25
"""Not fitted, a FLOP count: with the forward and the backward each at its measured FLOP/s, what
is left of the backward factor is its FLOPs over twice the forward's (the callers multiply the
block time by ``2 * backward_slowdown``): five GEMMs (S recomputed, dP, dV, dQ, dK) against two,
2.5 = 2 x 1.25 (cudnn-frontend ``benchmark_single_sdpa.py`` ``flops``, "Backward: 5 BMMs"). The
backward's lower FLOP/s (bound by shared memory, FlashAttention-4, arXiv 2603.05451) is in its
measured rate: 1,332 against the forward's 1,574 TFLOP/s on GB200 at head size 128, sequence
8,192."""


def measured_block_time_s(
    queries: np.ndarray,
    keys: np.ndarray,
    head_dim: float,
    *,
    ctx: TermContext,
    dtype: str,
    backward: bool = False,
) -> np.ndarray | None:
    """``attention.flash_block_time_s`` from cuDNN's measured rates: one head's causal
    ``queries x keys`` block, ``2 q k d`` FLOPs (half of both GEMMs) at the rate of ``keys / 2``
    keys per query, forward or backward (the rate includes the kernel's HBM traffic); None where
    the GPU's generation has no measurement."""
    gpu = ctx.cluster.gpu
    q, k = (np.asarray(x, dtype=np.float64) for x in (queries, keys))
    rate = measured_attention_flop_per_s(
        gpu.generation, gpu.peak_bf16_flop_per_s, dtype, head_dim, 0.5 * k, backward=backward
    )
    return None if rate is None else 2.0 * q * k * head_dim / rate
