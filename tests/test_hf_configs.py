"""Real Hugging Face configs (tests/data/hf/, sources in SOURCES.md) load as the model their
modeling code builds, or are refused naming the key; the Megatron-LM arguments carry what was
read (checked with Megatron-LM's parser and megatron-core's TransformerConfig)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import autopar
from autopar.base.errors import InputError
from autopar.inputs import hf_keys
from autopar.inputs.loading import load_model
from autopar.layout.plan import Layout
from autopar.outputs import emit
from tests import consumers

TORCH = pytest.mark.xdist_group("torch")  # Megatron-LM parses: one worker imports torch

HF = Path(__file__).parent / "data" / "hf"

# file -> facts its modeling code fixes (transformers models/<family>/modeling_*.py), by field
FACTS: dict[str, dict[str, object]] = {
    "llama-3.1-8b": {"rope.theta": 500000.0, "rope.scaling": "llama3", "rope.factor": 8.0},
    "qwen2-7b": {"qkv_bias": True, "qk_layernorm": False, "rope.theta": 1e6, "layer_types": ()},
    "qwen2.5-7b": {"qkv_bias": True, "norm_epsilon": 1e-6},
    "qwen3-8b": {"qk_layernorm": True, "qkv_bias": False, "kv_channels": 128},
    "qwen1.5-moe-a2.7b": {
        "shared_expert_gate": True,
        "moe_router_pre_softmax": True,
        "shared_expert_ffn_hidden_size": 5632,
        "qkv_bias": True,
    },
    "phi-3-mini-4k-instruct": {"attention_window": 2047},
    "mistral-7b-v0.1": {"attention_window": 4096},
    "gemma-2-27b": {
        "mlp_kind": "geglu",
        "activation": "gelu_tanh",
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "query_pre_attn_scalar": 144.0,
        "gemma_norms": True,
        "attention_window": 4096,
        "kv_channels": 128,
    },
    "gemma-3-1b-pt": {"qk_layernorm": True, "rope.local_theta": 10000.0, "attention_window": 512},
    "gpt2": {
        "learned_position_embeddings": True,
        "layernorm": True,
        "linear_bias": True,
        "tied_embeddings": True,
        "activation": "gelu_tanh",
    },
    "deepseek-v3": {
        "rope.scaling": "yarn",
        "rope.factor": 40.0,
        "rope.mscale_all_dim": 1.0,
        "moe_router_score_function": "sigmoid",
        "moe_router_expert_bias": True,
        "moe_router_topk_scaling_factor": 2.5,
        "moe_router_load_balancing": "seq_aux_loss",
    },
    "kimi-k2-instruct": {"rope.theta": 50000.0, "rope.beta_fast": 1.0, "num_experts": 384},
}


def _value(model, path: str):
    value = model
    for part in path.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize("name", sorted(FACTS))
def test_real_config_loads_as_its_modeling_code_builds(name):
    model = load_model(str(HF / f"{name}.json"))
    for path, expected in FACTS[name].items():
        got = _value(model, path)
        if path == "layer_types":
            assert got == expected
        elif path == "attention_window":
            assert got == expected and "sliding" in model.layer_kinds[0] + model.layer_kinds[-1]
        else:
            assert got == expected, (path, got)


def test_gemma2_slides_on_even_layers_only():
    model = load_model(str(HF / "gemma-2-27b.json"))
    assert [k.split("/")[0] for k in model.layer_kinds[:4]] == ["sliding", "attention"] * 2


def test_every_shipped_config_is_in_the_table():
    for path in sorted(HF.glob("*.json")):
        assert json.loads(path.read_text())["model_type"] in hf_keys.FAMILIES


def _write(tmp_path: Path, name: str, **changes) -> str:
    data = json.loads((HF / f"{name}.json").read_text()) | changes
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize(
    ("name", "changes", "field"),
    [
        ("llama-3.1-8b", {"some_new_attention_knob": 1}, "some_new_attention_knob"),
        ("llama-3.1-8b", {"rope_theta": -5.0}, "rope_theta"),
        ("llama-3.1-8b", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling"),
        ("gemma-2-27b", {"attn_logit_softcapping": 0.0}, "attn_logit_softcapping"),
        ("gemma-2-27b", {"final_logit_softcapping": -1.0}, "final_logit_softcapping"),
        ("llama-3.1-8b", {"model_type": "falcon"}, "model_type"),
        ("qwen2-7b", {"use_mrope": True}, "use_mrope"),
        ("llama-3.1-8b", {"attention_bias": True}, "attention_bias"),
    ],
)
def test_unmodelled_or_out_of_range_key_is_refused_by_name(tmp_path, name, changes, field):
    path = _write(tmp_path, name, **changes)
    with pytest.raises(InputError) as error:
        load_model(path)
    assert error.value.field == field and error.value.source == path
    if field == "model_type":
        assert hf_keys.SUPPORTED in str(error.value)


def _megatron(name: str) -> tuple[dict, object]:
    problem = autopar.make_problem(model=str(HF / f"{name}.json"), gpus=8, global_batch=8)
    line = emit.megatron_args(Layout(tp=1, pp=1, dp=8, grad_accum=1), problem)
    return consumers.megatron_parse(line), consumers.megatron_transformer_config(line)


@TORCH
def test_megatron_carries_rope_base_and_llama3_scaling():
    flags, config = _megatron("llama-3.1-8b")
    assert flags["--rotary-base"] == ["500000"] and flags["--rope-scaling-factor"] == ["8.0"]
    assert "--use-rope-scaling" in flags and config.layernorm_epsilon == 1e-5


@TORCH
def test_megatron_carries_qwen_biases_norms_and_gate():
    flags, config = _megatron("qwen2-7b")
    assert (
        config.add_qkv_bias and not config.add_bias_linear and flags["--rotary-base"] == ["1000000"]
    )
    _, config = _megatron("qwen3-8b")
    assert config.qk_layernorm and config.kv_channels == 128
    _, config = _megatron("qwen1.5-moe-a2.7b")
    assert config.moe_shared_expert_gate and config.moe_router_pre_softmax


@TORCH
def test_megatron_carries_deepseek_v3_routing_and_yarn():
    flags, config = _megatron("deepseek-v3")
    assert config.moe_router_score_function == "sigmoid" and config.moe_router_enable_expert_bias
    assert config.moe_router_topk_scaling_factor == 2.5
    assert flags["--moe-router-load-balancing-type"] == ["seq_aux_loss"]
    assert (config.rotary_scaling_factor, config.mscale, config.mscale_all_dim) == (40.0, 1.0, 1.0)


@TORCH
@pytest.mark.parametrize(
    ("name", "named"),
    [
        ("gemma-2-27b", "geglu"),
        ("gpt2", "gelu_tanh"),
        ("kimi-k2-instruct", "beta_fast"),
        ("phi-3-mini-4k-instruct", "sliding"),
        ("mistral-7b-v0.1", "sliding"),
    ],
)
def test_megatron_refuses_what_it_cannot_say(name, named):
    with pytest.raises(InputError) as error:
        _megatron(name)
    assert "cannot express" in str(error.value) and named in str(error.value)


@pytest.mark.parametrize("family", sorted(set(hf_keys.FAMILIES) - {"nemotron_h"}))
def test_a_familys_row_says_whether_its_mlp_is_gated(family):
    """SiLU makes a gated family's MLP SwiGLU; a family whose row is not gated refuses it (an
    ungated SiLU MLP is not modelled) and reads GELU as GELU."""
    from autopar.inputs.hf_details import activation_of

    silu = {"model_type": family, "hidden_act": "silu"}
    if hf_keys.FAMILIES[family].gated_mlp:
        assert activation_of(silu, family) == ("swiglu", "silu")
        assert activation_of({**silu, "hidden_act": "gelu_pytorch_tanh"}, family)[0] == "geglu"
    else:
        with pytest.raises(InputError, match="ungated MLP with silu"):
            activation_of(silu, family)
        assert activation_of({**silu, "hidden_act": "gelu"}, family) == ("gelu", "gelu")


@pytest.mark.parametrize("written", [{}, {"mlp_kind": "swiglu"}], ids=["key", "beside"])
def test_the_activation_key_is_read_once(written, monkeypatch):
    """A family's activation key gives mlp_kind and activation in one reading, and one reading
    checks an autopar mlp_kind written beside it (a preset)."""
    from autopar.inputs import hf_config, hf_details

    calls = []
    read = hf_details.activation_of
    monkeypatch.setattr(hf_details, "activation_of", lambda *a: calls.append(a) or read(*a))
    data = {**json.loads((HF / "llama-3.1-8b.json").read_text()), **written}
    model = hf_config.model_from_mapping(data, name="llama")
    assert len(calls) == 1
    assert (model.mlp_kind, model.activation) == ("swiglu", "silu")
