"""A model is called by what its file says it is (issue 24): a downloaded ``config.json`` by its
``_name_or_path`` or ``architectures``, never ``config``, in every output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.inputs.loading import load_model

DATA = Path(__file__).resolve().parent / "data"
HUB_ID = "meta-llama/Meta-Llama-3-70B"
LLAMA = json.loads((DATA / "llama-3-70b-config.json").read_text())


def _config(tmp_path: Path, file: str = "config.json", **extra) -> Path:
    path = tmp_path / file
    path.write_text(json.dumps({**LLAMA, **extra}))
    return path


@pytest.mark.parametrize(
    ("file", "extra", "expected"),
    [
        ("config.json", {}, "LlamaForCausalLM"),
        (
            "config.json",
            {"_name_or_path": "meta-llama/Meta-Llama-3-70B"},
            "meta-llama/Meta-Llama-3-70B",
        ),
        ("config.json", {"_name_or_path": "/ckpt/run7/my-llama/"}, "my-llama"),
        ("config.json", {"_name_or_path": ""}, "LlamaForCausalLM"),
        ("config.json", {"architectures": [], "model_type": "llama"}, "llama"),
        ("llama-70b-base.json", {}, "llama-70b-base"),
        ("config.json", {"name": "ours", "_name_or_path": "meta-llama/x"}, "ours"),
    ],
)
def test_a_downloaded_config_is_named_from_its_keys(tmp_path, file, extra, expected):
    assert load_model(str(_config(tmp_path, file, **extra))).name == expected


def test_every_output_names_the_model_not_config(tmp_path):
    path = _config(tmp_path, _name_or_path="meta-llama/Meta-Llama-3-70B")
    base = ["--gpus", "64", "--model", str(path), "--global-batch", "128"]
    runner = CliRunner()
    solved = runner.invoke(app, ["solve", *base, "--top", "1", "--format", "json"])
    assert solved.exit_code == 0, solved.output
    assert json.loads(solved.stdout)["inputs"]["model"] == "meta-llama/Meta-Llama-3-70B"
    table = runner.invoke(app, ["evaluate", *base, "--tp", "8", "--pp", "2"])
    assert table.exit_code == 0, table.output
    assert "inputs       meta-llama/Meta-Llama-3-70B (70.6B params)" in table.stdout
    assert "config" not in table.stdout.split("\n", 1)[0]
