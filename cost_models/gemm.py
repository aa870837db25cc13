"""GEMMs and memory-bound work on one GPU: the roofline, its efficiencies per GPU and number
format, and the quantisation traffic of the low-precision recipes (DESIGN §4 "Compute time").

Each GEMM is timed as ``FLOPs / achievable FLOP/s + bytes / achievable HBM bandwidth`` (a
roofline whose two sides add: see ``gemm_time_s``). The achievable FLOP/s is the dense peak of
the GEMM's number format times an efficiency that falls for small per-rank shapes:

    efficiency(m, n, k) = efficiency(GPU, format) * prod_d d / (d + GEMM_HALF_DIM)

Number formats (``gemm_dtype``): BF16; FP8 for the GEMMs the stack lists
(``StackSpec.fp8_gemms``) when the precision is ``fp8``, per recipe (delayed / current
tensor-wise scaling, blockwise, MXFP8); FP4 for the same linear layers when the precision is
``nvfp4`` (Transformer Engine ``NVFP4BlockScaling``: forward, data- and weight-gradient GEMMs
all in FP4; the attention core stays BF16 unless ``attention`` is listed, then it runs in FP8
as TE's ``fp8_dpa``; the output layer and the MoE router stay BF16, as in Megatron
``fp4_utils.get_fp4_context``). Memory-bound elementwise work costs bytes / (HBM bandwidth *
HBM_EFFICIENCY). A measured GEMM profile (``ctx.gemm.gemm_flop_per_s(m, n, k, dtype)``)
replaces the efficiency curve for the formats it holds.
"""

from __future__ import annotations

import numpy as np

from autopar.costs.terms import TermContext
from autopar.inputs.hardware import BLACKWELL_GENERATIONS

