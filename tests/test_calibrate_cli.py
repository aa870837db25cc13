"""``autopar calibrate`` and ``autopar bench`` via typer's CliRunner (autopar/cli/calibrate.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from autopar.calibration.profile_io import load_profile
from autopar.cli.calibrate import register

DATA = Path(__file__).parent / "data" / "nccl"
ABCI = [str(DATA / f"a100_{n}n8g_all_reduce_abci.log") for n in (2, 4, 16)]

app = typer.Typer()
register(app)
runner = CliRunner()


def test_calibrate_writes_profile_and_prints_fit_summary(tmp_path):
    output = tmp_path / "profile.yaml"
    result = runner.invoke(app, ["calibrate", *ABCI, "--output", str(output)])
    assert result.exit_code == 0, result.output
    assert "a100_4n8g_all_reduce_abci.log: all_reduce 32 ranks / 4 nodes" in result.output
    assert "all_reduce inter" in result.output
    profile = load_profile(output)
    assert {s.num_nodes for s in profile.sources} == {2, 4, 16}
    assert all(len(s.sha256) == 64 for s in profile.sources)


def test_compare_json_reports_error_per_log(tmp_path):
    output = tmp_path / "profile.yaml"
    assert runner.invoke(app, ["calibrate", ABCI[0], ABCI[2], "-o", str(output)]).exit_code == 0
    result = runner.invoke(
        app, ["calibrate", "--profile", str(output), "--compare", ABCI[1], "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    (record,) = json.loads(result.output)
    assert record["file"].endswith("a100_4n8g_all_reduce_abci.log")
    assert (record["collective"], record["ranks"], record["nodes"]) == ("all_reduce", 32, 4)
    assert 0.0 <= record["median_abs_pct_error"] <= 25.0


def test_compare_table_prints_per_size_rows(tmp_path):
    output = tmp_path / "profile.yaml"
    runner.invoke(app, ["calibrate", ABCI[0], "-o", str(output)])
    result = runner.invoke(app, ["calibrate", "--profile", str(output), "--compare", ABCI[0]])
    assert result.exit_code == 0
    assert "measured_us" in result.output and "33554432" in result.output


def test_logs_without_rank_lines_accept_gpu_options(tmp_path):
    log = tmp_path / "p5_run.log"
    log.write_text((DATA / "h100_1n8g_all_reduce_awsbatchp5.log").read_text())
    args = ["calibrate", str(log), "-o", str(tmp_path / "p.yaml"), "--format", "json"]
    failed = runner.invoke(app, args)
    assert failed.exit_code == 2
    assert "cannot determine the collective" in failed.output
    renamed = tmp_path / "p5_all_reduce.log"
    log.rename(renamed)
    args[1] = str(renamed)
    result = runner.invoke(app, [*args, "--gpus-per-node", "8", "--gpu", "H100"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["ranks"] == 8


def test_bad_input_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "h100_2n8g_all_reduce_bad.log"
    text = (DATA / "h100_2n8g_all_reduce_ncclissue290.log").read_text().splitlines()
    bad.write_text("\n".join(text[:24] + [" 0:     33554432       8388608     float"] + text[25:]))
    result = runner.invoke(app, ["calibrate", str(bad), "-o", str(tmp_path / "p.yaml")])
    assert result.exit_code == 2
    assert "line 25: expected 13 columns" in result.output
    assert not (tmp_path / "p.yaml").exists()
    missing = runner.invoke(app, ["calibrate", ABCI[0]])
    assert missing.exit_code == 2 and "--output" in missing.output
    no_profile = runner.invoke(app, ["calibrate", "--compare", ABCI[0]])
    assert no_profile.exit_code == 2 and "--profile" in no_profile.output


@pytest.mark.xdist_group("torch")  # one worker imports torch (tests/conftest.py)
def test_bench_comm_and_gemm_commands(tmp_path):
    log = tmp_path / "comm.log"
    result = runner.invoke(
        app,
        [
            "bench",
            "comm",
            "--nproc",
            "2",
            "--output",
            str(log),
            "--min-bytes",
            "4096",
            "--max-bytes",
            "16384",
            "--iters",
            "2",
            "--warmup",
            "0",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "torchrun" in result.output
    profile_path = tmp_path / "profile.yaml"
    fit = runner.invoke(app, ["calibrate", str(log), "-o", str(profile_path)])
    assert fit.exit_code == 0, fit.output
    gemm = runner.invoke(
        app,
        [
            "bench",
            "gemm",
            "--shape",
            "32,32,32",
            "--dtype",
            "fp32",
            "--iters",
            "2",
            "--profile",
            str(profile_path),
        ],
    )
    assert gemm.exit_code == 0, gemm.output
    assert "TFLOP/s" in gemm.output
    profile = load_profile(profile_path)
    assert profile.gemm_flop_per_s(32, 32, 32, "fp32") > 0
    assert profile.fit("all_reduce", "intra") is not None
