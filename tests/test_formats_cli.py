"""``--format`` of solve and evaluate through the CLI; JSON output against autopar/schemas."""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
import tomllib

import jsonschema
import pytest
from referencing import Registry, Resource
from typer.testing import CliRunner

import autopar
from autopar.base.errors import InputError
from autopar.cli import app
from autopar.cli.render import FORMATS, render_estimate, render_solve
from autopar.layout.results import Explanation, SolveResult
from autopar.outputs.schema import schema

# Pins make the solve take well under a second.
SOLVE = "solve --model llama-70b --gpus 64 --seq-len 4096 --global-batch 64 --pp 4 --vpp 2 --top 2"
EVALUATE = "evaluate --model llama-70b --gpus 64 --seq-len 4096 --global-batch 64 --tp 4 --pp 4"


def _schema(name: str) -> dict:
    return schema(name)


def _validator(name: str) -> jsonschema.protocols.Validator:
    resources = [(s["$id"], Resource.from_contents(s)) for s in map(_schema, ("solve", "evaluate"))]
    schema = _schema(name)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, registry=Registry().with_resources(resources))


def run(command: str, *extra: str):
    return CliRunner().invoke(app, [*shlex.split(command), *extra])


@pytest.fixture(scope="module")
def solved():
    return {fmt: run(SOLVE, "--format", fmt) for fmt in FORMATS}


def test_solve_json_matches_schema(solved):
    result = solved["json"]
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    _validator("solve").validate(data)
    assert data["status"] == "optimal" and len(data["layouts"]) == 2


def test_evaluate_json_matches_schema():
    result = run(EVALUATE, "--format", "json")
    assert result.exit_code == 0, result.output
    _validator("evaluate").validate(json.loads(result.stdout))


def test_infeasible_solve_json_matches_schema():
    data = SolveResult(
        status="infeasible",
        solve_time_s=0.1,
        layouts=(),
        explanation=Explanation(summary="too big"),
    ).to_dict()
    _validator("solve").validate(data)
    with pytest.raises(jsonschema.ValidationError):
        _validator("solve").validate({**data, "status": "optimal"})  # optimal needs a layout


def test_schema_rejects_a_broken_layout():
    data = autopar.evaluate(
        model="llama-70b", gpus=64, seq_len=4096, global_batch=64, tp=4, pp=4
    ).to_dict()
    _validator("evaluate").validate(data)
    data["layout"]["recompute"] = "sometimes"
    with pytest.raises(jsonschema.ValidationError):
        _validator("evaluate").validate(data)


def test_solve_csv_one_row_per_layout(solved):
    result = solved["csv"]
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 2
    assert rows[0]["pp"] == "4" and rows[0]["vpp"] == "2"
    assert float(rows[0]["step_time_s"]) <= float(rows[1]["step_time_s"])


def test_evaluate_csv():
    result = run(EVALUATE, "--format", "csv")
    assert result.exit_code == 0, result.output
    (row,) = csv.DictReader(io.StringIO(result.stdout))
    assert row["tp"] == "4" and float(row["memory_gib"]) > 0


def test_solve_megatron(solved):
    result = solved["megatron"]
    assert result.exit_code == 0, result.output
    *header, line = result.stdout.strip().splitlines()
    assert all(h.startswith("#") for h in header) and "Megatron-Core" in header[0]
    tokens = shlex.split(line)
    assert tokens[tokens.index("--pipeline-model-parallel-size") + 1] == "4"
    assert tokens[tokens.index("--num-layers-per-virtual-pipeline-stage") + 1] == "10"
    assert tokens[tokens.index("--global-batch-size") + 1] == "64"
    assert tokens[tokens.index("--num-layers") + 1] == "80"


def test_solve_megatron_bridge(solved):
    result = solved["megatron-bridge"]
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert "Megatron-Bridge 0.6.2" in lines[0] and "stack megatron-bridge-0.6" in lines[0]
    assert "model.hidden_dropout=0.0" in lines[1:]  # Bridge's recipes, not Megatron-LM's 0.1
    assert "model.virtual_pipeline_model_parallel_size=2" in lines[1:]


SOLVE_TT = "solve --model llama-3.1-70b --gpus 64 --seq-len 4096 --global-batch 64 --pp 4 --vpp 2"


def test_solve_torchtitan_03():
    result = run(SOLVE_TT, "--framework", "torchtitan", "--format", "torchtitan")
    assert result.exit_code == 0, result.output
    header, command = result.stdout.strip().splitlines()
    assert "torchtitan 0.3.0" in header
    tokens = shlex.split(command)
    assert tokens[tokens.index("--module") + 1] == "llama3"
    assert tokens[tokens.index("--parallelism.pipeline_parallel_schedule") + 1] == "Interleaved1F1B"
    assert (
        tokens[tokens.index("--parallelism.pipeline_parallel_first_stage_less_layers") + 1] == "0"
    )
    assert "--training.disable-cuda-graphs" in tokens