GEMM_EFFICIENCY = 0.83
"""Fraction of the datasheet dense peak a large GEMM sustains in training (clocks under load,
epilogues, launch gaps), for GPUs without a measured or fitted value (``GpuSpec.gemm_efficiency``).
Calibrated on data/published (benchmarks/README.md)."""
H200_FP8_TO_BF16_EFFICIENCY = 0.891
"""Measured, not fitted: on one H200 (``benchmarks/data/h200_gemm_profile.yaml``, 563 shapes of
real models per dtype), the efficiency this module's roofline needs to reproduce each measured
GEMM (FLOP time = measured time - operand traffic time, over peak x shape factor) has median
0.662 for FP8 (against the 1,979 TFLOP/s FP8 peak) and 0.743 for BF16 (against 989): FP8 GEMMs
reach 0.891 of BF16's fraction of peak (the main loop halves; scaling, epilogue and the BF16
output do not). ``tests/test_fp8.py`` recomputes it from the profile."""
BLACKWELL_FP8_TO_BF16_EFFICIENCY = 1.017
"""Measured, not fitted: the same ratio for GEMMs on Blackwell tensor cores
(``BLACKWELL_GENERATIONS``), where FP8 GEMMs reach BF16's fraction of peak. NVIDIA's Transformer
Engine GEMM benchmark on a B300 (``docs/features/low_precision_training/gemm_profiling/
gemm_profiling.rst`` @ce616e1, ``benchmarks/gemm/benchmark_gemm.py --pre-quantize``: the 12
GEMMs of a layer of hidden 4,096 and FFN 16,384 at 15,872 tokens, kernels only) times them at
12.835 ms in BF16 and 7.324 ms in MXFP8, 1.75x (1,494 and 2,618 TFLOP/s: 0.664 and 0.582 of the
2,250 / 4,500 peaks); this module's roofline gives that 1.75x, with MXFP8 at
``MXFP8_GEMM_SLOWDOWN`` below tensor-wise FP8, only if tensor-wise FP8 reaches 1.017 of BF16's
fraction of peak (the H200's 0.891 gives 1.56x). ``tests/test_blackwell.py`` recomputes it. XLA's
cuBLAS table for sm_100 (``matmul_interpolator_data.h``, batch 4 x 4,096^3: BF16 1,670, FP8
3,280 TFLOP/s, 0.742 / 0.729 of peak) agrees. Applied as ``BLACKWELL_BF16_GEMM_SLOWDOWN``."""
BLACKWELL_BF16_GEMM_SLOWDOWN = BLACKWELL_FP8_TO_BF16_EFFICIENCY / H200_FP8_TO_BF16_EFFICIENCY
"""How much slower than ``gemm_efficiency`` gives a BF16 GEMM runs on Blackwell (1.141). A
Blackwell preset's ``gemm_efficiency`` is fitted on FP8 / MXFP8 rows through the H200 ratio
(``fp8 = bf16 * H200_FP8_TO_BF16_EFFICIENCY``), so the FP8 GEMMs keep that rate and BF16 GEMMs
run at the FP8 fraction of peak over ``BLACKWELL_FP8_TO_BF16_EFFICIENCY``. The fused attention
core (cuDNN, not a GEMM library; ``attention.flash_block_time_s`` reads ``gemm_efficiency``)
keeps the preset's value."""
FP8_GEMM_EFFICIENCY = GEMM_EFFICIENCY * H200_FP8_TO_BF16_EFFICIENCY
"""FP8 GEMM efficiency against the FP8 peak, for GPUs without their own value: the BF16
efficiency times the measured H200 FP8:BF16 ratio (the same roofline model on both sides)."""
FP4_TO_FP8_EFFICIENCY = 0.736
"""NVFP4 GEMMs' fraction of the FP4 peak over FP8 GEMMs' fraction of the FP8 peak, for GPUs
without their own ``fp4_gemm_efficiency``. Fitted on the four NVFP4 Megatron-Bridge rows
(Llama 3 70B and Llama 3.1 405B on GB200 and GB300, benchmarks/README.md "Blackwell"): the
FP4 main loop is 2x (GB200) or 3x (GB300) FP8's, its two-level scales (an E4M3 scale per 16
elements, an FP32 one per tensor), the random Hadamard transforms of the wgrad operands and the
BF16 epilogue are not, so the end-to-end NVFP4 speed-up over FP8 at the same layout is 1.3-1.5x
(the rows' own pairs: 405B 1166/843 tokens/s on GB200, 1413/1048 on GB300)."""
BLOCKWISE_GEMM_SLOWDOWN = 1.10
"""Blockwise FP8 (1x128 activation and 128x128 weight scales, DeepSeek-V3 style) on Hopper
applies the scales in the main loop (promotion to FP32 on CUDA cores every 128 of K): DeepGEMM
reports ~1,550 TFLOP/s on H800 against ~1,700 for tensor-wise cuBLAS FP8 GEMMs of the same
shapes."""
MXFP8_GEMM_SLOWDOWN = 1.14
"""MXFP8 (an E8M0 scale per 32 elements, Blackwell tensor cores) against tensor-wise FP8 GEMMs
on the same GPU. From the Megatron-Bridge 25.11 tables, which print both recipes for the same
layout and container (the parenthesised values, benchmarks/data/published/ §19): Llama 3 8B
MXFP8 runs 3.6% (B200), 5.5% (GB200) and 3.9% (GB300) slower than FP8-CS, Llama 3.1 405B 5.6%
(B200); with this module's cast bytes (MXFP8 needs no amax pass, so it moves fewer bytes than
current scaling) that takes GEMMs 1.14x slower (benchmarks/validate_published.py prints the
pairs). Megatron-Bridge's performance guide says the same in words: "MXFP8 with a 1x32
quantization block performs less efficiently than full tensor-wise FP8 scaling"
(docs/performance-guide.md L19)."""
GEMM_HALF_DIM = 32.0
"""GEMM dimension at which that dimension alone halves the efficiency (tile size order: cuBLAS
tiles are 64-256 wide). Calibrated on data/published."""
HBM_EFFICIENCY = 0.80
"""Fraction of datasheet HBM bandwidth that streaming kernels reach (STREAM-like copies reach
80-90% on A100/H100)."""
BYTES_BF16 = 2.0
OPERAND_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5 + 1.0 / 16.0}
"""HBM bytes per GEMM operand element: NVFP4 holds 4 bits and an E4M3 scale per 16 elements
(TE ``NVFP4BlockScaling``); FP8 scales (one per tensor, per 32 or per 128 elements) are
negligible."""
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
NVFP4_CAST_BYTES = 2.0 + 2.0 + 2.0 * OPERAND_BYTES["fp4"]
"""HBM bytes per element to quantise an NVFP4 GEMM operand (an activation forward, an output
gradient backward): the per-tensor FP32 scale needs the amax first (read 2), then one pass
reads the BF16 tensor (2) and writes the row-wise copy and the column-wise copy, the latter
through a 16x16 random Hadamard transform (RHT, for the weight gradient), each 0.5 B plus an
E4M3 scale per 16 elements. TE computes both from the high-precision tensor ("during the
quantization both versions are computed from the high precision input", ``NVFP4BlockScaling``,
transformer_engine/common/recipe/__init__.py L489-520); gradients are stochastically rounded in
the same pass. Weights (2D 16x16 blocks) are quantised once per step."""
FP8_FUSED_CAST_BYTES = 1.0
"""With delayed scaling the scale is known before the tensor is produced, so LayerNorm (QKV,
FC1 inputs) and the MLP activation (FC2 input) write FP8 directly (TE ``LayerNormLinear``,
``LayerNormMLP``): only the extra transposed copy (1 B) remains."""
FUSED_PRODUCERS: frozenset[str] = frozenset({"qkv", "fc1", "fc2"})
FP4_GEMMS: frozenset[str] = frozenset({"qkv", "proj", "fc1", "fc2"})
"""The linear layers an NVFP4 recipe runs in FP4 (of those the stack lists in ``fp8_gemms``)."""


