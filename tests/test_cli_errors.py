"""Every bad input gives one line naming the file/flag and the field, exit code 2 (issue 2)."""

from __future__ import annotations

import json
import time

import pytest

import autopar
from autopar.base.errors import InputError
from autopar.cli import app
from tests.conftest import DATA

GOOD = "num_hidden_layers: 4\nhidden_size: 256\nnum_attention_heads: 8\nvocab_size: 1000\n"


def _bad_model(tmp_path, text: str, name: str = "model.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


CASES = [
    ("missing file", lambda p: ["--model", str(p / "nope.yaml")], ["nope.yaml", "not found"]),
    ("yaml syntax", lambda p: ["--model", _bad_model(p, "a: [1, 2\nb: 3\n")], ["invalid YAML"]),
    (
        "unknown key",
        lambda p: ["--model", _bad_model(p, GOOD + "num_atention_heads: 8\n")],
        ["num_atention_heads", "did you mean 'num_attention_heads'"],
    ),
    (
        "wrong type",
        lambda p: ["--model", _bad_model(p, GOOD.replace("256", "big"))],
        ["hidden_size", "integer"],
    ),
    (
        "zero size",
        lambda p: [
            "--model",
            _bad_model(p, GOOD.replace("num_hidden_layers: 4", "num_hidden_layers: 0")),
        ],
        ["num_hidden_layers", "positive"],
    ),
    (
        "negative size",
        lambda p: ["--model", _bad_model(p, GOOD.replace("1000", "-5"))],
        ["vocab_size", "positive"],
    ),
    (
        "non-integer size",
        lambda p: ["--model", _bad_model(p, GOOD.replace("256", "256.5"))],
        ["hidden_size", "integer"],
    ),
    (
        "heads vs hidden",
        lambda p: ["--model", _bad_model(p, GOOD.replace("256", "250"))],
        ["num_attention_heads", "must divide hidden_size"],
    ),
    (
        "kv heads vs heads",
        lambda p: ["--model", _bad_model(p, GOOD + "num_key_value_heads: 3\n")],
        ["num_key_value_heads", "must divide num_attention_heads"],
    ),
    ("bad json", lambda p: ["--model", _bad_model(p, '{"a": ', "m.json")], ["invalid JSON"]),
    ("unknown preset", lambda p: ["--model", "llama-70"], ["--model", "did you mean"]),
    ("unknown gpu", lambda p: ["--model", "llama-8b", "--gpu", "h1000"], ["--gpu"]),
    (
        "bad grad precision",
        lambda p: ["--model", "llama-8b", "--grad-precision", "fp16"],
        ["--grad-precision", "fp32, bf16"],
    ),
    ("zero gpus", lambda p: ["--model", "llama-8b", "--gpus", "0"], ["--gpus", "positive"]),
    ("bad precision", lambda p: ["--model", "llama-8b", "--precision", "fp4"], ["precision"]),
    (
        "fp8 on a100",
        lambda p: ["--model", "llama-8b", "--gpu", "a100", "--precision", "fp8"],
        ["FP8"],
    ),
    (
        "nvfp4 on hopper",
        lambda p: ["--model", "llama-8b", "--gpu", "h100", "--precision", "nvfp4"],
        ["--precision", "nvfp4", "h100", "hopper"],
    ),
    (
        "nvfp4 on mi355x",
        lambda p: ["--model", "llama-8b", "--gpu", "mi355x", "--precision", "nvfp4"],
        ["--precision", "mi355x", "cdna4"],
    ),
    (
        "mxfp8 on hopper",
        lambda p: [
            *("--model", "llama-8b", "--gpu", "h200"),
            *("--precision", "fp8", "--fp8-recipe", "mxfp8"),
        ],
        ["mxfp8", "Blackwell"],
    ),
    (
        "gpu file without fp4 peak",
        lambda p: ["--model", "llama-8b", "--gpu", _blackwell_file(p), "--precision", "nvfp4"],
        ["gpu.yaml", "peak_fp4_tflop_per_s", "missing"],
    ),
    (
        "offload every layer",
        lambda p: ["--model", "llama-8b", "--cpu-offload-layers", "32"],
        ["--cpu-offload-layers", "32 layers"],
    ),
    (
        "offload with layer graphs",
        lambda p: ["--model", "llama-8b", "--cpu-offload-layers", "4", "--cuda-graphs", "layers"],
        ["--cpu-offload-layers", "CUDA graphs"],
    ),
]


def _blackwell_file(tmp_path) -> str:
    """A Blackwell GPU file that omits the FP4 peak."""
    from pathlib import Path

    text = (Path(autopar.__file__).parent / "presets" / "gpus" / "b200.yaml").read_text()
    lines = [line for line in text.splitlines() if not line.startswith("peak_fp4_tflop_per_s")]
    path = tmp_path / "gpu.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize(("name", "args", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line(runner, tmp_path, name, args, expected) -> None:
    argv = (
        ["solve", "--gpus", "8", *args(tmp_path)]
        if "--gpus" not in args(tmp_path)
        else ["solve", *args(tmp_path)]
    )
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    for fragment in expected:
        assert fragment in lines[0]


def test_evaluate_names_the_broken_rule(runner) -> None:
    result = runner.invoke(app, ["evaluate", "--model", "llama-70b", "--gpus", "64", "--tp", "3"])
    assert result.exit_code == 2
    assert "tp" in result.output and "Traceback" not in result.output


def test_lists_and_show(runner) -> None:
    models = runner.invoke(app, ["models"])
    assert models.exit_code == 0 and "llama-3-70b" in models.output
    gpus = runner.invoke(app, ["gpus"])
    assert gpus.exit_code == 0 and "h200" in gpus.output and "mi300x" in gpus.output
    shown = runner.invoke(app, ["models", "--show", "llama-70b"])
    assert shown.exit_code == 0 and "num_hidden_layers: 80" in shown.output
    assert runner.invoke(app, ["--version"]).output.startswith("autopar ")


def test_conflicting_pins_exit_1_naming_the_families(runner) -> None:
    args = [
        "solve",
        "--model",
        "llama-70b",
        "--gpus",
        "64",
        "--seq-len",
        "8192",
        "--global-batch",
        "64",
        "--tp",
        "8",
        "--dp",
        "16",
        "--format",
        "json",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "Traceback" not in result.output
    explanation = json.loads(result.stdout)["explanation"]
    assert result.stderr.count("\n") == 1 and "GPU count" in result.stderr
    families = {f["family"] for f in explanation["families"]}
    assert {"GPU count", "pins and limits"} <= families
    # each pin is lifted alone, by the flag the user typed
    assert any(s.startswith("drop --dp 16:") for s in explanation["suggestions"])


def test_memory_bound_problem_exits_1_with_nearest_miss(runner) -> None:
    args = [
        "solve",
        "--model",
        "llama-3.1-405b",
        "--gpus",
        "8",
        "--gpu",
        "a100-40gb",
        "--global-batch",
        "8",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "nearest miss" in result.output and "binding: memory" in result.output
    assert "--gpus 256" in result.output


def test_gpus_that_cannot_split_the_batch_are_an_explained_infeasibility(runner) -> None:
    """1,000 GPUs and 1,024 sequences: dp must divide the batch, and no TP, CP or PP size takes
    the factor 5^3. A search result (exit 1) whose explanation names the binding products, and,
    for a GPU count near a working one, the change that fits."""
    result = runner.invoke(app, ["solve", "--model", "llama-70b", "--gpus", "1000"])
    assert result.exit_code == 1, result.output
    assert "GPU count" in result.output and "global batch" in result.output
    near = runner.invoke(app, ["solve", "--model", "llama-8b", "--gpus", "1021", "-f", "json"])
    assert near.exit_code == 1, near.output
    explanation = json.loads(near.stdout)["explanation"]
    assert any("--gpus 1024" in change for change in explanation["suggestions"])


# ---------------------------------------------------------------------------------------------
# hostile flags (issue 15): bounded before any enumeration, named as typed, never a traceback


def _one_error_line(result) -> str:
    assert "Traceback" not in result.output, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--gpus", str(2**63)], "--gpus: must be a positive integer <= 1,048,576"),
        (["--gpus", str(10**30)], "--gpus: must be a positive integer <= 1,048,576"),
        (["--gpus", "8", "--global-batch", str(2**62)], "--global-batch: must be a positive"),
        (["--gpus", "8", "--seq-len", "0"], "--seq-len: must be a positive integer"),
        (["--gpus", "8", "--global-batch-tokens", str(2**50)], "--global-batch-tokens"),
        (["--gpus", "8", "--tp", str(2**40)], "--tp: must be a positive integer"),
        (["--gpus", "8", "--max-vpp", "100000"], "--max-vpp: must be a positive integer <= 64"),
        (["--gpus", "8", "--top", "1000000"], "--top: must be a positive integer <= 100"),
        (["--gpus", "8", "--time-limit", "-1"], "--time-limit: must be a finite number"),
        (["--gpus", "8", "--time-limit", "nan"], "--time-limit: must be a finite number"),
        (["--gpus", "8", "--gpus-per-node", "0"], "--gpus-per-node: must be a positive"),
        (["--gpus", "8", "--gpu", ""], "--gpu: must name a preset or a file"),
        (["--gpus", "8", "--cost-model", ":"], "--cost-model: ':' must be module:attr"),
        (["--gpus", "8", "--cost-model", "json:loads"], "--cost-model: 'json:loads' is neither"),
        (["--gpus", "8", "--cost-model", "os:abort"], "--cost-model: 'os:abort' is neither"),
        (["--gpus", "8", "--gpu", "g" * 5000], "--gpu: no preset or file named"),
        (["--gpus", "8", "--precision", "x" * 5000], "--precision"),
    ],
)
def test_hostile_flags_exit_2_at_once_naming_the_flag(runner, args, fragment) -> None:
    start = time.perf_counter()
    result = runner.invoke(app, ["solve", "--model", "llama-8b", *args])
    assert result.exit_code == 2, result.output
    line = _one_error_line(result)
    assert fragment in line and len(line) < 500
    assert time.perf_counter() - start < 5.0


@pytest.mark.parametrize(
    "command",
    [
        ["solve", "--model", "llama-8b", "--gpus", "8"],
        ["evaluate", "--model", "llama-8b", "--gpus", "8"],
        ["sweep", "--model", "llama-8b", "--gpus", "8,16"],
        ["calibrate", str(DATA / "nccl" / "a100_1n8g_all_reduce_abci.log")],
        ["bench", "comm", "--nproc", "2"],
    ],
    ids=["solve", "evaluate", "sweep", "calibrate", "bench-comm"],
)
@pytest.mark.parametrize("where", ["directory", "missing folder", "long name"])
def test_unwritable_output_fails_before_any_work(runner, tmp_path, command, where) -> None:
    target = {
        "directory": tmp_path,
        "missing folder": tmp_path / "missing" / "out.json",
        "long name": tmp_path / ("o" * 5000),
    }[where]
    start = time.perf_counter()
    result = runner.invoke(app, [*command, "--output", str(target)])
    assert result.exit_code == 2, result.output
    assert "--output" in _one_error_line(result)
    assert time.perf_counter() - start < 2.0
    assert list(tmp_path.iterdir()) == []


def test_a_one_rank_nccl_log_is_an_input_error(runner, tmp_path) -> None:
    """A 1-rank all_reduce has bus-bandwidth factor 0 (it moves nothing): it used to divide by
    zero in calibrate."""
    text = (DATA / "nccl" / "a100_1n8g_all_reduce_abci.log").read_text()
    one_rank = "\n".join(
        line for line in text.splitlines() if "Rank" not in line or "Rank  0 " in line
    )
    log = tmp_path / "one_all_reduce.log"
    log.write_text(one_rank)
    result = runner.invoke(app, ["calibrate", str(log), "-o", str(tmp_path / "p.yaml")])
    assert result.exit_code == 2, result.output
    assert "1 ranks" in _one_error_line(result)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("version: 1\nfits: {a: 1}\n", "fits: must be a list"),
        ("version: 1\nfits: [1, 2]\n", "fits[0]: must be a mapping"),
        ("version: 1\ncurves: [{collective: all_reduce, num_ranks: x}]\n", "num_ranks"),
        ("version: 1\ngemm: [{m: 1, n: 1, k: 1, dtype: bf16, flop_per_s: .nan}]\n", "flop_per_s"),
        ("\x00\x01binary", "binary"),
    ],
)
def test_broken_comm_profiles_name_the_entry(runner, tmp_path, text, fragment) -> None:
    profile = tmp_path / "profile.yaml"
    profile.write_text(text)
    result = runner.invoke(
        app, ["solve", "--model", "llama-8b", "--gpus", "8", "--comm-profile", str(profile)]
    )
    assert result.exit_code == 2, result.output
    assert fragment in _one_error_line(result)


