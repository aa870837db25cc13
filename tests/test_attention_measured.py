"""cuDNN's measured fused-attention rates on Blackwell (``cost_models.attention_measured``):
the lookup follows the published figures and the physics they show."""

from __future__ import annotations

import numpy as np
import pytest

import autopar
from autopar.api import make_context
from cost_models.attention_measured import (
    CUDNN_SDPA_TFLOP_PER_S,
    measured_attention_flop_per_s,
    measured_block_time_s,
)

PEAK = 2500e12  # GB200 / GB300 dense BF16, the GPUs the tables were measured on


def rate(generation: str, head_dim: float, keys: float, *, backward=False, dtype="bf16", peak=PEAK):
    out = measured_attention_flop_per_s(
        generation, peak, dtype, head_dim, np.array([keys]), backward=backward
    )
    return float(out[0]) / 1e12


def test_measured_points_are_returned_as_published() -> None:
    """GB200, head size 128, causal sequence 8,192 (4,096 keys per query): 1,574 / 1,332."""
    assert rate("blackwell", 128, 4096) == pytest.approx(1574.0)
    assert rate("blackwell", 128, 4096, backward=True) == pytest.approx(1332.0)
    assert rate("blackwell-ultra", 128, 4096) == pytest.approx(1856.0)


def test_longer_key_loops_run_faster_and_interpolate_between_points() -> None:
    """Short loops pay each query tile's prologue over fewer key tiles; between two measured
    lengths the rate lies between theirs."""
    short, mid, long = (rate("blackwell", 128, k) for k in (1024, 1448, 2048))
    assert short < mid < long
    assert rate("blackwell", 128, 512) == pytest.approx(short)  # held at the ends


def test_backward_is_slower_per_flop_and_blackwell_ultra_mostly_speeds_the_forward() -> None:
    """At sequences 2,048-8,192: GB300's doubled exponential units lift the forward 1.18-1.25x,
    its backward (shared-memory bound) 1.08-1.09x."""
    for keys in (1024, 2048, 4096):
        assert rate("blackwell", 128, keys, backward=True) < rate("blackwell", 128, keys)
        forward = rate("blackwell-ultra", 128, keys) / rate("blackwell", 128, keys)
        backward = rate("blackwell-ultra", 128, keys, backward=True) / rate(
            "blackwell", 128, keys, backward=True
        )
        assert 1.0 < backward < forward


def test_head_size_and_format_and_clocks() -> None:
    """Head size 64 (the 128-token window) runs below 128; 144 lies between 128's and 160's
    rates; FP8 runs a faster forward; a 2.25 PFLOP/s SKU (B200) at 0.9x GB200."""
    assert rate("blackwell", 64, 256) < 0.5 * rate("blackwell", 128, 1024)
    between = rate("blackwell", 144, 4096)
    assert min(rate("blackwell", 128, 4096), rate("blackwell", 160, 4096)) <= between
    assert between <= max(rate("blackwell", 128, 4096), rate("blackwell", 160, 4096))
    assert rate("blackwell", 128, 4096, dtype="fp8") > rate("blackwell", 128, 4096)
    assert rate("blackwell", 64, 256, dtype="fp8") == rate("blackwell", 64, 256)  # BF16 only
    assert rate("blackwell", 128, 4096, peak=2250e12) == pytest.approx(0.9 * 1574.0)
    assert measured_attention_flop_per_s("hopper", PEAK, "bf16", 128, 4096, backward=False) is None


def test_mla_backward_is_counted_as_the_model_counts_it() -> None:
    """The benchmark's MLA backward counts 3 x 192 + 2 x 128 = 832 per element, the model 2.5 x
    320 = 800: the stored rate is the published one times 800 / 832."""
    _, _, backward = CUDNN_SDPA_TFLOP_PER_S[("blackwell", "bf16", 160)]
    assert backward[2] == pytest.approx(1193.0 * 800.0 / 832.0)


@pytest.mark.parametrize(("gpu", "measured"), [("b200", None), ("h100", "modelled")])
def test_block_time_is_the_flops_at_the_measured_rate(gpu: str, measured) -> None:
    problem = autopar.make_problem(model="llama-3-8b", gpus=8, gpu=gpu)
    ctx = make_context(problem)
    seconds = measured_block_time_s(8192.0, 8192.0, 128, ctx=ctx, dtype="bf16")
    if measured == "modelled":
        assert seconds is None
        return
    flop = 2.0 * 8192 * 8192 * 128
    assert float(seconds) == pytest.approx(flop / (0.9 * 1574e12))
