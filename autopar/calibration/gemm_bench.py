"""GEMM throughput benchmark: times ``torch.matmul`` over the GEMM shapes one transformer layer
(and the logits) produce per tensor-parallel rank, reports achieved FLOP/s and merges them into a
profile's ``gemm`` section (``CommProfile.gemm_flop_per_s`` looks them up).

Shapes per rank, tokens ``T = mbs * seq`` (Megatron-LM layout, Narayanan et al. 2021, section 3):
QKV ``(T, h) @ (h, (h + 2 * kv * h/a) / tp)``, attention output ``(T, h/tp) @ (h/tp, h)``,
MLP up ``(T, h) @ (h, g * ffn / tp)`` with ``g = 2`` for gated (SwiGLU) MLPs, MLP down
``(T, ffn/tp) @ (ffn/tp, h)``, logits ``(T, h) @ (h, V/tp)``. ``m, n, k`` name
``(m, k) @ (k, n)``; FLOPs are ``2 m n k``. torch is imported lazily (``autopar[bench]``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autopar.calibration.profile import CommProfile, GemmPoint
from autopar.calibration.profile_io import load_profile, save_profile


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmShape:
    name: str
    m: int
    n: int
    k: int

    @property
    def flop(self) -> float:
        return 2.0 * self.m * self.n * self.k


def model_gemm_shapes(
    *,
    hidden: int,
    ffn: int,
    num_heads: int,
    num_kv_heads: int,
    vocab: int,
    tp: int,
    tokens: int,
    gated_mlp: bool = True,
) -> tuple[GemmShape, ...]:
    """Forward GEMMs of one layer plus the logits, per TP rank (module docstring)."""
    for name, value in (
        ("hidden", hidden),
        ("ffn", ffn),
        ("num_heads", num_heads),
        ("vocab", vocab),
    ):
        if value % tp:
            raise ValueError(f"{name}={value} is not divisible by tp={tp}")
    if hidden % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"need num_heads | hidden and num_kv_heads | num_heads, got {num_heads}, {num_kv_heads}"
        )
    head_dim = hidden // num_heads
    qkv = (hidden + 2 * num_kv_heads * head_dim) // tp
    up = (2 if gated_mlp else 1) * ffn // tp
    return (
        GemmShape(name="qkv", m=tokens, n=qkv, k=hidden),
        GemmShape(name="attn_out", m=tokens, n=hidden, k=hidden // tp),
        GemmShape(name="mlp_up", m=tokens, n=up, k=hidden),
        GemmShape(name="mlp_down", m=tokens, n=hidden, k=ffn // tp),
        GemmShape(name="logits", m=tokens, n=vocab // tp, k=hidden),
    )


def parse_shape(text: str) -> GemmShape:
    """``"m,n,k"`` -> GemmShape."""
    try:
        m, n, k = (int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"shape must be 'm,n,k' with integers, got {text!r}") from None
    if min(m, n, k) < 1:
        raise ValueError(f"shape dimensions must be >= 1, got {text!r}")
    return GemmShape(name=text, m=m, n=n, k=k)


DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp32", "fp8")
"""Names as the cost model looks them up (``CommProfile.gemm_flop_per_s``)."""


def _operands(shape: GemmShape, dtype: str, device):
    """Inputs and the product to time; FP8 (e4m3, per-tensor scales) goes through
    ``torch._scaled_mm``, the kernel Transformer Engine's FP8 linear layers use on Hopper."""
    import torch

    a = torch.randn(shape.m, shape.k, device=device)
    b = torch.randn(shape.n, shape.k, device=device)
    if dtype == "fp8":
        fp8 = torch.float8_e4m3fn
        a8, b8 = a.to(fp8), b.to(fp8).t()  # the second operand column-major, as cuBLASLt wants
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    a, b = a.to(torch_dtype), b.to(torch_dtype).t()
    return lambda: torch.matmul(a, b)


def time_gemm_s(
    shape: GemmShape, *, dtype: str, iters: int, warmup: int, device: str | None
) -> float:
    """Mean seconds of one GEMM of ``shape`` on ``device`` (cuda if available)."""
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    product = _operands(shape, dtype, target)
    for _ in range(warmup):
        product()
    if target.type == "cuda":
        torch.cuda.synchronize(target)
    start = time.perf_counter()
    for _ in range(iters):
        product()
    if target.type == "cuda":
        torch.cuda.synchronize(target)
    return (time.perf_counter() - start) / iters


def run_gemm_bench(
    shapes: Sequence[GemmShape],
    *,
    dtype: str = "bf16",
    iters: int = 10,
    warmup: int = 2,
    device: str | None = None,
) -> tuple[GemmPoint, ...]:
    """Achieved FLOP/s of each shape."""
    points = []
    for shape in shapes:
        seconds = time_gemm_s(shape, dtype=dtype, iters=iters, warmup=warmup, device=device)
        points.append(
            GemmPoint(m=shape.m, n=shape.n, k=shape.k, dtype=dtype, flop_per_s=shape.flop / seconds)
        )
    return tuple(points)


def merge_gemm(profile: CommProfile, points: Sequence[GemmPoint]) -> CommProfile:
    """The profile with ``points`` added; a measured shape replaces the same (m, n, k, dtype)."""
    new = {(p.m, p.n, p.k, p.dtype) for p in points}
    kept = tuple(p for p in profile.gemm if (p.m, p.n, p.k, p.dtype) not in new)
    return CommProfile(
        curves=profile.curves,
        fits=profile.fits,
        sources=profile.sources,
        gemm=kept + tuple(points),
        fallback=profile.fallback,
    )


def merge_into_file(path: str | Path, points: Sequence[GemmPoint]) -> CommProfile:
    """Merge into ``path`` (created with an empty communication part when missing); atomic."""
    path = Path(path)
    base = load_profile(path) if path.exists() else CommProfile(curves=(), fits=())
    merged = merge_gemm(base, points)
    save_profile(merged, path)
    return merged