def test_solve_torchtitan_02():
    result = run(SOLVE_TT, "--framework", "torchtitan", "--format", "torchtitan-0.2")
    assert result.exit_code == 0, result.output
    assert "torchtitan 0.2.2" in result.stdout.splitlines()[0]
    config = tomllib.loads(result.stdout)
    assert config["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert config["parallelism"]["pipeline_parallel_last_stage_less_layers"] == 0
    assert config["training"]["seq_len"] == 4096


def test_solve_deepspeed_notes_the_pipeline_on_stderr():
    result = run(
        "solve --model llama-70b --gpus 64 --seq-len 4096 --global-batch 64 --pp 4",
        "--framework", "deepspeed", "--no-sequence-parallel", "--format", "deepspeed",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    assert (
        config["train_batch_size"] == 64
        and "pipeline" not in config
        or ("stages" not in config["pipeline"])
    )
    assert re.search(
        r"PipeModelDataParallelTopology\(num_pp=4, num_mp=\d+, num_dp=\d+\)", result.stderr
    )


@pytest.mark.parametrize(
    "fmt, extra",
    [
        ("megatron", ()),
        ("megatron-bridge", ()),
        ("torchtitan", ("--model", "llama-3.1-70b", "--zero", "3", "--framework", "torchtitan")),
        ("torchtitan-0.2", ("--zero", "0")),
        ("deepspeed", ("--no-sequence-parallel",)),
    ],
)
def test_evaluate_framework_formats(fmt, extra):
    result = run(EVALUATE, *extra, "--format", fmt)
    assert result.exit_code == 0, result.output
    assert "4" in result.stdout and result.stdout.startswith(("#", "{"))


@pytest.mark.parametrize(
    "fmt, extra, what",
    [
        # the format implies its framework, whose rules refuse the layout first
        ("deepspeed", ("--vpp", "2"), "breaks DeepSpeed: no context parallelism or interleaved"),
        ("torchtitan", ("--zero", "1"), "breaks torchtitan: FSDP shards gradients too"),
        # the framework runs it, the format has no config for the model
        ("torchtitan", ("--model", "gpt3-175b", "--zero", "3"), "no config for it"),
    ],
)
def test_format_that_cannot_express_the_layout_exits_2(fmt, extra, what):
    result = run(EVALUATE, *extra, "--format", fmt)
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert what in line


def test_solve_table_default(solved):
    assert solved["table"].exit_code == 0
    assert "proven optimal" in solved["table"].stdout


def test_output_file(tmp_path):
    target = tmp_path / "plan.json"
    result = run(EVALUATE, "--format", "json", "--output", str(target))
    assert result.exit_code == 0, result.output
    _validator("evaluate").validate(json.loads(target.read_text()))


def test_unknown_format_is_bad_input():
    result = run(EVALUATE, "--format", "yaml")
    assert result.exit_code == 2
    assert "--format" in result.output


def test_deepspeed_with_context_parallel_is_bad_input():
    result = run(EVALUATE, "--cp", "2", "--format", "deepspeed")
    assert result.exit_code == 2
    assert "breaks DeepSpeed: no context parallelism" in result.output


@pytest.mark.parametrize(
    "fmt, framework, stack",
    [
        ("torchtitan", "torchtitan", "torchtitan-0.3"),
        ("torchtitan-0.2", "torchtitan", "torchtitan-0.3"),
        ("deepspeed", "deepspeed", "deepspeed-0.19"),
        ("megatron-bridge", "megatron", "megatron-bridge-0.6"),
    ],
)
def test_a_launch_format_implies_its_framework_and_stack(fmt, framework, stack):
    """`solve --format torchtitan` used to exit 2 asking for --framework: the format now solves
    under its framework's rules and stack, says so, and a conflicting --framework is exit 2."""
    args = "solve --model llama-3.1-70b --gpus 64 --seq-len 4096 --global-batch 64 --time-limit 20"
    result = run(args, "--no-sequence-parallel", "--format", fmt)
    assert result.exit_code == 0, result.output
    implied = [line for line in result.stderr.splitlines() if "implied by --format" in line]
    named = f"framework {framework}, " if framework != "megatron" else ""
    assert implied == [f"autopar: {named}stack {stack} (implied by --format {fmt})"]
    explicit = run(args, "--no-sequence-parallel", "--format", fmt, "--framework", framework)
    assert explicit.exit_code == 0 and f"framework {framework}," not in explicit.stderr
    own = run(args, "--no-sequence-parallel", "--format", fmt, "--framework", framework,
              "--stack", "megatron-lm")  # fmt: skip
    assert own.exit_code == 0 and "implied by --format" not in own.stderr
    other = "deepspeed" if framework != "deepspeed" else "torchtitan"
    conflict = run(args, "--format", fmt, "--framework", other)
    assert conflict.exit_code == 2
    assert f"conflicts with --format {fmt}" in conflict.stderr.strip().splitlines()[-1]


def test_several_formats_imply_one_framework_or_exit_2(tmp_path):
    """One solve serves every format asked for (``json,torchtitan``), so the launch formats among
    them must agree on the framework and stack they imply: torchtitan's rules for both files,
    said once; torchtitan with deepspeed cannot be one plan, exit 2 naming both formats."""
    args = "solve --model llama-3.1-70b --gpus 64 --seq-len 4096 --global-batch 64 --time-limit 20"
    plan, launch = tmp_path / "plan.json", tmp_path / "launch.sh"
    result = run(args, "--no-sequence-parallel", "--format", "json,torchtitan",
                 "--output", f"{plan},{launch}")  # fmt: skip
    assert result.exit_code == 0, result.output
    implied = [line for line in result.stderr.splitlines() if "implied by --format" in line]
    assert implied == ["autopar: framework torchtitan, stack torchtitan-0.3 (implied by --format "
                       "torchtitan)"]  # fmt: skip
    best = json.loads(plan.read_text())["layouts"][0]["layout"]
    assert f"--parallelism.tensor_parallel_degree {best['tp']}" in launch.read_text()
    both = run(args, "--format", "torchtitan,deepspeed", "--output", f"{plan},{launch}")
    assert both.exit_code == 2
    line = both.stderr.strip().splitlines()[-1]
    assert "--format torchtitan and deepspeed" in line and "different frameworks" in line


def test_the_implied_stack_changes_the_plan_as_the_framework_runs_it():
    """DeepSpeed reduces in bf16 unless told otherwise and overlaps nothing at ZeRO 0-1: its
    implied stack says so, and the emitted config carries the planned reduction dtype."""
    args = "solve --model llama-8b --gpus 8 --seq-len 4096 --global-batch 64 --time-limit 20"
    result = run(args, "--no-sequence-parallel", "--format", "deepspeed")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["communication_data_type"] == "bf16"
    fp32 = run(args, "--no-sequence-parallel", "--format", "deepspeed", "--grad-precision", "fp32")
    assert json.loads(fp32.stdout)["communication_data_type"] == "fp32"


def test_render_api_with_problem():
    """The Python path: render with an explicit Problem, no CLI involved."""
    options = dict(model="llama-70b", gpus=64, seq_len=4096, global_batch=64)
    est = autopar.evaluate(**options, tp=4, pp=4, vpp=2)
    problem = autopar.make_problem(**options)
    assert "--num-layers-per-virtual-pipeline-stage 10" in render_estimate(
        est, "megatron", problem=problem
    )
    result = SolveResult(status="optimal", solve_time_s=0.1, layouts=(est,))
    assert "model.pipeline_model_parallel_size=4" in render_solve(
        result, "megatron-bridge", problem=problem
    )
    with pytest.raises(InputError, match="problem"):
        render_estimate(est, "torchtitan")  # outside a command, the Problem must be given


def test_per_stage_json_and_text_say_what_was_simulated():
    """A per-stage solve: the JSON (schema-valid) carries the simulated schedule and the formula
    the search ranked by; the text status says the proof is for the formula and prints the
    notes. ``--top 1`` gives the search's layout, and its even split first when that simulates
    faster."""
    command = SOLVE.replace("--pp 4 --vpp 2 --top 2", "--pp 4 --vpp 2 --top 1")
    result = run(command, "--pipeline-plan", "per-stage", "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    _validator("solve").validate(data)
    assert 1 <= len(data["layouts"]) <= 2
    best = data["layouts"][0]
    schedule = best["pipeline_schedule"]
    assert schedule["simulated_step_time_s"] == pytest.approx(best["step_time_s"])
    assert any("schedule formula" in note for note in data["notes"])
    text = run(command, "--pipeline-plan", "per-stage").output
    assert "for the schedule formula" in text.splitlines()[0]
    assert any(line.startswith("note ") and "simulated" in line for line in text.splitlines())
    lines = text.splitlines()
    assert any(line.startswith("schedule simulated") and "formula" in line for line in lines)
