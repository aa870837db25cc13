"""Every bad input gives one line naming the file/flag and the field, exit code 2 (issue 2)."""

from __future__ import annotations

import json

import pytest

from autopar.cli import app

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
        ["--grad-precision", "fp32 or bf16"],
    ),
    ("zero gpus", lambda p: ["--model", "llama-8b", "--gpus", "0"], ["--gpus", "positive"]),
    ("bad precision", lambda p: ["--model", "llama-8b", "--precision", "fp4"], ["precision"]),
    (
        "fp8 on a100",
        lambda p: ["--model", "llama-8b", "--gpu", "a100", "--precision", "fp8"],
        ["FP8"],
    ),
]


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
    assert "drop the pins and limits" in explanation["suggestions"]


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
    """7 GPUs and 1024 sequences: dp must be 1 or 7, and neither splits the model's heads and
    the batch. A search result (exit 1) whose explanation names the binding products, and, for
    a GPU count near a working one, the change that fits."""
    result = runner.invoke(app, ["solve", "--model", "llama-70b", "--gpus", "7"])
    assert result.exit_code == 1, result.output
    assert "GPU count" in result.output and "global batch" in result.output
    near = runner.invoke(app, ["solve", "--model", "llama-8b", "--gpus", "1021", "-f", "json"])
    assert near.exit_code == 1, near.output
    explanation = json.loads(near.stdout)["explanation"]
    assert any("--gpus 1024" in change for change in explanation["suggestions"])