@pytest.mark.parametrize("fmt", ["csv", "megatron", "torchtitan", "deepspeed"])
def test_infeasible_explanation_in_every_format(runner, fmt) -> None:
    result = runner.invoke(
        app,
        ["solve", "--model", "llama-70b", "--gpus", "1021", "--global-batch", "1024", "-f", fmt],
    )
    assert result.exit_code == 1, result.output
    assert "GPU count" in result.stdout and "would fit" in result.stdout
    *implied, last = result.stderr.splitlines()
    assert last.startswith("autopar: infeasible:")
    # a launch format says which framework's rules and stack it implied (one line)
    assert len(implied) == (fmt in ("torchtitan", "deepspeed"))
    assert all("(implied by --format" in line for line in implied)


def test_sweep_keeps_good_points_and_reports_the_bad_one() -> None:
    """4 Mi tokens are not a whole number of 3000-token sequences: that point is a row with
    status error and its reason; the 4096-token point is solved."""
    result = autopar.sweep(model="llama-8b", gpus=[8], seq_len=[4096, 3000], time_limit=5.0)
    good, bad = result.rows
    assert good.status == "optimal" and bad.status == "error"
    assert "--global-batch-tokens" in bad.reason
    json.dumps(result.to_dict(), allow_nan=False)


@pytest.mark.parametrize("tokens", [float("inf"), float("nan"), -1.0, 1e30])
def test_sweep_train_tokens_must_be_finite(tokens) -> None:
    with pytest.raises(InputError, match="--train-tokens"):
        autopar.sweep(model="llama-8b", gpus=[8], train_tokens=tokens)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gpus": True},
        {"gpus": 2.5},
        {"gpus": "8"},
        {"gpus": None},
        {"gpus": 8, "seq_len": float("nan")},
        {"gpus": 8, "global_batch": [1]},
        {"gpus": 8, "time_limit": float("nan")},
        {"gpus": 8, "top": 0},
        {"gpus": 8, "model": 123},
        {"gpus": 8, "gpu": b"h100"},
        {"gpus": 8, "limits": {"tp": "x"}},
        {"gpus": 8, "limits": {"bogus": 2}},
        {"gpus": 8, "recompute": 5},
        {"gpus": 8, "zero": [9]},
        {"gpus": 8, "framework": ["megatron"]},
        {"gpus": 8, "cost_model": ":"},
    ],
)
def test_api_rejects_hostile_values_with_input_error(kwargs) -> None:
    options = {"model": "llama-8b", **kwargs}
    with pytest.raises(InputError):
        autopar.solve(**options)