def gemm_dtype(ctx: TermContext, gemm: str) -> str:
    """The number format ``gemm`` (``qkv``, ``proj``, ``fc1``, ``fc2``, ``attention``,
    ``logits``, ``router``) runs in: ``bf16``, ``fp8`` or ``fp4`` (module docstring)."""
    precision, stack = ctx.training.precision, ctx.training.stack
    if not stack.fp8(gemm):
        return "bf16"
    if precision == "fp8":
        return "fp8"
    if precision == "nvfp4":
        return "fp4" if gemm in FP4_GEMMS else "fp8" if gemm == "attention" else "bf16"
    return "bf16"


def gemm_efficiency(ctx: TermContext, *, dtype: str) -> float:
    """Fraction of the ``dtype`` dense peak a large GEMM sustains: the GPU preset's value where
    it has one (``GpuSpec.gemm_efficiency``: Hopper measured on an H200, Blackwell fitted per
    SKU), else ``GEMM_EFFICIENCY``; FP8 scales it by the measured FP8:BF16 ratio
    (``H200_FP8_TO_BF16_EFFICIENCY``) and FP4 that by ``FP4_TO_FP8_EFFICIENCY`` unless the
    preset has its own. Both times the stack's ``kernel_efficiency`` (older libraries on the
    same GPU)."""
    gpu = ctx.cluster.gpu
    kernels = ctx.training.stack.kernel_efficiency
    bf16 = gpu.gemm_efficiency or GEMM_EFFICIENCY
    if dtype == "bf16":
        return bf16 * kernels
    fp8 = gpu.fp8_gemm_efficiency or bf16 * H200_FP8_TO_BF16_EFFICIENCY
    if dtype == "fp8":
        return fp8 * kernels
    return (gpu.fp4_gemm_efficiency or fp8 * FP4_TO_FP8_EFFICIENCY) * kernels


def peak_of(ctx: TermContext, dtype: str) -> float:
    """The dense tensor-core peak of ``dtype`` on the job's GPU."""
    gpu = ctx.cluster.gpu
    if dtype == "fp4":
        return gpu.peak_flop_per_s("nvfp4")
    return gpu.peak_flop_per_s(dtype)


def shape_factor(*dims: np.ndarray) -> np.ndarray:
    """The efficiency lost to small GEMM dimensions: ``prod d / (d + GEMM_HALF_DIM)``."""
    factor = np.ones_like(np.asarray(dims[0], dtype=np.float64))
    for d in dims:
        factor = factor * (d / (d + GEMM_HALF_DIM))
    return factor


def recipe_slowdown(ctx: TermContext, dtype: str) -> float:
    """How much slower than tensor-wise FP8 the stack's FP8 recipe runs the main loop; for BF16
    on Blackwell, ``BLACKWELL_BF16_GEMM_SLOWDOWN``."""
    if dtype == "bf16" and ctx.cluster.gpu.generation in BLACKWELL_GENERATIONS:
        return BLACKWELL_BF16_GEMM_SLOWDOWN
    if dtype != "fp8":
        return 1.0
    recipe = ctx.training.stack.fp8_recipe
    return {"blockwise": BLOCKWISE_GEMM_SLOWDOWN, "mxfp8": MXFP8_GEMM_SLOWDOWN}.get(recipe, 1.0)


