"""Presets and input files load to frozen specs (issue 2)."""

from __future__ import annotations

import dataclasses

import pytest

from autopar.errors import InputError
from autopar.loading import load_cluster, load_gpu, load_model, preset_names
from autopar.specs import GIB
from tests.conftest import DATA


def _same_model(a, b) -> bool:
    return dataclasses.replace(a, name="x") == dataclasses.replace(b, name="x")


@pytest.mark.parametrize(
    ("config", "preset"),
    [
        ("llama-3-70b-config.json", "llama-3-70b"),
        ("mixtral-8x7b-config.json", "mixtral-8x7b"),
        ("qwen3-30b-a3b-config.json", "qwen3-30b-a3b"),
    ],
)
def test_hugging_face_config_loads_to_the_preset_spec(config: str, preset: str) -> None:
    assert _same_model(load_model(str(DATA / config)), load_model(preset))


def test_llama_70b_alias_is_llama_3_70b() -> None:
    model = load_model("llama-70b")
    assert model.name == "llama-3-70b"
    assert (model.num_layers, model.hidden_size, model.num_kv_heads) == (80, 8192, 8)
    assert model.mlp_kind == "swiglu" and not model.tied_embeddings


def test_every_preset_loads() -> None:
    required = {
        "llama-2-7b",
        "llama-3.1-405b",
        "gpt3-175b",
        "megatron-gpt-1t",
        "mixtral-8x22b",
        "qwen3-235b-a22b",
        "nemotron-4-340b",
    }
    names = set(preset_names("models"))
    assert required <= names
    for name in names:
        load_model(name)
    for name in ("a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200", "gb200-nvl72", "mi300x"):
        gpu = load_gpu(name)
        assert gpu.memory_bytes > 30 * GIB and gpu.peak_bf16_flop_per_s > 1e14


def test_moe_and_gpt_fields() -> None:
    mixtral = load_model("mixtral-8x7b")
    assert (mixtral.num_experts, mixtral.experts_per_token) == (8, 2)
    gpt3 = load_model("gpt3-175b")
    assert gpt3.mlp_kind == "gelu" and gpt3.learned_position_embeddings and gpt3.tied_embeddings
    assert load_model("nemotron-4-340b").mlp_kind == "squared_relu"
    assert load_gpu("gb200-nvl72").gpus_per_node == 72


def test_cluster_file_overrides_gpu_values(tmp_path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("gpu: h100\nnic_gb_per_s: 25\ngpus_per_node: 4\n")
    cluster = load_cluster(cluster_file=str(path))
    assert cluster.gpu.nic_bytes_per_s == 25e9 and cluster.gpus_per_node == 4
    assert cluster.gpu.peak_bf16_flop_per_s == load_gpu("h100").peak_bf16_flop_per_s


def test_unknown_key_suggests_the_known_one(tmp_path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        "num_hidden_layers: 2\nhiden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\n"
    )
    with pytest.raises(InputError, match="did you mean 'hidden_size'"):
        load_model(str(path))


def test_specs_are_frozen() -> None:
    model = load_model("llama-8b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.num_layers = 3  # type: ignore[misc]
