"""Blackwell and MI3xx GPUs, NVFP4 and MXFP8, CUDA graphs, CPU activation offloading and the
selective recompute modules (issue 20): the presets hold their datasheet figures, each precision
runs only where its tensor cores exist, and each switch changes what it should."""

from __future__ import annotations

import numpy as np
import pytest

import autopar
from autopar.api import make_context
from autopar.base.errors import InputError
from autopar.costs import error_bands
from autopar.inputs.loading import load_gpu
from cost_models import gemm
from cost_models.attention import attention_core_time_s

TFLOP = 1e12
GIB = 2**30

PRESETS = {
    # name: generation, dense BF16 / FP8 / FP4 TFLOP/s, memory GiB as the runtime reports it
    "b200": ("blackwell", 2250, 4500, 9000, 179.1),
    "b300": ("blackwell-ultra", 2250, 4500, 13500, 268.6),
    "gb200-nvl72": ("blackwell", 2500, 5000, 10000, 185.0),
    "gb300-nvl72": ("blackwell-ultra", 2500, 5000, 15000, 277.5),
    "mi325x": ("cdna3", 1307.4, 2614.9, None, 255.7),
    "mi350x": ("cdna4", 2306.9, 4613.7, 9227.5, 287.7),
    "mi355x": ("cdna4", 2516.6, 5033.2, 10066.3, 287.7),
}
LLAMA_70B = dict(model="llama-3-70b", gpus=64, seq_len=8192, global_batch=256)
LAYOUT_70B = dict(tp=2, pp=4, vpp=5, mbs=1, recompute="none", zero=1)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_hold_their_datasheet_figures(name: str) -> None:
    generation, bf16, fp8, fp4, memory = PRESETS[name]
    gpu = load_gpu(name)
    assert gpu.generation == generation
    assert gpu.peak_bf16_flop_per_s == pytest.approx(bf16 * TFLOP)
    assert gpu.peak_fp8_flop_per_s == pytest.approx(fp8 * TFLOP)
    assert (gpu.peak_fp4_flop_per_s or None) == (fp4 and pytest.approx(fp4 * TFLOP))
    assert gpu.memory_bytes / GIB == pytest.approx(memory, abs=0.1)
    assert gpu.gpus_per_node == (72 if name.startswith("gb") else 8)
    assert gpu.runs("nvfp4") == generation.startswith("blackwell")
    assert gpu.runs("mxfp8") == (generation != "cdna3")


def test_nvfp4_runs_on_blackwell_only() -> None:
    autopar.make_problem(**LLAMA_70B, gpu="gb200-nvl72", precision="nvfp4")
    for gpu, generation in (("h100", "hopper"), ("mi355x", "cdna4"), ("a100", "ampere")):
        with pytest.raises(InputError, match=generation) as error:
            autopar.make_problem(**LLAMA_70B, gpu=gpu, precision="nvfp4")
        assert error.value.source == "--precision"
    autopar.make_problem(**LLAMA_70B, gpu="mi355x", precision="fp8", fp8_recipe="mxfp8")
    with pytest.raises(InputError, match="mxfp8"):
        autopar.make_problem(**LLAMA_70B, gpu="mi325x", precision="fp8", fp8_recipe="mxfp8")


def test_each_lower_precision_is_faster_and_keeps_smaller_copies() -> None:
    """Same layout on GB200: NVFP4 < FP8 < BF16 in step time and in saved activations (FP4
    copies are 0.5625 B per element, FP8 1 B); the inputs say which GEMMs run in FP4."""
    runs = {
        p: autopar.evaluate(**LLAMA_70B, **LAYOUT_70B, gpu="gb200-nvl72", precision=p)
        for p in ("bf16", "fp8", "nvfp4")
    }
    steps = [runs[p].step_time_s for p in ("bf16", "fp8", "nvfp4")]
    assert steps == sorted(steps, reverse=True)
    assert 1.15 < steps[1] / steps[2] < 1.8  # NVFP4 over FP8 end to end (rows: 1.3-1.5x)
    saved = [runs[p].memory_bytes["activations"] for p in ("bf16", "fp8", "nvfp4")]
    assert saved == sorted(saved, reverse=True)
    assert runs["nvfp4"].inputs["low_precision_gemms"]["qkv"] == "fp4"