def gemm_time_s(
    m: np.ndarray,
    n: np.ndarray,
    k: np.ndarray,
    *,
    ctx: TermContext,
    dtype: str,
    measured_ok: bool = True,
) -> np.ndarray:
    """Roofline time of one ``(m x k) @ (k x n)`` GEMM in ``dtype`` (module docstring), or FLOPs
    over the measured rate of the nearest profiled shapes when the profile has some and
    ``measured_ok`` (a fused kernel such as the attention core keeps the roofline)."""
    m, n, k = (np.asarray(x, dtype=np.float64) for x in (m, n, k))
    flop = 2.0 * m * n * k
    measured = None
    if ctx.gemm is not None and measured_ok and dtype in ("bf16", "fp8"):
        measured = ctx.gemm.gemm_flop_per_s(m, n, k, dtype)
    if measured is not None:
        # A measured GEMM already pays its own operand traffic: wall time is FLOPs / rate, at the
        # stack's share of the profiled libraries' rate.
        rate = np.asarray(measured, dtype=np.float64) * ctx.training.stack.kernel_efficiency
        return flop / rate
    eff = gemm_efficiency(ctx, dtype=dtype) / recipe_slowdown(ctx, dtype)
    rate = peak_of(ctx, dtype) * eff * shape_factor(m, n, k)
    traffic = OPERAND_BYTES[dtype] * (m * k + k * n) + BYTES_BF16 * m * n
    # Additive, not max: operand loads and the output write are only partly hidden behind the
    # tensor-core main loop in training-sized GEMMs; the sum fits H100 (twice A100's FLOP:byte
    # ratio) and A100 with one efficiency (benchmarks/README.md compares max and sum).
    return flop / rate + traffic / (ctx.cluster.gpu.hbm_bytes_per_s * HBM_EFFICIENCY)


def memory_time_s(num_bytes: np.ndarray, ctx: TermContext) -> np.ndarray:
    """Time of memory-bound work moving ``num_bytes`` through HBM."""
    return np.asarray(num_bytes, dtype=np.float64) / (
        ctx.cluster.gpu.hbm_bytes_per_s * HBM_EFFICIENCY
    )


def cast_bytes_per_element(ctx: TermContext, gemm: str, *, forward: bool) -> float:
    """HBM bytes to quantise one element of ``gemm``'s input (forward) or output gradient
    (backward) for the stack's recipe; 0 when ``gemm`` runs in BF16."""
    dtype = gemm_dtype(ctx, gemm)
    if dtype == "fp4":
        return NVFP4_CAST_BYTES
    if dtype == "bf16" or gemm == "attention":
        return 0.0  # fused attention quantises inside its kernel
    recipe = ctx.training.stack.fp8_recipe
    if forward and recipe == "delayed" and gemm in FUSED_PRODUCERS:
        return FP8_FUSED_CAST_BYTES
    return FP8_CAST_BYTES[recipe]


def linear_time_s(
    m: np.ndarray, n: np.ndarray, k: np.ndarray, *, ctx: TermContext, gemm: str
) -> np.ndarray:
    """Forward of one linear layer alone (``linear_times_s``'s first)."""
    return linear_times_s(m, n, k, ctx=ctx, gemm=gemm)[0]


def linear_times_s(
    m: np.ndarray, n: np.ndarray, k: np.ndarray, *, ctx: TermContext, gemm: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forward, backward and weight-gradient times of one linear layer (``gemm`` names it for
    the stack's recipe), its GEMM timed once for the three:

    - forward: the GEMM and, in FP8 or FP4, the quantisation of its input;
    - backward: data + weight gradient GEMMs and, in FP8 or FP4, the quantisation of the
      output gradient;
    - weight gradient: the part of the backward that a zero-bubble schedule defers (Qi et al.
      2024 §2: ``W`` computes ``dL/dW`` from the layer's input and its output's gradient: the
      FLOPs of the forward GEMM)."""
    one = gemm_time_s(m, n, k, ctx=ctx, dtype=gemm_dtype(ctx, gemm))
    cast_f = memory_time_s(cast_bytes_per_element(ctx, gemm, forward=True) * m * k, ctx)
    cast_b = memory_time_s(cast_bytes_per_element(ctx, gemm, forward=False) * m * n, ctx)
    return one + cast_f, 2.0 * one + cast_b, one
