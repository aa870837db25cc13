"""Benchmarks (autopar/bench): real gloo runs on CPU, parsed back and fitted; GEMM on CPU."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.calibration.comm_bench import (
    BenchResult,
    CommBenchOptions,
    RankInfo,
    Row,
    Table,
    format_log,
    spawn_local,
    sweep_sizes,
)
from autopar.calibration.gemm_bench import (
    merge_into_file,
    model_gemm_shapes,
    parse_shape,
    run_gemm_bench,
)
from autopar.calibration.nccl import parse_nccl_log, parse_nccl_text
from autopar.calibration.profile import fit_profile
from autopar.calibration.profile_io import load_profile
from autopar.costs.comm import COLLECTIVES

pytestmark = pytest.mark.xdist_group("torch")  # one worker imports torch (tests/conftest.py)


def test_sweep_sizes_are_multiples_of_ranks_and_bounded():
    options = CommBenchOptions(min_bytes=1000, max_bytes=64000, factor=4)
    sizes = sweep_sizes(options, world_size=3)
    assert all(s % 12 == 0 for s in sizes)
    assert sizes == (996, 3996, 15996, 63996)


def test_bad_options_raise():
    with pytest.raises(ValueError, match="min_bytes"):
        CommBenchOptions(min_bytes=10, max_bytes=5)
    with pytest.raises(ValueError, match="unknown collectives"):
        CommBenchOptions(collectives=("broadcast",))


def test_formatted_log_parses_back_with_ranks_nodes_and_skip_note():
    ranks = tuple(
        RankInfo(rank=r, pid=100 + r, host=f"node{r // 2}", device=r % 2, device_name="NVIDIA H100")
        for r in range(4)
    )
    tables = (
        Table(collective="all_reduce", rows=(Row(size_bytes=4096, count=1024, time_s=2e-5),)),
        Table(collective="reduce_scatter", skipped="not supported by this backend"),
    )
    options = CommBenchOptions(min_bytes=4096, max_bytes=4096)
    text = format_log(
        BenchResult(world_size=4, backend="nccl", ranks=ranks, tables=tables), options
    )
    assert "# skipped reduce_scatter" in text
    frame = parse_nccl_text(text, source="bench.log")
    assert frame[["collective", "num_ranks", "num_nodes", "gpu"]].iloc[0].tolist() == [
        "all_reduce",
        4,
        2,
        "H100",
    ]
    assert frame["time_us_out"].iat[0] == pytest.approx(20.0)


@pytest.mark.parametrize("nproc", [2, 4])
def test_gloo_comm_bench_runs_parses_and_fits(tmp_path, nproc):
    collectives = COLLECTIVES
    options = CommBenchOptions(min_bytes=4096, max_bytes=1 << 17, factor=2, iters=3, warmup=1)
    path = spawn_local(nproc, options, tmp_path / "comm.log")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comm.log"]
    frame = parse_nccl_log(path)
    assert set(frame["num_ranks"]) == {nproc} and set(frame["num_nodes"]) == {1}
    text = path.read_text()
    measured = set(frame["collective"])
    for collective in collectives:
        assert collective in measured or f"# skipped {collective}" in text
    assert "all_reduce" in measured
    assert (frame["time_us_out"] > 0).all()
    profile = fit_profile(frame)
    times = profile.time_s("all_reduce", np.array([4096.0, 1 << 17]), num_ranks=nproc, num_nodes=1)
    assert np.all(times > 0)


def test_model_gemm_shapes_by_hand():
    """Llama-2 7B-like layer, TP 2: h=4096, ffn=11008, 32 heads (no GQA), V=32000, T=4096."""
    shapes = model_gemm_shapes(
        hidden=4096, ffn=11008, num_heads=32, num_kv_heads=32, vocab=32000, tp=2, tokens=4096
    )
    by_name = {s.name: (s.m, s.n, s.k) for s in shapes}
    assert by_name == {
        "qkv": (4096, 6144, 4096),
        "attn_out": (4096, 4096, 2048),
        "mlp_up": (4096, 11008, 4096),
        "mlp_down": (4096, 4096, 5504),
        "logits": (4096, 16000, 4096),
    }
    with pytest.raises(ValueError, match="not divisible by tp=3"):
        model_gemm_shapes(
            hidden=4096, ffn=11008, num_heads=32, num_kv_heads=8, vocab=32000, tp=3, tokens=8
        )


def test_gemm_bench_on_cpu_merges_into_profile(tmp_path):
    shapes = (parse_shape("64,64,64"), parse_shape("128,64,32"))
    points = run_gemm_bench(shapes, dtype="fp32", iters=3, warmup=1, device="cpu")
    assert [(p.m, p.n, p.k) for p in points] == [(64, 64, 64), (128, 64, 32)]
    assert all(p.flop_per_s > 1e6 for p in points)
    path = tmp_path / "profile.yaml"
    merge_into_file(path, points)
    merge_into_file(path, points[:1])
    loaded = load_profile(path)
    assert len(loaded.gemm) == 2
    assert loaded.gemm_flop_per_s(64, 64, 64, "fp32") == pytest.approx(points[0].flop_per_s)
    with pytest.raises(ValueError, match="m,n,k"):
        parse_shape("64,64")