def test_mxfp8_runs_a_few_percent_behind_tensor_wise_fp8() -> None:
    """The Megatron-Bridge tables' MXFP8 / FP8-CS pairs: 3.6-5.6% slower at the same layout."""
    current, mxfp8 = (
        autopar.evaluate(
            **LLAMA_70B, **LAYOUT_70B, gpu="b200", precision="fp8", fp8_recipe=r
        ).step_time_s
        for r in ("current", "mxfp8")
    )
    assert 1.01 < mxfp8 / current < 1.10


def _te_layer_gemm_s(efficiency: float, dtype: str, gpu) -> float:
    """This module's roofline (``cost_models.gemm.gemm_time_s``, kernels only: no casts) for the
    12 GEMMs of the layer Transformer Engine's GEMM benchmark times (hidden 4,096, FFN 16,384,
    15,872 tokens: fprop, dgrad, wgrad of QKV, projection, FC1, FC2)."""
    tokens, hidden, ffn = 15872.0, 4096.0, 16384.0
    forward = [(hidden, 3 * hidden), (hidden, hidden), (hidden, ffn), (ffn, hidden)]
    shapes = [s for k, n in forward for s in ((tokens, k, n), (tokens, n, k), (k, tokens, n))]
    peak = gpu.peak_flop_per_s(dtype)
    seconds = 0.0
    for m, k, n in shapes:
        factor = gemm.shape_factor(np.array(m), np.array(n), np.array(k))
        traffic = gemm.OPERAND_BYTES[dtype] * (m * k + k * n) + gemm.BYTES_BF16 * m * n
        seconds += 2.0 * m * n * k / (peak * efficiency * float(factor))
        seconds += traffic / (gpu.hbm_bytes_per_s * gemm.HBM_EFFICIENCY)
    return seconds


def test_blackwell_fp8_to_bf16_ratio_is_the_measured_b300_one() -> None:
    """``BLACKWELL_FP8_TO_BF16_EFFICIENCY`` from NVIDIA's Transformer Engine GEMM benchmark on a
    B300 (gemm_profiling.rst, ``--pre-quantize``: 12.835 ms BF16, 7.324 ms MXFP8 per layer): the
    FP8:BF16 ratio at which the roofline, MXFP8 at ``MXFP8_GEMM_SLOWDOWN``, gives the measured
    1.75x; the H200's 0.891 gives well under it."""
    gpu = load_gpu("b300")
    bf16 = _te_layer_gemm_s(gpu.gemm_efficiency, "bf16", gpu)

    def speedup(ratio: float) -> float:
        mxfp8 = gpu.gemm_efficiency * ratio / gemm.MXFP8_GEMM_SLOWDOWN
        return bf16 / _te_layer_gemm_s(mxfp8, "fp8", gpu)

    measured = 12.835 / 7.324
    low, high = 0.5, 1.5
    for _ in range(40):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if speedup(mid) < measured else (low, mid)
    assert low == pytest.approx(gemm.BLACKWELL_FP8_TO_BF16_EFFICIENCY, abs=0.01)
    assert speedup(gemm.H200_FP8_TO_BF16_EFFICIENCY) < 0.92 * measured
    assert low / 0.891 == pytest.approx(gemm.BLACKWELL_BF16_GEMM_SLOWDOWN, abs=0.015)


def _attention(gpu: str, head_dim: int, *, backward: bool = False) -> float:
    """Seconds per FLOP of one layer's fused attention forward at ``head_dim`` (8k tokens), or of
    the block time its backward scales from."""
    problem = autopar.make_problem(model="llama-3-8b", gpus=8, gpu=gpu)
    model = problem.model
    seconds = attention_core_time_s(
        model,
        tokens=8192.0,
        seq_len=8192,
        tp=1.0,
        mbs=1.0,
        flash_attention=True,
        ctx=make_context(problem),
        head_dim=head_dim,
        backward=backward,
    )
    flop = 2.0 * 8192 * 8192 * head_dim * model.num_attention_heads  # causal: half of 4 q k d
    return float(seconds) / flop


def test_fused_attention_forward_is_bound_by_exponentials_on_blackwell() -> None:
    """On B200 the exponentials set the forward's pace (FlashAttention-4): halving the head size
    halves the FLOPs per exponential, so the time per FLOP rises; Blackwell Ultra's doubled
    exponential rate makes the same attention faster at the same tensor-core peak."""
    assert _attention("b200", 64) > 1.5 * _attention("b200", 128)
    assert _attention("b300", 128) < _attention("b200", 128)
    assert _attention("h100", 64) == pytest.approx(_attention("h100", 128), rel=0.25)


