"""Time terms: collectives, placement, the pipeline schedule and the compute model."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.base.axes import GRID_AXES
from autopar.costs.comm import NIC_EFFICIENCY, NVLINK_EFFICIENCY, DatasheetCollectives
from autopar.costs.estimate import estimate
from autopar.costs.terms import TermContext
from autopar.inputs.specs import GIB, ClusterSpec, GpuSpec, ModelSpec, SearchOptions, TrainingSpec
from autopar.layout.plan import Layout
from cost_models import default_cost_model
from cost_models.pipeline import PipelineSlots
from cost_models.placement import group_num_nodes

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
CLUSTER = ClusterSpec(gpu=H100, gpus_per_node=8)
LLAMA3_8B = ModelSpec(
    name="llama-3-8b",
    num_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_kv_heads=8,
    ffn_hidden_size=14336,
    vocab_size=128256,
)


def context(*, num_gpus: int, gbs: int, precision: str = "bf16") -> TermContext:
    training = TrainingSpec(
        num_gpus=num_gpus, global_batch_sequences=gbs, seq_len=8192, precision=precision
    )
    return TermContext(
        model=LLAMA3_8B,
        cluster=CLUSTER,
        training=training,
        options=SearchOptions(),
        comm=DatasheetCollectives(CLUSTER),
    )


def test_group_num_nodes_follows_rank_order() -> None:
    """tp8 in a node; DP with stride 8 puts each rank on its own node; stride 2 packs 4/node."""
    nodes = group_num_nodes(np.array([8, 4, 16, 16, 1]), np.array([1, 8, 2, 1, 8]), 8)
    assert nodes == pytest.approx([1, 4, 4, 2, 1])


def test_all_reduce_inside_a_node_uses_nvlink_bus_bandwidth() -> None:
    comm = DatasheetCollectives(CLUSTER)
    size = 1e9
    t = comm.time_s("all_reduce", size, num_ranks=8, num_nodes=1)
    wire = size * 2 * 7 / 8 / (450e9 * NVLINK_EFFICIENCY)
    assert t == pytest.approx(wire + 2 * 7 * CLUSTER.intra_node_latency_s)


def test_inter_node_ring_gets_one_nic_per_member_per_node() -> None:
    comm = DatasheetCollectives(CLUSTER)
    size = 1e9
    one_per_node = comm.time_s("all_gather", size, num_ranks=16, num_nodes=16)
    four_per_node = comm.time_s("all_gather", size, num_ranks=16, num_nodes=4)
    assert one_per_node == pytest.approx(size * 15 / 16 / (50e9 * NIC_EFFICIENCY), rel=0.01)
    assert one_per_node / four_per_node == pytest.approx(4.0, rel=0.02)


def test_single_rank_and_empty_messages_cost_nothing() -> None:
    comm = DatasheetCollectives(CLUSTER)
    assert comm.time_s("all_reduce", 1e9, num_ranks=1, num_nodes=1) == 0.0
    assert comm.time_s("all_to_all", 0.0, num_ranks=8, num_nodes=1) == 0.0


def test_slots_interleaving_divides_the_bubble() -> None:
    grid = {
        "pp": np.array([1, 8, 8]),
        "vpp": np.array([1, 1, 4]),
        "grad_accum": np.array([16, 16, 16]),
        "schedule": np.zeros(3, dtype=np.int64),
    }
    assert PipelineSlots().evaluate(grid, None) == pytest.approx([16.0, 23.0, 16.0 + 7 / 4])


def test_bubble_is_slots_minus_grad_accum_microbatches() -> None:
    ctx = context(num_gpus=64, gbs=128)
    layout = Layout(tp=1, pp=4, dp=16, mbs=1, grad_accum=8, zero=1)
    result = estimate(layout, ctx, default_cost_model())
    per_microbatch = result.time_s["compute"] / 8
    assert result.time_s["bubble"] > 3.0 * per_microbatch  # 3 slots of compute + comm


def test_fp8_is_faster_than_bf16_but_not_twice() -> None:
    """FP8 speeds up the linear layers only; the attention core (large at 8k tokens) stays BF16."""
    layout = Layout(tp=1, pp=1, dp=8, mbs=1, grad_accum=16, zero=1)
    bf16 = estimate(layout, context(num_gpus=8, gbs=128), default_cost_model())
    fp8 = estimate(layout, context(num_gpus=8, gbs=128, precision="fp8"), default_cost_model())
    assert 1.1 < bf16.step_time_s / fp8.step_time_s < 1.8


def test_recompute_costs_time_and_saves_memory() -> None:
    ctx = context(num_gpus=8, gbs=32)
    model = default_cost_model()
    base = dict(tp=8, pp=1, dp=1, mbs=1, grad_accum=32, zero=1, sequence_parallel=True)
    none = estimate(Layout(recompute="none", **base), ctx, model)
    full = estimate(Layout(recompute="full", **base), ctx, model)
    assert full.step_time_s > 1.2 * none.step_time_s
    assert full.memory_bytes["activations"] < 0.5 * none.memory_bytes["activations"]
    assert full.mfu < none.mfu


def test_tp_across_nodes_is_slower_than_inside() -> None:
    """TP 16 spans two nodes: twice the layers' collectives per rank, inter-node latency."""
    ctx = context(num_gpus=16, gbs=16)
    model = default_cost_model()
    inside = estimate(
        Layout(tp=8, pp=2, dp=1, grad_accum=16, zero=1, sequence_parallel=True), ctx, model
    )
    across = estimate(
        Layout(tp=16, pp=1, dp=1, grad_accum=16, zero=1, sequence_parallel=True), ctx, model
    )
    assert across.time_s["tp_comm"] > 2.0 * inside.time_s["tp_comm"]