@pytest.mark.parametrize("fmt", ["json", "megatron", "torchtitan-0.2", "deepspeed"])
def test_uneven_pipeline_solves_in_every_format(runner, fmt) -> None:
    """Llama-3.1 405B's 126 layers need an uneven split: the launcher formats used to exit 2
    where the JSON solve succeeded (the problem was rebuilt without --uneven-pipeline).
    torchtitan 0.3 refuses 405B whatever the layout (its only config trains in FP8 rowwise)."""
    args = ["solve", "--model", "llama-3.1-405b", "--gpus", "1024", "--uneven-pipeline"]
    framework = fmt.split("-")[0]
    rules = ["--framework", framework] if framework in ("torchtitan", "deepspeed") else []
    result = runner.invoke(app, [*args, *rules, "--top", "1", "-f", fmt])
    assert result.exit_code == 0, result.output
    if fmt == "megatron":
        assert "--pipeline-model-parallel-size" in result.stdout


def test_stale_temp_files_never_block_a_write_and_are_cleared(tmp_path) -> None:
    """A run killed by SIGKILL can leave ``.out.json.XXXXXXXX.autopar.tmp``: the next write
    succeeds beside it and removes it once it is older than ``STALE_TEMP_S`` (a live write takes
    milliseconds)."""
    import os

    from autopar.base.files import STALE_TEMP_S, TEMP_MARKER, write_atomic

    stale = tmp_path / f".out.json.abc12345{TEMP_MARKER}"
    fresh = tmp_path / f".out.json.def45678{TEMP_MARKER}"
    stale.write_text("half")
    fresh.write_text("in flight")
    old = time.time() - STALE_TEMP_S - 60
    os.utime(stale, (old, old))
    write_atomic(tmp_path / "out.json", "{}\n")
    assert (tmp_path / "out.json").read_text() == "{}\n"
    assert not stale.exists() and fresh.exists()


