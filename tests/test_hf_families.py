"""MoE / MLA / hybrid families load from their Hugging Face configs (issue 12)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from autopar.base.errors import InputError
from autopar.cli import app
from autopar.inputs.loading import load_model
from cost_models.shapes import active_params, total_params
from tests.conftest import DATA

FAMILY_CONFIGS = [
    "deepseek-v3",
    "kimi-k2",
    "gpt-oss-120b",
    "gpt-oss-20b",
    "llama-4-maverick",
    "llama-4-scout",
    "nemotron-h-56b",
    "nemotron-3-nano",
]


@pytest.mark.parametrize("name", FAMILY_CONFIGS)
def test_config_json_loads_to_the_preset(name: str) -> None:
    from_config = load_model(str(DATA / f"{name}-config.json"))
    preset = load_model(name)
    assert dataclasses.replace(from_config, name="x") == dataclasses.replace(preset, name="x")


@pytest.mark.parametrize(
    ("name", "mtp", "published"),
    [
        # DeepSeek-V3 README: 671B main model, 685B with the MTP module (which shares the
        # 0.9B embedding and 0.9B output head that the 685B counts twice: README_WEIGHTS.md).
        ("deepseek-v3", False, 671e9),
        ("deepseek-v3", True, 685e9),
        ("gpt-oss-120b", True, 117e9),  # OpenAI gpt-oss model card: 116.8B
        ("gpt-oss-20b", True, 21e9),  # 20.9B
        ("llama-4-maverick", True, 400e9),  # Meta model card
        ("nemotron-h-56b", True, 56e9),  # Nemotron-H report (arXiv 2504.03624)
        ("nemotron-3-nano", True, 31.6e9),  # NVIDIA model card: 31.6B total
    ],
)
def test_parameter_count_matches_the_published_total(name, mtp, published) -> None:
    assert total_params(load_model(name), mtp=mtp) == pytest.approx(published, rel=0.01)


def test_active_parameters_of_deepseek_v3() -> None:
    # DeepSeek-V3 report: 37B activated per token.
    assert active_params(load_model("deepseek-v3")) == pytest.approx(37e9, rel=0.02)


def test_layer_structures() -> None:
    ds = load_model("deepseek-v3")
    assert ds.layer_kinds[:4] == ("mla/dense",) * 3 + ("mla/moe",)
    assert (ds.num_moe_layers, ds.num_mtp_layers, ds.mtp_layer_kind) == (58, 1, "mla/moe")
    oss = load_model("gpt-oss-120b")
    assert oss.layer_kinds[:2] == ("sliding/moe", "attention/moe") and oss.attention_window == 128
    maverick = load_model("llama-4-maverick")
    assert maverick.layer_kinds[:4] == (
        "sliding/dense",
        "sliding/moe",
        "sliding/dense",
        "attention/moe",
    )
    assert (maverick.ffn_hidden_size, maverick.expert_ffn_hidden_size) == (16384, 8192)
    nemo = load_model("nemotron-h-56b")
    counts = {k: nemo.layer_kinds.count(k) for k in set(nemo.layer_kinds)}
    assert counts == {"mamba/none": 54, "attention/none": 10, "none/dense": 54}
    assert nemo.mlp_kind == "squared_relu" and not nemo.is_moe


def _config(tmp_path, name: str, **changes) -> str:
    data = json.loads((DATA / f"{name}-config.json").read_text())
    target = data.get("text_config", data)
    for key, value in changes.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return str(path)


BAD = [
    ("deepseek-v3", {"num_experts_per_tok": 300}, "num_experts_per_tok", "1..n_routed_experts"),
    ("deepseek-v3", {"first_k_dense_replace": 62}, "first_k_dense_replace", "num_hidden_layers"),
    ("deepseek-v3", {"qk_rope_head_dim": None}, "qk_rope_head_dim", "kv_lora_rank"),
    ("deepseek-v3", {"topk_group": 9}, "topk_group", "n_group"),
    ("nemotron-h-56b", {"num_hidden_layers": 117}, "hybrid_override_pattern", "117"),
    ("nemotron-3-nano", {"num_experts_per_tok": 129}, "num_experts_per_tok", "n_routed_experts"),
    ("gpt-oss-120b", {"num_hidden_layers": 35}, "layer_types", "one type per layer"),
    ("gpt-oss-120b", {"experts_per_token": 3}, "experts_per_token", "num_experts_per_tok"),
    ("llama-4-maverick", {"interleave_moe_layer_step": 0}, "interleave_moe_layer_step", "at least"),
]


@pytest.mark.parametrize(("name", "changes", "key", "rule"), BAD)
def test_inconsistent_family_fields_exit_2(tmp_path, runner, name, changes, key, rule) -> None:
    path = _config(tmp_path, name, **changes)
    with pytest.raises(InputError) as err:
        load_model(path)
    assert err.value.field == key and rule in err.value.rule and err.value.source == path
    result = runner.invoke(app, ["evaluate", "--model", path, "--gpus", "8", "--tp", "8"])
    assert result.exit_code == 2
    assert path in result.output and key in result.output


def test_mla_key_in_another_family_is_refused_without_a_rename_hint(tmp_path) -> None:
    """The DeepSeek-V3 report's keys on a llama config: refused naming the family, never "did
    you mean head_dim" (that rename loaded DeepSeek-V3 as a dense model)."""
    path = _config(tmp_path, "deepseek-v3", model_type="llama")
    with pytest.raises(InputError) as err:
        load_model(path)
    assert "deepseek_v3" in err.value.rule and "did you mean" not in str(err.value)
    yaml_path = tmp_path / "m.yaml"
    yaml_path.write_text(
        "num_hidden_layers: 4\nhidden_size: 256\nnum_attention_heads: 8\nvocab_size: 1000\n"
        "v_head_dim: 32\n"
    )
    with pytest.raises(InputError) as err:
        load_model(str(yaml_path))
    assert err.value.field == "v_head_dim" and "head_dim'" not in str(err.value)