def test_blackwell_ultra_speeds_up_the_attention_forward_only() -> None:
    """Blackwell Ultra doubles the exponential units, not the shared memory that bounds the
    backward (FlashAttention-4): its backward keeps Blackwell's pace per exponential unit, so
    B300's backward block is B200's (same SMs' worth of units per clock), its forward faster."""
    b200 = _attention("b200", 128, backward=True)
    assert _attention("b300", 128, backward=True) == pytest.approx(b200, rel=0.1)
    assert _attention("b300", 128) < _attention("b300", 128, backward=True)
    assert _attention("b300", 64) < 0.6 * _attention("b300", 64, backward=True)
    assert _attention("b200", 128, backward=True) == _attention("b200", 128)
    assert _attention("h100", 128, backward=True) == _attention("h100", 128)


QWEN = dict(
    model="qwen3-30b-a3b", gpus=8, gpu="b200", seq_len=4096, global_batch=64, precision="bf16"
)
QWEN_LAYOUT = dict(tp=1, pp=1, ep=8, mbs=1, recompute="none", zero=1)


def test_cuda_graphs_remove_the_moe_host_overhead() -> None:
    plain = autopar.evaluate(**QWEN, **QWEN_LAYOUT)
    graphed = autopar.evaluate(**QWEN, **QWEN_LAYOUT, cuda_graphs="layers")
    micro = 64 // 8
    saved = plain.step_time_s - graphed.step_time_s
    assert saved == pytest.approx(48 * micro * 2e-3, rel=0.05)  # 1 ms forward + 1 ms backward


def test_per_layer_graphs_refuse_full_recompute() -> None:
    with pytest.raises(InputError, match="CUDA graphs"):
        autopar.evaluate(**QWEN, **{**QWEN_LAYOUT, "recompute": "full"}, cuda_graphs="layers")
    autopar.evaluate(**QWEN, **{**QWEN_LAYOUT, "recompute": "full"}, cuda_graphs="full")


FSDP_70B = dict(
    model="llama-3-70b",
    gpus=64,
    gpu="gb200-nvl72",
    seq_len=8192,
    global_batch=128,
    stack="megatron-bridge-25.09",
)


def test_offloading_moves_activations_to_the_host() -> None:
    """Llama 3 70B FSDP at TP 1 on GB200 as Megatron-Bridge runs it (40 of 80 layers' activations
    on the host over NVLink-C2C): half the activations, an exposed host-transfer term."""
    layout = dict(tp=1, pp=1, mbs=2, recompute="none", zero=3)
    kept = autopar.evaluate(**FSDP_70B, **layout, precision="fp8")
    moved = autopar.evaluate(**FSDP_70B, **layout, precision="fp8", cpu_offload_layers=40)
    ratio = moved.memory_bytes["activations"] / kept.memory_bytes["activations"]
    assert 0.45 < ratio < 0.6
    assert moved.time_s["offload"] > 0.0 == kept.time_s.get("offload", 0.0)
    assert moved.fits and not kept.fits


def test_offloading_keeps_the_search_to_pp_1_without_recompute() -> None:
    result = autopar.solve(**FSDP_70B, precision="fp8", cpu_offload_layers=20, top=5, time_limit=30)
    assert result.layouts
    for estimate in result.layouts:
        assert estimate.layout.pp == 1 and estimate.layout.recompute == "none"


def test_offloading_every_layer_is_refused() -> None:
    with pytest.raises(InputError, match="80 layers"):
        autopar.make_problem(**FSDP_70B, cpu_offload_layers=80)


GPT_OSS = dict(
    model="gpt-oss-120b", gpus=64, gpu="b200", seq_len=4096, global_batch=1280, precision="bf16"
)


def test_recompute_modules_fit_gpt_oss_at_ep8_on_b200() -> None:
    """Megatron-Bridge's B200 recipe recomputes the norms and the experts' activation
    (``recompute_modules: [layernorm, moe_act]``): that is how GPT-OSS 120B fits at EP 8."""
    layout = dict(tp=1, pp=1, ep=8, mbs=4, recompute="selective", zero=1)
    stack = dict(stack="megatron-bridge-25.09", optimizer_state_dtype="bf16")
    core = autopar.evaluate(**GPT_OSS, **layout, **stack)
    modules = autopar.evaluate(**GPT_OSS, **layout, **stack, recompute_modules="layernorm,moe_act")
    assert modules.fits and not core.fits
    saved = core.memory_bytes["activations"] - modules.memory_bytes["activations"]
    assert 15 * GIB < saved < 25 * GIB