def test_write_atomic_reports_os_failures_as_output_errors(tmp_path) -> None:
    from autopar.base.errors import OutputError
    from autopar.base.files import write_atomic

    with pytest.raises(OutputError, match="is a directory"):
        write_atomic(tmp_path, "x")
    with pytest.raises(OutputError, match="directory does not exist"):
        write_atomic(tmp_path / "no" / "out.json", "x")
    assert list(tmp_path.iterdir()) == []


def test_written_files_get_the_mode_a_plain_open_gives(tmp_path) -> None:
    """The temp file behind an atomic write is 0600; the output must not stay so (a report is
    for others to read too)."""
    import os
    import stat

    from autopar.base.files import write_atomic

    mask = os.umask(0o022)
    try:
        write_atomic(tmp_path / "report.html", "<html></html>\n")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == 0o644


def test_a_closed_output_pipe_ends_quietly() -> None:
    """``autopar ... | head``: the reader goes away, autopar stops with 141 and says nothing."""
    import subprocess
    import sys

    code = (
        "import sys, typer\n"
        "from autopar.cli.errors import guarded\n"
        "@guarded\n"
        "def command():\n"
        "    raise BrokenPipeError(32, 'Broken pipe')\n"
        "try:\n"
        "    command()\n"
        "except typer.Exit as stop:\n"
        "    sys.exit(stop.exit_code)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 141
    assert result.stderr == ""
