"""Context parallelism as run and data-parallel traffic per ZeRO stage (issue 11)."""

from __future__ import annotations

import numpy as np
import pytest

import autopar
from autopar.base.errors import InputError
from autopar.costs.comm import DatasheetCollectives
from autopar.costs.terms import TermContext
from autopar.inputs.loading import load_model
from autopar.inputs.specs import ClusterSpec, SearchOptions, TrainingSpec
from cost_models import communication
from cost_models.communication import (
    CP_STEP_OVERHEAD_S,
    CP_UNBATCHED_EXCHANGE_S,
    ring_attention_s,
    unbatched_ring,
)


def _ring(seq_len: int, cp: int, gpu: str | None = None) -> tuple[float, float]:
    problem = autopar.make_problem(model="llama-3-8b", gpus=8, **({"gpu": gpu} if gpu else {}))
    ctx = TermContext(
        model=load_model("llama-3-8b"),
        cluster=problem.cluster,
        training=TrainingSpec(num_gpus=8, global_batch_sequences=8, seq_len=seq_len),
        options=SearchOptions(),
        comm=DatasheetCollectives(problem.cluster),
    )
    one = np.array([1.0])
    f, b = ring_attention_s(
        ctx.model, tp=one, cp=np.array([float(cp)]), mbs=one, seq_len=seq_len, ctx=ctx,
        num_nodes=one,
    )  # fmt: skip
    return float(f[0]), float(b[0])


def test_ring_exposes_only_fixed_costs_when_blocks_outlast_transfers() -> None:
    """At 128k tokens a block of attention takes far longer than its K/V take to arrive: what is
    left is the per-step latency and the sub-blocks' efficiency."""
    forward, _ = _ring(131072, 8)
    block_budget = 7 * CP_STEP_OVERHEAD_S
    assert forward >= block_budget
    short_forward, _ = _ring(2048, 8)
    compute_ratio = short_forward / forward
    assert compute_ratio > 2048 / 131072  # fixed costs do not shrink with the sequence


def test_transformer_engine_batches_the_ring_pair_only_below_blackwell_at_cp2() -> None:
    """TE context_parallel.py L1421-1423: ``compute capability < 10.0 and cp == 2``."""
    problem = autopar.make_problem(model="llama-3-8b", gpus=8)
    cp = np.array([2.0, 4.0])
    for gpu, expected in (("h100-sxm", [False, True]), ("b200", [True, True])):
        ctx = TermContext(
            model=load_model("llama-3-8b"),
            cluster=autopar.make_problem(model="llama-3-8b", gpus=8, gpu=gpu).cluster,
            training=problem.training,
            options=SearchOptions(),
            comm=DatasheetCollectives(problem.cluster),
        )
        assert unbatched_ring(cp, ctx).tolist() == expected


@pytest.mark.parametrize("cp", [2, 4])
def test_an_unbatched_ring_pays_each_exchange_whatever_its_bytes(monkeypatch, cp) -> None:
    """Blackwell: ``cp - 1`` exchanges forward, ``cp`` backward, each ``CP_UNBATCHED_EXCHANGE_S``,
    at a short sequence and a long one alike (a time per exchange, not per byte); an H100 at
    CP 2 (batched) pays none."""
    for seq_len in (8192, 65536):
        forward, backward = _ring(seq_len, cp, gpu="gb300-nvl72")
        monkeypatch.setattr(communication, "CP_UNBATCHED_EXCHANGE_S", 0.0)
        bare_f, bare_b = _ring(seq_len, cp, gpu="gb300-nvl72")
        monkeypatch.undo()
        assert forward - bare_f == pytest.approx((cp - 1) * CP_UNBATCHED_EXCHANGE_S)
        assert backward - bare_b == pytest.approx(cp * CP_UNBATCHED_EXCHANGE_S)
    hopper = _ring(8192, 2, gpu="h100-sxm")
    monkeypatch.setattr(communication, "CP_UNBATCHED_EXCHANGE_S", 0.0)
    assert _ring(8192, 2, gpu="h100-sxm") == hopper


def test_solver_does_not_pick_cp_at_short_sequences() -> None:
    for model, gpus in (("llama-3-8b", 64), ("llama-3-70b", 256)):
        best = autopar.solve(model=model, gpus=gpus, seq_len=2048, global_batch=1024).best
        assert best.layout.cp == 1


def test_cp_pays_off_at_long_sequences() -> None:
    best = autopar.solve(model="llama-3-8b", gpus=64, seq_len=131072, global_batch=64).best
    assert best.layout.cp > 1


def test_a2a_needs_heads_per_tp_rank_divisible_by_cp() -> None:
    layout = dict(model="llama-3-70b", gpus=64, seq_len=32768, global_batch=32, tp=8, cp=2)
    autopar.evaluate(**layout, cp_comm_type="p2p")
    with pytest.raises(InputError, match="CP all-to-all"):
        autopar.evaluate(**layout, cp_comm_type="a2a")  # 8 KV heads over TP 8: 1 per rank
    autopar.evaluate(**{**layout, "tp": 2}, cp_comm_type="a2a")


def test_cp_comm_types_differ() -> None:
    layout = dict(model="llama-2-7b", gpus=64, seq_len=65536, global_batch=16, tp=1, cp=16, pp=1)
    times = {
        kind: autopar.evaluate(**layout, cp_comm_type=kind).time_s["cp_comm"]
        for kind in ("p2p", "a2a", "a2a+p2p")
    }
    assert len({round(t, 6) for t in times.values()}) == 3


def _dp(zero: int, batch: int, **switches) -> float:
    return autopar.evaluate(
        model="llama-3-8b", gpus=16, seq_len=4096, global_batch=batch, zero=zero, **switches
    ).time_s["dp_comm"]


def test_zero1_reduces_once_per_step_zero2_per_micro_batch() -> None:
    assert _dp(1, 64) == pytest.approx(_dp(1, 16), rel=1e-9)  # 4x the micro-batches
    assert _dp(2, 64) > 2.5 * _dp(2, 16)  # reduce-scatter per micro-batch, gather per step
    assert _dp(3, 64) > _dp(2, 64)  # plus the forward and backward all-gathers


def test_zero_overlap_switches() -> None:
    for zero in (0, 1, 2, 3):
        hidden = _dp(zero, 32)
        exposed = _dp(zero, 32, overlap_grad_reduce=False, overlap_param_gather=False)
        assert exposed > 2.0 * hidden, zero
    only_grad = _dp(3, 32, overlap_param_gather=False)
    assert (
        _dp(3, 32) < only_grad < _dp(3, 32, overlap_grad_reduce=False, overlap_param_gather=False)
    )


def test_cluster_memory_reserve_checked_against_the_gpu() -> None:
    gpu = autopar.make_problem(model="llama-3-8b", gpus=8).cluster.gpu
    with pytest.raises(InputError, match="memory_reserve_gib"):
        ClusterSpec(gpu=gpu, gpus_per_node=8, memory_reserve_bytes=gpu.memory_bytes + 1)
