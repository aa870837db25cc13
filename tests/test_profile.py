"""Fitted communication profile (autopar/calibration/profile.py): accuracy targets on real logs,
the CollectiveModel contract, fallbacks, traps and YAML round trip."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from autopar.base.errors import InputError
from autopar.calibration.compare import compare_log, fitted_only
from autopar.calibration.nccl import parse_nccl_log
from autopar.calibration.profile import CommProfile, GemmPoint, SourceLog, fit_profile
from autopar.calibration.profile_io import file_sha256, load_profile, save_profile
from autopar.costs.comm import CollectiveModel

DATA = Path(__file__).parent / "data" / "nccl"
ALL_LOGS = sorted(DATA.glob("*.log"))
MIB = 2**20


@functools.cache  # the fit of the same logs, read by several tests (frozen; fit once a process)
def _profile(*names: str) -> CommProfile:
    return fit_profile(pd.concat([parse_nccl_log(DATA / n) for n in names], ignore_index=True))


def _error_pct(profile: CommProfile, path: Path) -> float:
    (record,) = compare_log(profile, parse_nccl_log(path))
    return record.median_abs_pct_error


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: p.name)
def test_fit_reproduces_each_log_within_10_pct_above_1mib(path):
    profile = fitted_only(_profile(path.name))
    assert _error_pct(profile, path) <= 10.0


@pytest.mark.parametrize(
    ("fit_nodes", "predict_nodes", "limit_pct"),
    [((2, 16), 4, 25.0), ((2, 4), 16, 25.0)],
)
def test_fit_on_some_node_counts_predicts_another(fit_nodes, predict_nodes, limit_pct):
    """ABCI A100 all_reduce (sizes up to 32 MiB; error over sizes >= 1 MiB)."""
    names = [f"a100_{n}n8g_all_reduce_abci.log" for n in fit_nodes]
    profile = _profile(*names)
    target = DATA / f"a100_{predict_nodes}n8g_all_reduce_abci.log"
    assert profile.curve("all_reduce", predict_nodes * 8, predict_nodes) is None
    assert _error_pct(profile, target) <= limit_pct


def test_two_node_only_all_reduce_fit_carries_the_tree_warning():
    profile = _profile("h100_2n8g_all_reduce_ncclissue309_gjaion.log")
    assert any("2-node" in note for note in profile.fit("all_reduce", "inter").notes)


def test_inflated_two_node_curve_is_left_out_of_the_fit():
    profile = _profile(
        "h100_2n8g_all_reduce_ncclissue309_gjaion.log",
        "h100_8n8g_all_reduce_ncclissue309_gjaion.log",
    )
    fit = profile.fit("all_reduce", "inter")
    assert fit.node_counts == (8,)
    assert profile.curve("all_reduce", 16, 2) is not None


def test_short_sweep_bandwidth_is_marked_lower_bound():
    fit = _profile("a100_1n8g_all_reduce_abci.log").fit("all_reduce", "intra")
    assert not fit.saturated
    assert any("lower bound" in note for note in fit.notes)


def test_profile_is_a_collective_model_that_broadcasts():
    profile = _profile("a100_2n8g_all_reduce_abci.log")
    assert isinstance(profile, CollectiveModel)
    sizes = np.array([[1 * MIB], [8 * MIB], [0]])
    times = profile.time_s("all_reduce", sizes, num_ranks=np.array([16, 32, 1]), num_nodes=2)
    assert times.shape == (3, 3)
    assert np.all(times[2] == 0.0) and np.all(times[:, 2] == 0.0)
    assert np.all(times[:2, :2] > 0)


def test_measured_points_are_reproduced_and_interpolated_between():
    frame = parse_nccl_log(DATA / "a100_2n8g_all_reduce_abci.log")
    profile = _profile("a100_2n8g_all_reduce_abci.log")
    sizes = frame["size_bytes"].to_numpy(dtype=float)
    times = profile.time_s("all_reduce", sizes, num_ranks=16, num_nodes=2)
    np.testing.assert_allclose(times, frame["time_us_out"].to_numpy() * 1e-6, rtol=1e-9)
    between = profile.time_s("all_reduce", 3 * MIB, num_ranks=16, num_nodes=2)
    assert times[sizes == 2 * MIB][0] < between < times[sizes == 4 * MIB][0]


def test_extrapolation_is_continuous_and_grows_with_size():
    profile = _profile("a100_2n8g_all_reduce_abci.log")
    edge = 32 * MIB
    near = (
        profile.time_s("all_reduce", np.array([edge, edge * 1.0001, 4 * edge]), 16, 2)
        if False
        else profile.time_s(
            "all_reduce", np.array([edge, edge * 1.0001, 4 * edge]), num_ranks=16, num_nodes=2
        )
    )
    assert near[1] == pytest.approx(near[0], rel=1e-3)
    assert near[2] > 3 * near[0]


def test_latency_grows_with_ranks():
    profile = _profile("a100_16n8g_all_reduce_abci.log")
    small = profile.time_s("all_reduce", 1024, num_ranks=np.array([16, 64, 256]), num_nodes=8)
    assert small[0] < small[1] < small[2]


def test_sibling_collective_answers_for_missing_one():
    profile = _profile("a100_1n8g_all_gather_superbench.log")
    gather = profile.time_s("all_gather", 64 * MIB, num_ranks=4, num_nodes=1)
    scatter = profile.time_s("reduce_scatter", 64 * MIB, num_ranks=4, num_nodes=1)
    assert scatter == pytest.approx(gather)


class _Constant:
    def time_s(self, collective, size_bytes, *, num_ranks, num_nodes):
        return np.full(np.broadcast(size_bytes, num_ranks, num_nodes).shape, 1.5)


def test_missing_collective_uses_fallback_or_raises():
    frame = parse_nccl_log(DATA / "a100_2n8g_all_reduce_abci.log")
    with pytest.raises(InputError, match="no data for all_to_all inter-node"):
        _profile("a100_2n8g_all_reduce_abci.log").time_s(
            "all_to_all", 1e6, num_ranks=16, num_nodes=2
        )
    with_fallback = fit_profile(frame, fallback=_Constant())
    np.testing.assert_allclose(
        with_fallback.time_s("all_to_all", [1e6, 2e6], num_ranks=16, num_nodes=2), [1.5, 1.5]
    )
    with pytest.raises(InputError, match="intra-node"):
        _profile("a100_2n8g_all_reduce_abci.log").time_s(
            "all_reduce", 1e6, num_ranks=8, num_nodes=1
        )


def test_yaml_round_trip_keeps_predictions_sources_and_gemm(tmp_path):
    path = DATA / "a100_2n8g_all_reduce_abci.log"
    source = SourceLog(
        path=str(path),
        sha256=file_sha256(path),
        collective="all_reduce",
        num_ranks=16,
        num_nodes=2,
        gpu="A100-SXM4-40GB",
    )
    gemm = (GemmPoint(m=1024, n=1024, k=1024, dtype="bf16", flop_per_s=2e14),)
    profile = fit_profile(parse_nccl_log(path), sources=(source,), gemm=gemm)
    target = tmp_path / "profile.yaml"
    save_profile(profile, target)
    loaded = load_profile(target)
    assert loaded == profile
    assert loaded.sources[0].sha256 == file_sha256(path)
    sizes = np.geomspace(1, 1 << 34, 40)
    np.testing.assert_allclose(
        loaded.time_s("all_reduce", sizes, num_ranks=64, num_nodes=8),
        profile.time_s("all_reduce", sizes, num_ranks=64, num_nodes=8),
    )
    assert [p.name for p in tmp_path.iterdir()] == ["profile.yaml"]


def test_load_rejects_a_file_that_is_not_a_profile(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text("hello: 1\n")
    with pytest.raises(InputError, match="not a version 1 autopar profile"):
        load_profile(path)


def test_gemm_lookup_exact_interpolated_and_absent():
    points = tuple(
        GemmPoint(m=s, n=s, k=s, dtype="bf16", flop_per_s=rate)
        for s, rate in ((512, 1e14), (4096, 4e14))
    )
    profile = CommProfile(curves=(), fits=(), gemm=points)
    assert profile.gemm_flop_per_s(512, 512, 512, "bf16") == 1e14
    assert 1e14 < profile.gemm_flop_per_s(1448, 1448, 1448, "bf16") < 4e14
    assert profile.gemm_flop_per_s(512, 512, 512, "fp8") is None
