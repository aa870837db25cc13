"""Presets and input files load to frozen specs (issue 2)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from autopar.base.errors import InputError
from autopar.inputs.loading import load_cluster, load_gpu, load_model, preset_names
from autopar.inputs.specs import GIB
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


@pytest.mark.parametrize(
    ("megatron", "hf"),
    [("num_layers", "num_hidden_layers"), ("ffn_hidden_size", "intermediate_size")],
)
def test_a_megatron_name_suggests_the_key_autopar_reads(tmp_path, megatron, hf) -> None:
    """``num_layers`` is closer to GPT-2's ``n_layer`` by spelling; a Megatron user meant
    ``num_hidden_layers``."""
    path = tmp_path / "m.yaml"
    path.write_text(f"{megatron}: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\n")
    with pytest.raises(InputError, match=f"did you mean '{hf}' \\(Megatron's --"):
        load_model(str(path))


def test_specs_are_frozen() -> None:
    model = load_model("llama-8b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.num_layers = 3  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# hostile files (issue 15): every one an InputError naming the file, quickly, never executed

TINY = "num_hidden_layers: 4\nhidden_size: 256\nnum_attention_heads: 8\nvocab_size: 1000\n"


def _write(tmp_path, text: str | bytes, name: str = "m.yaml") -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def _bomb(levels: int) -> str:
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nnum_hidden_layers: *l{levels - 1}\n"


def test_yaml_alias_bomb_is_refused_quickly_with_a_short_message(tmp_path) -> None:
    """ "Billion laughs": 9 levels of 9 aliases, < 1 KB, 9**9 values once expanded. Before:
    a hang while the error message formatted the value (a 72 MB line at 7 levels)."""
    path = _write(tmp_path, TINY + _bomb(9))
    start = time.perf_counter()
    with pytest.raises(InputError, match="expands to more than") as err:
        load_model(path)
    assert time.perf_counter() - start < 1.0 and len(str(err.value)) < 300
    # 6561 values: loads (a downloaded HF config may carry keys autopar does not read), and the
    # message names the key without printing the value
    hf = "architectures: [LlamaForCausalLM]\nhidden_size: 256\nnum_attention_heads: 8\n"
    smaller = _write(tmp_path, _bomb(4) + hf + "vocab_size: 1000\n", "s.yaml")
    with pytest.raises(InputError, match="num_hidden_layers: must be an integer") as err:
        load_model(smaller)
    assert len(str(err.value)) < 300


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_nesting_100k_deep_is_an_input_error(tmp_path, suffix) -> None:
    path = _write(tmp_path, "[" * 100_000 + "]" * 100_000, "deep" + suffix)
    with pytest.raises(InputError, match="deep"):
        load_model(path)
    nested = '{"a": ' * 100_000 + "1" + "}" * 100_000
    with pytest.raises(InputError, match="nested deeper"):
        load_model(_write(tmp_path, nested, "obj.json"))


def test_python_tags_are_never_executed(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for tag in (
        "!!python/object/apply:os.system ['touch pwned']",
        "!!python/object/new:os.system ['touch pwned']",
        "!!python/name:os.system",
    ):
        with pytest.raises(InputError, match="constructor for the tag"):
            load_model(_write(tmp_path, TINY + f"name: {tag}\n"))
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (TINY + "1: 2\n", "keys must be strings"),
        (TINY.replace("vocab_size: 1000", "vocab_size: " + "9" * 5000), "4300 digits"),
        (TINY + "hidden_act: [1]\n", "hidden_act: must be a string"),
        (TINY + "model_type: {a: 1}\n", "model_type: must be a string"),
        (TINY.replace("num_attention_heads: 8", "num_attention_heads: 0") + "head_dim: 64\n",
         "num_attention_heads: must be a positive integer"),
        (TINY.replace("hidden_size: 256", "hidden_size: .nan"), "hidden_size: must be an integer"),
        (TINY.replace("hidden_size: 256", "hidden_size: 1e300"), "hidden_size: must be a positive"),
        (TINY.replace("num_hidden_layers", "n_layer").replace("4\n", "0\n", 1), "n_layer:"),
        (TINY + "name: " + "x" * 100_000 + "\n", None),
    ],
)  # fmt: skip
def test_hostile_model_values_name_the_key_as_written(tmp_path, text, fragment) -> None:
    path = _write(tmp_path, text)
    if fragment is None:  # a long name is cut for reports, not an error
        assert len(load_model(path).name) <= 200
        return
    with pytest.raises(InputError) as err:
        load_model(path)
    assert fragment in str(err.value) and str(err.value).startswith(path)
    assert len(str(err.value)) < 500


@pytest.mark.parametrize("value", [".nan", ".inf", "-1", "0", "1e30", "'80'", "[80]"])
def test_gpu_numbers_are_finite_positive_and_bounded(tmp_path, value) -> None:
    text = (DATA.parent.parent / "autopar" / "presets" / "gpus" / "h100-sxm.yaml").read_text()
    path = _write(tmp_path, text.replace("memory_gib: 79.6", f"memory_gib: {value}"), "g.yaml")
    with pytest.raises(InputError, match="memory_gib"):
        load_gpu(path)


@pytest.mark.parametrize(
    "content",
    [b"\x00\x01\x02binary", "\u00e9t\u00e9: 1\n".encode("latin-1"), b"x: 1\n" * 300_000],
)
def test_binary_non_utf8_and_oversized_files_are_input_errors(tmp_path, content) -> None:
    with pytest.raises(InputError, match="binary|UTF-8|larger than"):
        load_model(_write(tmp_path, content))


def test_names_the_os_refuses_are_input_errors(tmp_path) -> None:
    for name in ("m" * 5000, "m" * 5000 + ".yaml", "a\x00b.yaml", str(tmp_path), "/dev/zero"):
        with pytest.raises(InputError):
            load_model(name)
        with pytest.raises(InputError):
            load_gpu(name)
    with pytest.raises(InputError, match="empty"):
        load_gpu("")


def test_flags_given_empty_or_zero_are_errors_not_defaults() -> None:
    with pytest.raises(InputError, match="--gpus-per-node"):
        load_cluster(gpu="h100", gpus_per_node=0)
    with pytest.raises(InputError, match="--gpu: must name a preset"):
        load_cluster(gpu="")
    with pytest.raises(InputError, match="--comm-profile"):
        load_cluster(comm_profile="")


def test_yaml_reads_exponents_without_a_dot_as_numbers(tmp_path) -> None:
    """YAML 1.1 reads ``1e3`` as a string; JSON and YAML 1.2 as a number."""
    model = load_model(_write(tmp_path, TINY.replace("vocab_size: 1000", "vocab_size: 1e3")))
    assert model.vocab_size == 1000
