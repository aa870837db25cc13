"""A measured communication profile drives the layout (issue 6): with a slow network the solver
keeps data parallelism off it (less DP, more PP), and a group crossing nodes with fewer ranks per
node gets a proportionally smaller share of the measured bandwidth."""

from __future__ import annotations

import json

import pytest

from autopar.calibration.comm_bench import (
    BenchResult,
    CommBenchOptions,
    RankInfo,
    Row,
    Table,
    element_count,
    format_log,
)
from autopar.calibration.profile import network_share
from autopar.calibration.profile_io import load_profile
from autopar.cli import app
from autopar.costs.comm import bus_bandwidth_factor

SIZES = tuple(2**k for k in range(16, 31, 2))


def synthetic_log(ranks: int, nodes: int, busbw_bytes_per_s: float, latency_s: float = 10e-6):
    """An nccl-tests log of an ideal alpha-beta network (through the benchmark's own writer)."""
    per_node = ranks // nodes
    infos = tuple(
        RankInfo(
            rank=r,
            pid=r,
            host=f"node{r // per_node}",
            device=r % per_node,
            device_name="NVIDIA H100",
        )
        for r in range(ranks)
    )
    tables = []
    for collective in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"):
        factor = float(bus_bandwidth_factor(collective, 2 if collective == "send_recv" else ranks))
        rows = tuple(
            Row(
                size_bytes=s,
                count=element_count(collective, s, ranks),
                time_s=latency_s + s * factor / busbw_bytes_per_s,
            )
            for s in SIZES
        )
        tables.append(Table(collective=collective, rows=rows))
    options = CommBenchOptions(min_bytes=SIZES[0], max_bytes=SIZES[-1])
    return format_log(
        BenchResult(world_size=ranks, backend="nccl", ranks=infos, tables=tuple(tables)), options
    )


@pytest.fixture
def profiles(tmp_path, runner):
    (tmp_path / "intra.log").write_text(synthetic_log(8, 1, 360e9))
    (tmp_path / "fast.log").write_text(synthetic_log(16, 2, 360e9))
    (tmp_path / "slow.log").write_text(synthetic_log(16, 2, 8e9))
    out = {}
    for name in ("fast", "slow"):
        path = tmp_path / f"{name}.yaml"
        result = runner.invoke(
            app,
            [
                "calibrate",
                str(tmp_path / "intra.log"),
                str(tmp_path / f"{name}.log"),
                "--output",
                str(path),
            ],
        )
        assert result.exit_code == 0, result.output
        out[name] = str(path)
    return out


def _best(runner, profile: str) -> dict:
    result = runner.invoke(
        app,
        [
            "solve",
            "--model",
            "llama-8b",
            "--gpus",
            "64",
            "--seq-len",
            "4096",
            "--global-batch",
            "256",
            "--top",
            "1",
            "--comm-profile",
            profile,
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["layouts"][0]


def test_slow_network_moves_data_parallelism_off_it(runner, profiles) -> None:
    fast, slow = _best(runner, profiles["fast"]), _best(runner, profiles["slow"])
    assert slow["step_time_s"] > fast["step_time_s"]
    assert slow["layout"]["dp"] < fast["layout"]["dp"]
    assert slow["layout"]["pp"] * slow["layout"]["tp"] * slow["layout"]["cp"] > (
        fast["layout"]["pp"] * fast["layout"]["tp"] * fast["layout"]["cp"]
    )


def test_fewer_ranks_per_node_get_a_smaller_share(profiles) -> None:
    profile = load_profile(profiles["slow"])
    fit = profile.fit("all_reduce", "inter")
    assert network_share(fit, 16, 2) == 1.0  # as measured: 8 ranks per node
    assert network_share(fit, 8, 8) == pytest.approx(1 / 8)  # one rank per node
    one_per_node = profile.time_s("all_reduce", 2**28, num_ranks=8, num_nodes=8)
    eight_per_node = profile.time_s("all_reduce", 2**28, num_ranks=64, num_nodes=8)
    assert float(one_per_node) > 4 * float(eight_per_node)
    # Point-to-point traffic is per rank: the same share whatever the group.
    assert network_share(profile.fit("send_recv", "inter"), 2, 2) == 1.0
