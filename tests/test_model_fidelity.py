"""Emitted model == input model (issue 21), for every public ``config.json`` the repository
ships: the Megatron-LM arguments give, through Megatron-LM's own parser and config builder
(``tests/consumers.py`` ``megatron_lm_config``: megatron-core 0.19.2's
``megatron/training/arguments.py``), the architecture autopar read; so does the model torchtitan
0.3 builds from its arguments, where torchtitan has a config for it. A format that cannot carry
the model refuses, naming what. (Megatron-Bridge: ``tests/test_bridge.py``, with Bridge's own
recipes and HF conversion.)
"""

from __future__ import annotations

import pytest

import autopar
from autopar.base.errors import InputError
from autopar.layout.plan import Layout
from autopar.outputs import emit
from tests import consumers
from tests.conftest import DATA

pytestmark = pytest.mark.xdist_group("torch")  # one worker imports torch (tests/conftest.py)

PUBLIC = sorted(
    str(path.relative_to(DATA)) for path in [*DATA.glob("*-config.json"), *DATA.glob("hf/*.json")]
)
GPUS = 8
LAYOUT = Layout(tp=1, pp=1, dp=GPUS, grad_accum=1)
ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "squared_relu": "relu2"}


def _problem(config: str):
    return autopar.make_problem(model=str(DATA / config), gpus=GPUS, global_batch=GPUS)


def _megatron_fields(args, config) -> dict:
    """The architecture in ModelSpec terms, read off Megatron-LM's args and TransformerConfig."""
    activation = ACTIVATIONS.get(getattr(config.activation_func, "__name__", ""), "other")
    out = {
        "num_layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "ffn_hidden_size": config.ffn_hidden_size,
        "num_experts": config.num_moe_experts or 0,
        "rope_theta": float(args.rotary_base),
        "qkv_bias": config.add_qkv_bias,
        "linear_bias": config.add_bias_linear,
        "gated_mlp": config.gated_linear_unit,
        "activation": activation,
        "layernorm": config.normalization == "LayerNorm",
        "norm_epsilon": config.layernorm_epsilon,
        "tied_embeddings": not args.untie_embeddings_and_output_weights,
        "qk_layernorm": config.qk_layernorm,
        "learned_position_embeddings": args.position_embedding_type == "learned_absolute",
    }
    if not config.multi_latent_attention:
        out |= {"num_kv_heads": config.num_query_groups, "kv_channels": config.kv_channels}
    if config.num_moe_experts:
        out |= {
            "experts_per_token": config.moe_router_topk,
            "expert_ffn_hidden_size": config.moe_ffn_hidden_size,
            "moe_router_score_function": config.moe_router_score_function,
            "moe_router_expert_bias": config.moe_router_enable_expert_bias,
        }
    return out


def _spec_fields(model, keys) -> dict:
    values = {key: getattr(model, key, None) for key in keys}
    values["rope_theta"] = model.rope.theta
    values["activation"] = model.activation_function
    return {key: values[key] for key in keys}


@pytest.mark.parametrize("config", PUBLIC)
def test_megatron_lm_builds_the_model_autopar_read(config):
    problem = _problem(config)
    try:
        line = emit.megatron_args(LAYOUT, problem)
    except InputError as error:  # the format cannot carry it: it says what
        assert "--format megatron: cannot express" in str(error), error
        return
    args, built = consumers.megatron_lm_config(line, GPUS)
    got = _megatron_fields(args, built)
    assert got == _spec_fields(problem.model, got), config


TORCHTITAN = [c for c in PUBLIC if (m := emit.torchtitan.torchtitan_model(_problem(c).model))]


@pytest.mark.parametrize("config", TORCHTITAN)
def test_torchtitan_builds_the_model_autopar_read(config):
    problem = autopar.make_problem(
        model=str(DATA / config), gpus=GPUS, global_batch=GPUS, framework="torchtitan"
    )
    known = emit.torchtitan.torchtitan_model(problem.model)
    lay = Layout(tp=1, pp=1, dp=GPUS, grad_accum=1, zero=3)
    if known.refuse_03:
        with pytest.raises(InputError, match="--format torchtitan: cannot express"):
            emit.torchtitan_args(lay, problem)
        return
    parsed = consumers.torchtitan_parse(emit.torchtitan_args(lay, problem))
    built = consumers.torchtitan_architecture(parsed.model_spec.model)
    ours = dict(
        zip(emit.torchtitan.ARCH_FIELDS, emit.torchtitan.architecture(problem.model), strict=True)
    )
    assert built == ours


def test_every_family_of_the_shipped_configs_is_checked():
    """The public files cover the presets' families plus Gemma-2/3, Qwen2/2.5, Phi-3, Mistral,
    GPT-2 (issue 21), and torchtitan's configs match some of them."""
    assert len(PUBLIC) >= 20 and len(TORCHTITAN) >= 3