def test_a_blackwell_step_time_carries_its_class_band() -> None:
    estimate = autopar.evaluate(**LLAMA_70B, **LAYOUT_70B, gpu="gb200-nvl72", precision="nvfp4")
    band = estimate.error_band
    runs = [r for r in error_bands.residuals() if r[:3] == ("blackwell", "nvfp4", False)]
    assert band["class"] == "blackwell nvfp4 dense" and band["num_runs"] == len(runs)
    assert band["few_runs"] == (len(runs) < error_bands.MIN_RUNS)
    low, high = estimate.step_time_range_s
    assert low < estimate.step_time_s < high


def test_a_sliding_window_pays_whole_tiles() -> None:
    """GPT-OSS's 128-token windows: each query tile computes its own 128 keys plus the window
    before it, so a sliding layer's fused attention costs as 2 x (128 + 128) keys counted
    causally (up to 4x the naive half-window), never more than full causal attention."""
    from cost_models.attention import ATTENTION_TILE, windowed_keys

    assert windowed_keys(128, 4096) == 2 * (128 + ATTENTION_TILE) == 512
    assert windowed_keys(4000, 4096) == 4096
    problem = autopar.make_problem(model="gpt-oss-120b", gpus=64, gpu="b200", global_batch=64)
    ctx = make_context(problem)
    shape = dict(tokens=4096.0, tp=1.0, mbs=1.0, flash_attention=True, ctx=ctx)
    window = attention_core_time_s(problem.model, seq_len=windowed_keys(128, 4096), **shape)
    naive = attention_core_time_s(problem.model, seq_len=128, **shape)
    assert 2.0 < float(window) / float(naive) <= 4.0  # Q, K, V, O traffic is the same


def _sliding_and_full_backward_s(gpu: str, precision: str, fp8_gemms: tuple) -> tuple:
    """(sliding, full) attention-mixer backward of one GPT-OSS 120B layer on ``gpu``, the
    attention core in FP8 when ``fp8_gemms`` lists it."""
    import dataclasses

    import numpy as np

    from cost_models.compute import mixer_time_s

    problem = autopar.make_problem(
        model="gpt-oss-120b", gpus=64, gpu=gpu, global_batch=64, precision=precision
    )
    ctx = make_context(problem)
    stack = dataclasses.replace(ctx.training.stack, fp8_gemms=fp8_gemms)
    ctx = dataclasses.replace(ctx, training=dataclasses.replace(ctx.training, stack=stack))
    one = np.array([1.0])
    shape = dict(tokens=4096.0 * one, tp=one, mbs=one, flash_attention=True, ctx=ctx)
    sliding = mixer_time_s(problem.model, "sliding", **shape)[1]
    full = mixer_time_s(problem.model, "attention", **shape)[1]
    return float(sliding[0]), float(full[0])


def test_the_fp8_backward_of_a_window_runs_the_causal_triangle_on_blackwell() -> None:
    """cuDNN's FP8 / MXFP8 attention backward on Blackwell does not skip the tiles outside a
    sliding window (cudnn-frontend's GPT-OSS benchmark: quadratic in the sequence where BF16 is
    linear; ``attention.FP8_UNWINDOWED_BACKWARD``): a sliding layer's backward with FP8 attention
    costs a full layer's; in BF16 it stays a fraction of it, and so does FP8 elsewhere."""
    linears = ("qkv", "proj", "fc1", "fc2")
    for gpu in ("gb200-nvl72", "b300"):
        sliding, full = _sliding_and_full_backward_s(gpu, "fp8", (*linears, "attention"))
        assert sliding == pytest.approx(full)
        sliding, full = _sliding_and_full_backward_s(gpu, "fp8", linears)
        assert sliding < 0.5 * full
        sliding, full = _sliding_and_full_backward_s(gpu, "bf16", (*linears, "attention"))
        assert sliding < 0.5 * full
    sliding, full = _sliding_and_full_backward_s("h100", "fp8", (*linears, "attention"))
    assert sliding < 0.8 * full  # the projections, the same in both, weigh more on Hopper


