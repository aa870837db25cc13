"""autopar's Megatron-Bridge overrides applied by Megatron-Bridge 0.6.2 itself (issue 21).

For each public ``config.json`` the repository ships whose family has a Bridge recipe: the
recipe builds its model from that very file (Bridge's own HF -> Megatron conversion), autopar's
overrides go through Bridge's override machinery and the runner's sync steps, and the config is
finalised as for a launch (``tests/bridge_probe.py`` says how). Then: every override set is
accepted or refused by autopar naming why; the job Bridge would build has the planned layout
(sizes, split, no recipe pipeline layout left over, batch, sequence length); and the model it
would train is the one autopar read (shapes, RoPE, norms, biases, activation, router).

All cases run in one ``bridge_probe`` process for the session (importing Bridge's modules costs
most of its ~14 CPU-s): the module's tests share ``xdist_group("bridge")``, so one worker runs
them; the file lock keeps it to one process when the tests are spread without that grouping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

import autopar
from autopar.base.errors import InputError
from autopar.layout.plan import Layout
from autopar.layout.split import pipeline_split
from autopar.outputs.emit.bridge import BRIDGE_TARGET, bridge_args, bridge_overrides
from tests.conftest import DATA

# one worker runs every case: the probe once, no second worker waiting on its lock (conftest)
pytestmark = pytest.mark.xdist_group("bridge")
RECIPES = "megatron.bridge.recipes"


@dataclass(frozen=True)
class Case:
    id: str
    config: str  # under tests/data
    recipe: str  # module:function under megatron.bridge.recipes
    layout: Layout
    stack: dict | None = None  # stack switches (API keywords)


def _lay(**kw) -> Layout:
    return Layout(**{"tp": 1, "pp": 1, "sequence_parallel": kw.get("tp", 1) > 1, **kw})


CASES = (
    Case(
        "llama-3-70b-interleaved",
        "llama-3-70b-config.json",
        "llama.h100.llama3:llama3_70b_pretrain_32gpu_h100_bf16_config",
        _lay(tp=4, pp=4, vpp=5, dp=2, grad_accum=32, zero=1),
        stack={"tp_comm_overlap": True, "pp_comm_overlap": True},  # the recipe has the section
    ),
    Case(
        "llama-3-70b-uneven-cp",
        "llama-3-70b-config.json",
        "llama.h100.llama3:llama3_70b_pretrain_32gpu_h100_bf16_config",
        _lay(tp=8, pp=3, cp=2, dp=1, grad_accum=64, zero=1, recompute="full"),
    ),
    Case(
        "llama-3.1-8b",
        "hf/llama-3.1-8b.json",
        "llama.h100.llama3:llama31_8b_pretrain_2gpu_h100_bf16_config",
        _lay(tp=2, dp=4, grad_accum=16, zero=1),
        stack={"tp_comm_overlap": True},  # the recipe has none: one is built
    ),
    Case(
        "qwen3-8b",
        "hf/qwen3-8b.json",
        "qwen.h100.qwen3:qwen3_8b_pretrain_4gpu_h100_bf16_config",
        _lay(tp=2, pp=2, dp=2, grad_accum=32, zero=0),
    ),
    Case(
        "qwen2-7b",
        "hf/qwen2-7b.json",
        "qwen.h100.qwen2:qwen2_7b_pretrain_2gpu_h100_bf16_config",
        _lay(tp=4, dp=2, grad_accum=32, zero=1),
    ),
    Case(
        "qwen2.5-7b",
        "hf/qwen2.5-7b.json",
        "qwen.h100.qwen2:qwen25_7b_pretrain_2gpu_h100_bf16_config",
        _lay(tp=2, pp=2, dp=2, grad_accum=32, zero=1),
    ),
    Case(
        "qwen3-30b-a3b-ep",
        "qwen3-30b-a3b-config.json",
        "qwen.h100.qwen3_moe:qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config",
        _lay(tp=2, pp=2, dp=4, ep=8, grad_accum=16, zero=1),
    ),
    Case(
        "deepseek-v3-allgather",
        "deepseek-v3-config.json",
        "deepseek.h100.deepseek_v3:deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config",
        _lay(tp=2, pp=8, dp=16, ep=32, grad_accum=4, zero=1),
        stack={"moe_dispatchers": "allgather"},
    ),
    Case(  # 61 layers + MTP over 4 ranks of 2 chunks: only a pipeline layout gives the split
        "deepseek-v3-layout",
        "deepseek-v3-config.json",
        "deepseek.h100.deepseek_v3:deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config",
        _lay(tp=2, pp=4, vpp=2, dp=32, ep=32, grad_accum=2, zero=1),
    ),
    Case(  # sliding-window layers and attention sinks: autopar refuses, naming them
        "gpt-oss-20b",
        "gpt-oss-20b-config.json",
        "gpt_oss.h100.gpt_oss:gpt_oss_20b_pretrain_16gpu_h100_bf16_config",
        _lay(dp=8, ep=8, grad_accum=8, zero=1),
    ),
)
WORLD = {case.id: case.layout.num_gpus for case in CASES}
GLOBAL_BATCH = 64
SEQ_LEN = 4096


def _problem(case: Case):
    return autopar.make_problem(
        model=str(DATA / case.config),
        gpus=case.layout.num_gpus,
        seq_len=SEQ_LEN,
        global_batch=GLOBAL_BATCH,
        stack="megatron-bridge-0.6",
        **(case.stack or {}),
    )


def _item(case: Case, problem):
    """The estimate (its MoE dispatcher choice included) or, where it does not fit, the layout."""
    if case.stack:
        return autopar.evaluate_problem(problem, case.layout)
    return case.layout


@pytest.fixture(scope="session")  # module scope re-ran it when the group's modules interleave
def bridge(tmp_path_factory) -> dict[str, dict]:
    """Every case's overrides (or autopar's refusal) and what Bridge made of them."""
    cases, refused = [], {}
    for case in CASES:
        problem = _problem(case)
        try:
            overrides = bridge_args(_item(case, problem), problem)
        except InputError as error:
            refused[case.id] = str(error)
            continue
        cases.append(
            {
                "id": case.id,
                "recipe": f"{RECIPES}.{case.recipe}",
                "config": str(DATA / case.config),
                "overrides": overrides,
                "world_size": WORLD[case.id],
            }
        )
    for case in CASES:  # each file once more, as the recipe alone converts it
        recipe = {"recipe": f"{RECIPES}.{case.recipe}", "config": str(DATA / case.config)}
        cases.append({"id": f"{case.config}:recipe", **recipe, "convert_only": True})
    # one directory for the session's xdist workers (each has its own basetemp below it)
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    done_path = shared / "bridge-results.json"
    with FileLock(str(shared / "bridge-results.lock")):
        if not done_path.exists():
            (shared / "bridge-cases.json").write_text(json.dumps(cases))
            probe = Path(__file__).with_name("bridge_probe.py")
            done = subprocess.run(
                [sys.executable, str(probe), str(shared / "bridge-cases.json"), str(done_path)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done_path.read_text())
    return {"refused": refused, **results}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bridge_accepts_the_overrides_or_autopar_refuses_by_name(bridge, case):
    if case.id in bridge["refused"]:
        message = bridge["refused"][case.id]
        assert case.id == "gpt-oss-20b", message
        assert "cannot express" in message and "sliding" in message and "sinks" in message
        return
    result = bridge[case.id]
    assert result["ok"], (result.get("stage"), result.get("error"))


def _built(bridge, case) -> dict:
    result = bridge[case.id]
    assert result["ok"], (result.get("stage"), result.get("error"))
    return result["config"]


ACCEPTED = [case for case in CASES if case.id != "gpt-oss-20b"]


@pytest.mark.parametrize("case", ACCEPTED, ids=lambda c: c.id)
def test_the_job_bridge_builds_has_the_planned_layout(bridge, case):
    built, lay = _built(bridge, case), case.layout
    assert built["tensor_model_parallel_size"] == lay.tp
    assert built["pipeline_model_parallel_size"] == lay.pp
    assert built["virtual_pipeline_model_parallel_size"] == (lay.vpp if lay.vpp > 1 else None)
    assert built["context_parallel_size"] == lay.cp
    assert built["data_parallel_size"] == lay.dp
    assert built["sequence_parallel"] == lay.sequence_parallel
    assert (built["micro_batch_size"], built["global_batch_size"]) == (lay.mbs, GLOBAL_BATCH)
    # the sequence the job trains on is the planned one (dataset.seq_length, model follows)
    assert built["dataset_seq_length"] == built["seq_length"] == SEQ_LEN
    problem = _problem(case)
    if problem.model.is_moe:
        assert built["expert_model_parallel_size"] == lay.ep
    # the stages megatron-core builds from Bridge's config = the split autopar planned and
    # priced, by a pipeline layout only where no other field gives it (no recipe layout left)
    model = problem.model
    split = pipeline_split(model.num_layers, lay.pp, lay.vpp, mtp_layers=model.num_mtp_layers)
    assert built["chunk_layers"] == list(split.chunk_layers)
    assert (built["pipeline_model_parallel_layout"] is None) == (split.layout is None)
    assert built["grad_reduce_in_fp32"] == (problem.training.grad_precision == "fp32")
    assert built["use_distributed_optimizer"] == (lay.zero >= 1)
    stack = problem.training.stack
    assert built["tp_comm_overlap"] == (stack.tp_comm_overlap and lay.tp > 1)


def test_allgather_turns_off_the_recipes_shared_expert_overlap(bridge):
    """megatron-core refuses moe_shared_expert_overlap with the allgather dispatcher; the
    DeepSeek case plans allgather, so the overrides turn the overlap off and Bridge accepts."""
    case = next(c for c in CASES if c.id == "deepseek-v3-allgather")
    problem = _problem(case)
    overrides = bridge_overrides(_item(case, problem), problem)["model"]
    assert overrides["moe_token_dispatcher_type"] == "allgather"
    assert overrides["moe_shared_expert_overlap"] is False
    built = _built(bridge, case)
    assert built["moe_token_dispatcher_type"] == "allgather"
    assert built["moe_shared_expert_overlap"] is False


def test_overrides_name_the_current_release_and_keys():
    case = CASES[0]
    problem = _problem(case)
    args = bridge_args(case.layout, problem)
    assert BRIDGE_TARGET == "Megatron-Bridge 0.6.2 (megatron-core 0.19.2)"
    assert "dataset.seq_length=4096" in args
    assert not any(a.startswith("dataset.sequence_length") for a in args)
    assert all(a.startswith("++") for a in args if "comm_overlap." in a)
    assert "model.pipeline_model_parallel_layout=null" in args


# Bridge's activation callables by name (utils/activation_map.py) -> autopar's activation
BRIDGE_ACTIVATIONS = {
    "silu": "silu",
    "gelu": "gelu",
    "fast_gelu": "gelu_tanh",
    "squared_relu": "relu2",
}


def _same_model(built: dict, model) -> list[str]:
    """The fields where a Megatron config Bridge built differs from autopar's ModelSpec."""
    expected = {
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "ffn_hidden_size": model.ffn_hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "num_query_groups": model.num_kv_heads,
        "kv_channels": model.kv_channels,
        "vocab_size": model.vocab_size,
        "num_moe_experts": model.num_experts or None,
        "moe_ffn_hidden_size": model.expert_ffn_hidden_size if model.is_moe else None,
        "rotary_base": model.rope.theta,
        "add_qkv_bias": model.qkv_bias,
        "qk_layernorm": model.qk_layernorm,
        "gated_linear_unit": model.gated_mlp,
        "normalization": "LayerNorm" if model.layernorm else "RMSNorm",
        "layernorm_epsilon": model.norm_epsilon,
        "share_embeddings_and_output_weights": model.tied_embeddings,
        "activation_func": model.activation_function,
    }
    if model.is_moe:
        expected["moe_router_topk"] = model.experts_per_token
        expected["moe_router_score_function"] = model.moe_router_score_function
        expected["moe_router_enable_expert_bias"] = model.moe_router_expert_bias
    got = dict(built, activation_func=BRIDGE_ACTIVATIONS.get(built["activation_func"]))
    if got["kv_channels"] is None:  # TransformerConfig.__post_init__: hidden / heads
        got["kv_channels"] = got["hidden_size"] // got["num_attention_heads"]
    if model.is_mla:  # MLA keeps no per-group K/V: Bridge's num_query_groups is its own default
        for key in ("num_query_groups", "kv_channels"):
            expected.pop(key)
    return [f"{k}: Bridge {got[k]!r}, autopar {v!r}" for k, v in expected.items() if got[k] != v]


@pytest.mark.parametrize("case", ACCEPTED, ids=lambda c: c.id)
def test_the_model_bridge_trains_is_the_model_autopar_read(bridge, case):
    """After autopar's overrides, the Megatron config Bridge finalised describes the model autopar
    planned: shapes, RoPE base, biases, q/k norms, GLU and activation, norm and epsilon, tied
    embeddings, experts and routing."""
    assert _same_model(_built(bridge, case), _problem(case).model) == []


@pytest.mark.parametrize("config", sorted({c.config for c in ACCEPTED}))
def test_bridge_converts_each_shipped_config_as_autopar_reads_it(bridge, config):
    """Bridge's own HF -> Megatron conversion of the same config.json (the recipe alone, no
    override) agrees with autopar's reading of it (the fields Bridge converts). GPT-OSS is left
    out: autopar refuses its Bridge output (sliding layers, sinks), and Bridge gives it its own
    clamped GLU activation (swiglu_limit), which autopar reads as plain SwiGLU."""
    result = bridge[f"{config}:recipe"]
    assert result["ok"], result
    model = autopar.make_problem(model=str(DATA / config), gpus=8, global_batch=8).model
    assert _same_model(result["config"], model) == []
