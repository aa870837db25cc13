"""A per-stage estimate is the uniform estimate of its layout with the plan's figures in place
(issue 19): it keeps ``inputs`` and ``choices``, and its Megatron-LM arguments are the uniform
ones with the plan's split and recompute, the same header and notes, checked by Megatron's
parser and megatron-core's ``TransformerConfig``."""

from __future__ import annotations

import json
import shlex

import pytest

from autopar import api
from autopar.cli import app
from autopar.layout.stages import StagePlan, StageRecompute
from autopar.outputs import emit
from autopar.outputs.emit.megatron_stages import recompute_flags
from tests import consumers

pytestmark = pytest.mark.xdist_group("torch")  # one worker imports torch (tests/conftest.py)

MIXTRAL = (
    "--gpus", "16", "--model", "mixtral-8x7b", "--tp", "2", "--ep", "4", "--pp", "2",
    "--moe-dispatchers", "allgather",
)  # fmt: skip


def _evaluate(runner, *argv: str) -> str:
    result = runner.invoke(app, ["evaluate", *argv])
    assert result.exit_code == 0, result.output
    return result.stdout


def _header(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#")]


@pytest.mark.parametrize("tp", ["1", "2"])
def test_per_stage_megatron_output_has_the_uniform_header(runner, tp):
    """The release header and the CUDA_DEVICE_MAX_CONNECTIONS note (with TP) as the uniform
    output of the same layout has them."""
    layout = ("--gpus", "8", "--model", "llama-8b", "--pp", "2", "--tp", tp, "--format", "megatron")
    uniform = _evaluate(runner, *layout)
    staged = _evaluate(runner, *layout, "--stage-layers", "15,17")
    assert _header(staged) == _header(uniform)
    assert any("CUDA_DEVICE_MAX_CONNECTIONS" in line for line in _header(staged)) == (tp == "2")
    assert "--pipeline-model-parallel-layout" in staged


def test_per_stage_output_sets_the_dispatcher_it_priced(runner):
    """``--moe-dispatchers allgather``: the per-stage estimate priced allgather, says so and
    launches it."""
    line = _evaluate(runner, *MIXTRAL, "--stage-layers", "15,17", "--format", "megatron")
    words = shlex.split(line.splitlines()[-1])
    assert words[words.index("--moe-token-dispatcher-type") + 1] == "allgather"
    staged = json.loads(_evaluate(runner, *MIXTRAL, "--stage-layers", "15,17", "--format", "json"))
    uniform = json.loads(_evaluate(runner, *MIXTRAL, "--format", "json"))
    assert staged["choices"] == uniform["choices"] == {"moe_token_dispatcher": "allgather"}
    assert "chosen       moe_token_dispatcher=allgather" in _evaluate(
        runner, *MIXTRAL, "--stage-layers", "15,17"
    )


def test_per_stage_evaluate_keeps_the_inputs(runner):
    staged = json.loads(_evaluate(runner, *MIXTRAL, "--stage-layers", "15,17", "--format", "json"))
    uniform = json.loads(_evaluate(runner, *MIXTRAL, "--format", "json"))
    assert staged["inputs"] == uniform["inputs"]
    text = _evaluate(runner, *MIXTRAL, "--stage-layers", "15,17")
    assert text.splitlines()[0].startswith("inputs       mixtral-8x7b")
    assert "pipeline plan (per stage)" in text


def test_per_stage_megatron_output_keeps_the_priced_p2p_schedule(runner):
    """Interleaved per-stage plans under a stack that does not overlap P2P: Megatron would
    overlap by default, so the output turns it off as the uniform one does."""
    layout = (
        "--gpus", "1024", "--model", "llama-70b", "--seq-len", "8192", "--global-batch", "1024",
        "--tp", "8", "--pp", "4", "--vpp", "2", "--format", "megatron",
    )  # fmt: skip
    uniform = _evaluate(runner, *layout)
    staged = _evaluate(runner, *layout, "--pipeline-plan", "per-stage")
    assert "--no-overlap-p2p-communication" in uniform.split()
    assert "--no-overlap-p2p-communication" in staged.split()


PLANS = [
    (
        "llama-70b",
        dict(tp=8, pp=4, vpp=2),
        "9,10,10,10,10,10,10,11",
        "full:2,none,selective,full:3",
    ),
    ("llama-70b", dict(tp=8, pp=4), "19,20,21,20", "full:2"),
    ("llama-70b", dict(tp=8, pp=4), "20,20,20,20", "selective,none,none,none"),
    ("deepseek-v3", dict(tp=2, pp=8, ep=64, vpp=4), ",".join(["3", *["2"] * 29, "0", "0"]), "none"),
]


@pytest.mark.parametrize(("model", "values", "layers", "recompute"), PLANS)
def test_megatron_reads_the_per_stage_arguments(model, values, layers, recompute):
    """Megatron-LM's parser takes every flag; megatron-core's ``TransformerConfig`` parses the
    layout (its ``PipelineParallelLayerLayout``) into the plan's virtual stages and takes the
    recompute the flags say."""
    problem = api.make_problem(model=model, gpus=1024, seq_len=4096, global_batch=8192)
    layout = api.layout_of(problem, pipeline_plan="per-stage", **values)
    plan = api.plan_of(problem, layout, stage_layers=layers, stage_recompute=recompute)
    estimate = api.evaluate_problem(problem, layout, plan=plan)
    line = emit.megatron_args(estimate, problem)
    args = consumers.megatron_parse(line)
    assert "--num-layers-per-virtual-pipeline-stage" not in args
    assert "--decoder-first-pipeline-num-layers" not in args
    config = consumers.megatron_transformer_config(line)
    assert config.pipeline_model_parallel_size == plan.pp
    assert (config.virtual_pipeline_model_parallel_size or 1) == plan.vpp
    flags, _ = recompute_flags(plan)
    granularity = dict(flags).get("--recompute-granularity")
    assert config.recompute_granularity == granularity
    if granularity == "full":
        assert config.recompute_num_layers == int(dict(flags)["--recompute-num-layers"])


def test_a_plan_mixing_selective_and_none_recomputes_selectively_with_a_note():
    """Megatron takes one granularity: stages with none and selective run selective (safe on
    memory), and the note says so (before, no recompute flag was written at all)."""
    plan = StagePlan(
        pp=2, vpp=1, chunk_layers=(4, 4), recompute=(StageRecompute("selective"), StageRecompute())
    )
    flags, note = recompute_flags(plan)
    assert flags == [("--recompute-granularity", "selective")]
    assert note is not None and "selective,none" in note and "selectively" in note
    even = StagePlan(pp=2, vpp=1, chunk_layers=(4, 4), recompute=(StageRecompute("selective"),) * 2)
    assert recompute_flags(even) == ([("--recompute-granularity", "selective")], None)