def test_gpt_oss_runs_its_yarn_rope_unfused() -> None:
    """Megatron falls back to its unfused RoPE when YaRN's concentration factor is not 1
    (``cost_models.rope``): GPT-OSS's factor 32 gives 0.1 ln 32 + 1; DeepSeek-V3 (MLA, mscale =
    mscale_all_dim) and the Llama / Qwen3 models keep the fused kernel, and only GPT-OSS's
    projections pay the unfused bytes."""
    import dataclasses
    import math

    import numpy as np

    from cost_models.compute import attention_block_time_s
    from cost_models.rope import UNFUSED_ROPE_BYTES, rope_unfused, yarn_concentration

    gpt_oss = autopar.make_problem(model="gpt-oss-120b", gpus=64, gpu="b200", global_batch=64)
    assert yarn_concentration(gpt_oss.model) == pytest.approx(0.1 * math.log(32.0) + 1.0)
    assert rope_unfused(gpt_oss.model)
    for name in ("deepseek-v3", "llama-3-70b", "qwen3-30b-a3b"):
        problem = autopar.make_problem(model=name, gpus=64, gpu="b200", global_batch=64)
        assert not rope_unfused(problem.model), name
    ctx = make_context(gpt_oss)
    one = np.array([1.0])
    unfused = attention_block_time_s(gpt_oss.model, tokens=4096.0 * one, tp=one, ctx=ctx)
    fused_model = dataclasses.replace(gpt_oss.model, rope=type(gpt_oss.model.rope)())
    fused = attention_block_time_s(fused_model, tokens=4096.0 * one, tp=one, ctx=ctx)
    extra_f, extra_b = float(unfused[0][0] - fused[0][0]), float(unfused[1][0] - fused[1][0])
    assert extra_f > 0.0 and extra_b > 0.0
    # 24 - 4 B forward, 20 - 8 B backward per Q / K element
    ratio = (UNFUSED_ROPE_BYTES[0] - 4.0) / (UNFUSED_ROPE_BYTES[1] - 8.0)
    assert extra_f / extra_b == pytest.approx(ratio)
    assert unfused[2][0] == fused[2][0]  # the weight gradients do not change


def test_hybridep_is_priced_at_its_published_pace_inside_one_nvlink_domain() -> None:
    """HybridEP sends a token once per rank holding one of its experts and runs at its
    benchmark's pace per received row (``cost_models.hybridep``): at EP 8 a GPT-OSS token
    reaches 3.3 ranks (not 4 copies), the Torch API's 550 / 538 GB/s apply, the kernels' with
    full-iteration graphs; Hopper keeps the datasheet all-to-all."""
    import dataclasses

    import numpy as np

    from cost_models import hybridep
    from cost_models.communication import dispatch_time_s

    hit = hybridep.rank_hit_probability(128, 4, 8.0)
    assert 8.0 * hit == pytest.approx(3.34, abs=0.01)
    assert hybridep.rank_hit_probability(128, 8, 8.0) * 8.0 == pytest.approx(5.34, abs=0.01)
    grid = {name: np.array([1.0]) for name in ("tp", "cp", "etp")}
    grid.update(ep=np.array([8.0]), mbs=np.array([4.0]))
    times = {}
    for gpu in ("b200", "h100"):
        problem = autopar.make_problem(
            model="gpt-oss-120b", gpus=64, gpu=gpu, seq_len=4096, global_batch=1280
        )
        ctx = make_context(problem)
        times[gpu] = {d: float(dispatch_time_s(grid, ctx, d)[0]) for d in ("flex", "alltoall")}
        if gpu == "b200":
            received = 4.0 * 4096 * 8.0 * hit * problem.model.hidden_size * 2.0
            expected = 0.5 * received * (1 / 550.10e9 + 1 / 538.44e9)
            assert times[gpu]["flex"] == pytest.approx(expected)
            stack = dataclasses.replace(ctx.training.stack, cuda_graphs="full")
            graphed = dataclasses.replace(
                ctx, training=dataclasses.replace(ctx.training, stack=stack)
            )
            kernels = float(dispatch_time_s(grid, graphed, "flex")[0])
            assert kernels == pytest.approx(0.5 * received * (1 / 750.15e9 + 1 / 684.27e9))
    assert times["h100"]["flex"] == times["h100"]["alltoall"]
    assert times["b200"]["flex"] != times["b200"]["alltoall"]
