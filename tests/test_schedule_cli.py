"""Bad input around the pipeline schedule (issue 23): a schedule the framework does not ship,
a layout that breaks a schedule's constraint, each exit 2 with the rule and its source; a
layout given to evaluate is not held to the search restrictions among schedules."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autopar.cli import app

RUNNER = CliRunner()
TITAN_70B = ["--model", "llama-70b", "--gpus", "256", "--framework", "torchtitan", "--zero", "3"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["solve", "--model", "llama-70b", "--gpus", "64", "--framework", "deepspeed",
             "--pipeline-schedule", "zb-v"],
            ("deepspeed does not run the zb-v schedule", "engine.py L501"),
        ),
        (
            ["solve", "--model", "llama-70b", "--gpus", "64", "--pipeline-schedule", "dualpipe"],
            ("--pipeline-schedule", "must be among"),
        ),
        (
            ["evaluate", *TITAN_70B, "--tp", "8", "--pp", "4", "--vpp", "4",
             "--pipeline-schedule", "zb-v"],
            ("exactly two chunks per rank", "L3505-3509"),
        ),
        (
            ["evaluate", *TITAN_70B, "--tp", "8", "--pp", "4", "--vpp", "2", "--global-batch",
             "16", "--pipeline-schedule", "dualpipe-v"],
            ("grad_accum >= 2*pp", "L3697-3700"),
        ),
        (  # a per-stage V plan of four chunks per rank (per-stage V plans run: test_stage_v)
            ["evaluate", *TITAN_70B, "--tp", "8", "--pp", "4", "--vpp", "4",
             "--pipeline-schedule", "zb-v", "--stage-layers", ",".join(["5"] * 16)],
            ("exactly two chunks per rank", "L3505-3509"),
        ),
    ],
)  # fmt: skip
def test_bad_schedules_exit_2_with_the_rule_and_its_source(args, words) -> None:
    result = RUNNER.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for word in words:
        assert word in result.output, result.output


def test_a_given_layout_is_not_held_to_the_search_restrictions() -> None:
    """1F1B is searched only where the combined 1F1B is refused, but a user may still evaluate
    it; the combined one hides part of the all-to-all, so it is faster on the same layout."""
    base = ["evaluate", "--model", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--pp", "2",
            "--vpp", "2", "--ep", "8", "--ep-comm-overlap", "--format", "json"]  # fmt: skip
    import json

    plain = RUNNER.invoke(app, base)
    combined = RUNNER.invoke(app, [*base, "--pipeline-schedule", "combined-1f1b"])
    assert plain.exit_code == 0 and combined.exit_code == 0, plain.output + combined.output
    one, two = json.loads(plain.output), json.loads(combined.output)
    assert one["layout"]["pipeline_schedule"] == "1f1b"
    assert two["layout"]["pipeline_schedule"] == "combined-1f1b"
    assert two["step_time_s"] < one["step_time_s"]
    assert two["memory_bytes"]["total"] == pytest.approx(one["memory_bytes"]["total"])
