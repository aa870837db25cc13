"""docs/cost-models.md: its example module runs through the CLI and the API (issue 10)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import autopar
from autopar.cli import app

DOC = Path(__file__).resolve().parents[1] / "docs" / "cost-models.md"


def _module_source() -> str:
    """The Python blocks of the page that belong to ``my_models.py``, in order."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    return "\n".join(b for b in blocks if b.startswith("# my_models.py"))


@pytest.fixture
def my_models(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(_module_source())
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_models", None)


def test_extended_default_model_through_the_api(my_models) -> None:
    base = autopar.solve(model="llama-8b", gpus=64, global_batch=256)
    result = autopar.solve(
        model="llama-8b", gpus=64, global_batch=256, cost_model="my_models:with_launch_overhead"
    )
    assert result.status == "optimal"
    launch = result.best.time_s["launch"]
    assert launch > 0
    # the new term only adds time: the optimum cannot get faster
    assert result.best.step_time_s >= base.best.step_time_s


def test_extended_default_model_through_the_cli(my_models, runner) -> None:
    argv = ["solve", "--gpus", "64", "--model", "llama-8b", "--global-batch", "256"]
    table = runner.invoke(app, [*argv, "--cost-model", "my_models:with_launch_overhead"])
    assert table.exit_code == 0, table.output
    assert "launch" in table.stdout
    data = runner.invoke(
        app, [*argv, "--cost-model", "my_models:with_launch_overhead", "-f", "json"]
    )
    assert json.loads(data.stdout)["layouts"][0]["time_s"]["launch"] > 0


def test_new_model_through_the_cli_and_the_api(my_models, runner) -> None:
    result = autopar.solve(
        model="llama-8b", gpus=64, global_batch=256, cost_model="my_models:six_n"
    )
    assert result.status == "optimal"
    assert set(result.best.time_s) >= {"compute", "bubble"}
    # with no communication and no activations, the 1F1B bubble makes PP a pure loss
    assert result.best.layout.pp == 1
    cli = runner.invoke(
        app,
        ["solve", "--gpus", "64", "--model", "llama-8b", "--global-batch", "256",
         "--cost-model", "my_models:six_n", "-f", "json"],
    )  # fmt: skip
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout)["layouts"][0]["layout"]["pp"] == 1


def test_a_cost_model_that_reads_an_undeclared_axis_is_bad_input(my_models, runner, tmp_path):
    (tmp_path / "broken_models.py").write_text(
        _module_source().replace(
            'depends_on: tuple[str, ...] = ("pp", "vpp")', 'depends_on: tuple[str, ...] = ("vpp",)'
        )
    )
    result = runner.invoke(
        app,
        ["solve", "--gpus", "8", "--model", "llama-8b",
         "--cost-model", "broken_models:with_launch_overhead"],
    )  # fmt: skip
    sys.modules.pop("broken_models", None)
    assert result.exit_code == 2
    assert "launch_overhead_s" in result.stderr and "'pp'" in result.stderr
    assert "Traceback" not in result.output
