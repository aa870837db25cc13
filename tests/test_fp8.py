"""FP8 as a stack runs it (issue 11): the FP8 GEMM rate from the measured H200 profile, the
quantisation cost per recipe, which GEMMs run in FP8, and the FP8 copies Transformer Engine
keeps for backward."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

import autopar
from autopar.base.errors import InputError
from cost_models.compute import GEMM_HALF_DIM, H200_FP8_TO_BF16_EFFICIENCY, HBM_EFFICIENCY
from tests.conftest import REPO

LAYOUT = dict(model="llama-3-70b", gpus=64, seq_len=8192, global_batch=128, tp=4, pp=8, vpp=5)


def _roofline_efficiency(point: dict, hbm_bytes_per_s: float) -> float:
    """The efficiency ``gemm_time_s`` needs to reproduce one measured H200 GEMM."""
    m, n, k, fp8 = point["m"], point["n"], point["k"], point["dtype"] == "fp8"
    flop = 2.0 * m * n * k
    traffic = (1.0 if fp8 else 2.0) * (m * k + k * n) + 2.0 * m * n
    compute_s = flop / point["flop_per_s"] - traffic / (hbm_bytes_per_s * HBM_EFFICIENCY)
    shape = np.prod([d / (d + GEMM_HALF_DIM) for d in (m, n, k)])
    return flop / compute_s / ((1979e12 if fp8 else 989e12) * shape)


def test_fp8_to_bf16_efficiency_is_the_measured_h200_ratio() -> None:
    points = yaml.safe_load((REPO / "benchmarks/data/h200_gemm_profile.yaml").read_text())["gemm"]
    eff = {
        dtype: np.median([_roofline_efficiency(p, 4.8e12) for p in points if p["dtype"] == dtype])
        for dtype in ("bf16", "fp8")
    }
    assert eff["fp8"] / eff["bf16"] == pytest.approx(H200_FP8_TO_BF16_EFFICIENCY, abs=0.005)
    h200 = autopar.make_problem(model="llama-3-8b", gpus=8, gpu="h200").cluster.gpu
    assert h200.gemm_efficiency == pytest.approx(eff["bf16"], abs=0.005)
    assert h200.fp8_gemm_efficiency == pytest.approx(eff["fp8"], abs=0.005)


def test_fp8_speedup_over_bf16_is_in_the_measured_range() -> None:
    """Published FP8 runs measure 1.33-1.53x over BF16 on the same layouts (issue 11)."""
    bf16 = autopar.evaluate(**LAYOUT, stack="megatron-bridge-25.09")
    fp8 = autopar.evaluate(**LAYOUT, stack="megatron-bridge-25.09", precision="fp8")
    assert 1.25 <= bf16.step_time_s / fp8.step_time_s <= 1.6


def test_recipes_order_by_quantisation_cost() -> None:
    times = {
        recipe: autopar.evaluate(**LAYOUT, precision="fp8", fp8_recipe=recipe).step_time_s
        for recipe in ("delayed", "current", "blockwise")
    }
    assert times["delayed"] < times["current"] < times["blockwise"]


def test_fewer_fp8_gemms_is_slower_and_attention_in_fp8_faster() -> None:
    all_linear = autopar.evaluate(**LAYOUT, precision="fp8").step_time_s
    mlp_only = autopar.evaluate(**LAYOUT, precision="fp8", fp8_gemms="fc1,fc2").step_time_s
    with_attention = autopar.evaluate(
        **LAYOUT, precision="fp8", fp8_gemms="qkv,proj,fc1,fc2,attention"
    ).step_time_s
    assert with_attention < all_linear < mlp_only


def test_fp8_keeps_fp8_copies_for_backward() -> None:
    bf16 = autopar.evaluate(**LAYOUT, stack="nemo-24.07")
    fp8 = autopar.evaluate(**LAYOUT, stack="nemo-24.07", precision="fp8")
    ratio = fp8.memory_bytes["activations"] / bf16.memory_bytes["activations"]
    assert 0.75 < ratio < 0.95


def test_nemotron_340b_fp8_fits_as_it_ran() -> None:
    """NeMo 24.07: Nemotron-4 340B FP8 at TP 8 PP 8 VP 12 on 128 H100s trained in 80 GB."""
    run = autopar.evaluate(
        model="nemotron-4-340b",
        gpus=128,
        seq_len=4096,
        global_batch=32,
        precision="fp8",
        stack="nemo-24.07",
        tp=8,
        pp=8,
        vpp=12,
    )
    assert run.fits
    bf16 = autopar.evaluate(
        model="nemotron-4-340b", gpus=128, seq_len=4096, global_batch=32, stack="nemo-24.07",
        tp=8, pp=8, vpp=12,
    )  # fmt: skip
    assert bf16.memory_bytes["total"] > run.memory_bytes["total"]


def test_gpus_without_a_measurement_use_the_same_model() -> None:
    mi300x = autopar.make_problem(model="llama-3-8b", gpus=8, gpu="mi300x").cluster.gpu
    assert mi300x.gemm_efficiency is None  # datasheet x calibrated efficiency x measured ratio
    fast = autopar.evaluate(model="llama-3-8b", gpus=8, gpu="mi300x", precision="fp8")
    slow = autopar.evaluate(model="llama-3-8b", gpus=8, gpu="mi300x")
    assert fast.step_time_s < slow.step_time_s


def test_mxfp8_needs_blackwell() -> None:
    with pytest.raises(InputError, match="Blackwell"):
        autopar.make_problem(model="llama-3-8b", gpus=8, precision="fp8", fp8_recipe="mxfp8")
    autopar.make_problem(model="llama-3-8b", gpus=8, fp8_recipe="mxfp8")  # BF16: no effect
    autopar.make_problem(
        model="llama-3-8b", gpus=8, gpu="b200", precision="fp8", fp8_recipe="mxfp8"
    )