def test_terms_read_only_their_declared_axes() -> None:
    """The solver tabulates each term over just ``depends_on``: evaluate on exactly that grid."""
    from autopar.costs.terms import MEMORY_CATEGORIES, TIME_CATEGORIES

    ctx = context(num_gpus=64, gbs=128)
    # an axis not named here is at its first value, 1 (a new axis needs no edit)
    values = {axis: 1 for axis in GRID_AXES} | {
        "tp": 2,
        "pp": 2,
        "dp": 8,
        "cp": 2,
        "vpp": 2,
        "grad_accum": 8,
        "zero": 1,
        "schedule": 0,
    }
    model = default_cost_model()
    for term in model.all_terms():
        grid = {axis: np.array([values[axis]] * 3) for axis in term.depends_on}
        result = np.broadcast_to(term.evaluate(grid, ctx), (3,))
        assert np.all(np.isfinite(result)) and np.all(result >= 0), term.name
        suffix_ok = term.name.endswith(("_s", "_bytes")) or term in (model.slots, model.in_flight)
        assert suffix_ok, term.name
        assert term.category in (*TIME_CATEGORIES, *MEMORY_CATEGORIES), term.name


def test_unfused_attention_counts_each_score_byte_once() -> None:
    """Without flash attention Megatron moves 13 B per score element forward (the QK^T GEMM
    writes it 2, fused scale-mask-softmax 2 + 2, dropout 2 + 2 + mask 1, the PV GEMM reads it 2).
    On a GPU with unbounded FLOP/s the core's time is that traffic; the GEMM operands' own
    traffic must not be charged a second time in the elementwise term."""
    from dataclasses import replace

    from cost_models.compute import HBM_EFFICIENCY, attention_core_time_s

    fast = replace(H100, peak_bf16_flop_per_s=1e30, peak_fp8_flop_per_s=1e30)
    ctx = context(num_gpus=8, gbs=8)
    ctx = replace(ctx, cluster=replace(CLUSTER, gpu=fast))
    seq, mbs, tp = 8192, 1, 1
    time_s = attention_core_time_s(
        LLAMA3_8B,
        tokens=np.array([mbs * seq]),
        seq_len=seq,
        tp=np.array([tp]),
        mbs=np.array([mbs]),
        flash_attention=False,
        ctx=ctx,
    )[0]
    scores = mbs * LLAMA3_8B.num_attention_heads / tp * seq * seq
    bytes_per_score = time_s * H100.hbm_bytes_per_s * HBM_EFFICIENCY / scores
    assert bytes_per_score == pytest.approx(13.0, rel=0.02)


def test_native_cross_entropy_sits_between_te_and_unfused() -> None:
    """Megatron's native fused cross entropy (torch.compile'd passes over FP32 logits) moves
    fewer bytes than the unfused one and more than Transformer Engine's one-pass kernel; the
    implementation matters only when the loss is fused."""
    import dataclasses

    from autopar.costs.terms import grid_of
    from cost_models.compute import LogitsComputeTime

    base = context(num_gpus=8, gbs=8)
    grid = grid_of([Layout(tp=1, pp=1, dp=8, mbs=1, grad_accum=1)])

    def loss_s(**switches) -> float:
        stack = dataclasses.replace(base.training.stack, **switches)
        ctx = dataclasses.replace(base, training=dataclasses.replace(base.training, stack=stack))
        return float(LogitsComputeTime().evaluate(grid, ctx)[0])

    te = loss_s(cross_entropy_fusion=True, cross_entropy_impl="te")
    native = loss_s(cross_entropy_fusion=True, cross_entropy_impl="native")
    unfused = loss_s(cross_entropy_fusion=False, cross_entropy_impl="native")
    assert te < native < unfused
    assert loss_s(cross_entropy_fusion=False, cross_entropy_impl="te") == unfused


def test_eager_squared_relu_costs_more_than_a_fused_one_and_only_for_relu2() -> None:
    """``StackSpec.eager_activations``: NeMo 2.0's ``torch.pow(F.relu(x), 2)`` runs two kernels
    forward and five backward (``compute.EAGER_ACTIVATION_BYTES``), where a fused activation
    runs one and two; a SwiGLU model is unaffected by the switch."""
    import dataclasses

    from autopar.inputs.stack import StackSpec
    from cost_models.compute import mlp_time_s

    relu2 = dataclasses.replace(LLAMA3_8B, mlp_kind="squared_relu", ffn_hidden_size=16384)
    tokens, tp = np.array([8192.0]), np.array([1.0])

    def mlp(model: ModelSpec, eager: tuple[str, ...]) -> tuple:
        base = context(num_gpus=8, gbs=128)
        stack = StackSpec(name="t", eager_activations=eager)
        training = dataclasses.replace(base.training, stack=stack)
        ctx = dataclasses.replace(base, model=model, training=training)
        return mlp_time_s(model, model.ffn_hidden_size, tokens=tokens, tp=tp, ctx=ctx)

    fused, eager = mlp(relu2, ()), mlp(relu2, ("relu2",))
    elements = tokens * relu2.ffn_hidden_size / (H100.hbm_bytes_per_s * 0.8)
    assert eager[0] - fused[0] == pytest.approx(4.0 * elements)  # 8 B against 2 + 2
    assert eager[1] - fused[1] == pytest.approx(12.0 * elements)  # 20 B against 2 x 4
    assert eager[2] == pytest.approx(fused[2])  # the weight gradients do not move
    swiglu = mlp(LLAMA3_8B, ()), mlp(LLAMA3_8B, ("relu2",))
    assert swiglu[0][0] == pytest.approx(swiglu[1][0]) and swiglu[0][1] == pytest.approx(
        swiglu[1][1]
    )
