"""The GEMM profile measured on an H200 (benchmarks/gpu_gemm.py) feeds the compute term."""

from __future__ import annotations

import pytest

import autopar
from autopar.calibration.profile_io import load_profile
from tests.conftest import REPO

PROFILE = REPO / "benchmarks" / "data" / "h200_gemm_profile.yaml"


def test_measured_profile_has_bf16_and_fp8_points() -> None:
    profile = load_profile(PROFILE)
    point = next(p for p in profile.gemm if p.dtype == "bf16")
    assert profile.gemm_flop_per_s(point.m, point.n, point.k, "bf16") == point.flop_per_s
    assert {p.dtype for p in profile.gemm} == {"bf16", "fp8"}
    # Hopper: FP8 GEMMs run well above BF16 ones, and below the dense FP8 peak.
    bf16 = [p.flop_per_s for p in profile.gemm if p.dtype == "bf16"]
    fp8 = [p.flop_per_s for p in profile.gemm if p.dtype == "fp8"]
    assert max(bf16) < 989e12 and 1.3 * max(bf16) < max(fp8) < 1979e12


def test_measured_rates_replace_the_roofline_in_compute() -> None:
    options = dict(
        model="llama-70b",
        gpus=64,
        gpu="h200",
        seq_len=8192,
        global_batch=128,
        tp=8,
        pp=4,
        vpp=5,
        recompute="selective",
    )
    roofline = autopar.evaluate(**options)
    measured = autopar.evaluate(comm_profile=str(PROFILE), **options)
    assert measured.time_s["compute"] != roofline.time_s["compute"]
    # Same physics, other source: within the roofline's measured error band (benchmarks/README).
    assert measured.time_s["compute"] == pytest.approx(roofline.time_s["compute"], rel=0.25)
