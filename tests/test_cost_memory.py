"""Memory terms: Megatron estimator golden values (DESIGN §6) and Korthikanti Table 2."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.base.axes import PIPELINE_SCHEDULES
from autopar.costs.comm import DatasheetCollectives
from autopar.costs.estimate import estimate
from autopar.costs.terms import TermContext
from autopar.inputs.specs import GIB, ClusterSpec, GpuSpec, ModelSpec, SearchOptions, TrainingSpec
from autopar.layout.plan import Layout
from cost_models import default_cost_model
from cost_models.activations import layer_activation_bytes_per_token
from cost_models.memory import DenseParamMemory
from cost_models.pipeline import InFlightMicrobatches
from cost_models.shapes import peak_in_flight_stage_bytes

H100 = GpuSpec(
    name="h100",
    memory_bytes=80 * GIB,
    peak_bf16_flop_per_s=989e12,
    peak_fp8_flop_per_s=1979e12,
    hbm_bytes_per_s=3.35e12,
    nvlink_bytes_per_s=450e9,
    nic_bytes_per_s=50e9,
    gpus_per_node=8,
)
LLAMA3_70B = ModelSpec(
    name="llama-3-70b",
    num_layers=80,
    hidden_size=8192,
    num_attention_heads=64,
    num_kv_heads=8,
    ffn_hidden_size=28672,
    vocab_size=128256,
)
GPT = ModelSpec(
    name="gpt",
    num_layers=96,
    hidden_size=12288,
    num_attention_heads=96,
    num_kv_heads=96,
    ffn_hidden_size=4 * 12288,
    vocab_size=51200,
    mlp_kind="gelu",
)


def context(model: ModelSpec, *, num_gpus: int, gbs: int, seq_len: int) -> TermContext:
    cluster = ClusterSpec(gpu=H100, gpus_per_node=8)
    training = TrainingSpec(num_gpus=num_gpus, global_batch_sequences=gbs, seq_len=seq_len)
    return TermContext(
        model=model,
        cluster=cluster,
        training=training,
        options=SearchOptions(),
        comm=DatasheetCollectives(cluster),
    )


@pytest.mark.parametrize(
    ("pp", "vpp", "weights_gib", "activations_gib"),
    [
        (4, 5, 13.49, 23.04),
        (4, 1, 13.49, 20.03),
        (8, 1, 7.56, 20.06),
    ],
)
def test_megatron_estimator_golden(
    pp: int, vpp: int, weights_gib: float, activations_gib: float
) -> None:
    """Llama-3 70B, seq 8192, 1024 GPUs, mbs 1, gbs 1024, TP8, SP + selective, dist. optimizer."""
    ctx = context(LLAMA3_70B, num_gpus=1024, gbs=1024, seq_len=8192)
    dp = 1024 // (8 * pp)
    layout = Layout(
        tp=8,
        pp=pp,
        dp=dp,
        vpp=vpp,
        mbs=1,
        grad_accum=1024 // dp,
        recompute="selective",
        zero=1,
        sequence_parallel=True,
    )
    memory = estimate(layout, ctx, default_cost_model(megatron_compatible=True)).memory_bytes
    static = memory["weights"] + memory["gradients"] + memory["optimizer"]
    assert static / GIB == pytest.approx(weights_gib, rel=0.03)
    assert memory["activations"] / GIB == pytest.approx(activations_gib, rel=0.03)
    assert abs(static / GIB - weights_gib) < 0.02  # the arithmetic itself, not just 3%


def test_korthikanti_table2_per_layer_bytes() -> None:
    """MHA, GELU, f = 4h, no flash attention: TP+SP+selective 34/t, TP+selective 10 + 24/t,
    TP without recompute adds 5*a*s/t, full recompute 2 (bytes per token per hidden unit)."""
    h, a, s, t = GPT.hidden_size, GPT.num_attention_heads, 2048, np.array([8.0])

    def per_h(sp: int, recompute: int) -> float:
        value = layer_activation_bytes_per_token(
            GPT,
            tp=t,
            sp=np.array([sp]),
            keys=s,
            flash_attention=False,
            dropout=True,
            recompute=np.array([recompute]),
        )
        return float(value[0]) / h

    assert per_h(1, 1) == pytest.approx(34 / 8)
    assert per_h(0, 1) == pytest.approx(10 + 24 / 8)
    assert per_h(0, 0) == pytest.approx(10 + 24 / 8 + 5 * a * s / (h * 8))
    assert per_h(0, 2) == pytest.approx(2.0)


def test_gqa_and_swiglu_change_activations_from_shapes() -> None:
    """Llama-3 70B: K and V are 1/8 of Q (GQA), SwiGLU keeps gate + up + product."""
    h = LLAMA3_70B.hidden_size
    value = layer_activation_bytes_per_token(
        LLAMA3_70B,
        tp=np.array([1.0]),
        sp=np.array([1]),
        keys=8192,
        flash_attention=True,
        dropout=False,
        recompute=np.array([0]),
    )[0]
    expected = 8 * h + 2 * (h + 2 * h / 8) + 2 * h + 2 * 2 * 28672 + 2 * 28672 + 4 * 64
    assert value == pytest.approx(expected)


def test_distributed_optimizer_shards_over_dp_times_cp() -> None:
    """Megatron shards the optimizer over DP x CP; its estimator divides by DP only."""
    ctx = context(LLAMA3_70B, num_gpus=1024, gbs=1024, seq_len=8192)
    grid = {"tp": np.array([8]), "pp": np.array([4]), "cp": np.array([4]), "zero": np.array([1])}
    grid["schedule"] = np.array([0])
    ours = DenseParamMemory(part="optimizer").evaluate(grid, ctx)[0]
    megatron = DenseParamMemory(part="optimizer", megatron_compatible=True).evaluate(grid, ctx)[0]
    assert megatron / ours == pytest.approx(4.0)


def test_bytes_per_parameter_18_without_sharding() -> None:
    ctx = context(LLAMA3_70B, num_gpus=64, gbs=64, seq_len=8192)
    grid = {"tp": np.array([8]), "pp": np.array([8]), "cp": np.array([1]), "zero": np.array([0])}
    grid["schedule"] = np.array([0])
    parts = [
        DenseParamMemory(part=p).evaluate(grid, ctx)[0]
        for p in ("weights", "gradients", "optimizer")
    ]
    assert np.array(parts) / parts[0] == pytest.approx([1.0, 2.0, 6.0])


def test_in_flight_microbatches() -> None:
    grid = {
        "pp": np.array([1, 4, 4, 4]),
        "vpp": np.array([1, 1, 1, 5]),
        "grad_accum": np.array([8, 2, 32, 32]),
        "schedule": np.zeros(4, dtype=np.int64),
    }
    in_flight = InFlightMicrobatches().evaluate(grid, None)
    assert in_flight == pytest.approx([1.0, 2.0, 4.0, 4.0 * (1 + 3 / 20)])


def test_context_parallelism_shrinks_activations() -> None:
    ctx = context(LLAMA3_70B, num_gpus=1024, gbs=1024, seq_len=8192)
    model = default_cost_model()
    base = dict(tp=8, pp=4, mbs=1, recompute="none", zero=1, sequence_parallel=True)
    cp1 = estimate(Layout(dp=32, cp=1, grad_accum=32, **base), ctx, model).memory_bytes
    cp2 = estimate(Layout(dp=16, cp=2, grad_accum=64, **base), ctx, model).memory_bytes
    assert cp2["activations"] == pytest.approx(cp1["activations"] / 2, rel=0.01)


@pytest.mark.parametrize(
    ("schedule", "vpp", "held"),
    [("gpipe", 1, 24), ("looped-bfs", 2, 24), ("1f1b", 1, 0), ("1f1b", 2, 0)],
)
def test_the_last_stage_holds_the_logits_of_every_micro_batch_it_keeps(schedule, vpp, held):
    """Under GPipe and Looped BFS the last stage runs every forward, loss included, before the
    first backward: its peak holds all ``m`` micro-batches' logits. Under 1F1B it holds one and
    the first stage dominates (``LogitsMemory`` counts them only at ``pp == 1``). With the
    layers' bytes at zero only the logits are left: the peak, taken back to bytes by the first
    rank's in-flight count, is ``held`` micro-batches' logits."""
    pp, m, logits = 4, 24, 3.0 * GIB
    grid = {
        "pp": np.array([pp]),
        "vpp": np.array([vpp]),
        "grad_accum": np.array([m]),
        "schedule": np.array([PIPELINE_SCHEDULES.index(schedule)]),
    }
    peak = peak_in_flight_stage_bytes(
        LLAMA3_70B,
        grid["pp"],
        lambda kind: 0.0,
        last_stage_extra=logits,
        schedule=grid["schedule"],
        vpp=grid["vpp"],
        grad_accum=grid["grad_accum"],
    )
    in_flight = InFlightMicrobatches().evaluate(grid, None)
    assert float(peak[0] * in_flight[0]) == pytest.approx(held * logits, rel=1e-12)
