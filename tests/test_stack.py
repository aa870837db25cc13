"""Training stacks as an input (issue 11): presets, the loader, per-switch overrides through the
CLI and the API, the memory reserve, and the assumptions echoed in every output."""

from __future__ import annotations

import json

import pytest

import autopar
from autopar.base.errors import InputError
from autopar.cli import app
from autopar.inputs.loading import load_model, load_stack, preset_names
from autopar.inputs.specs import GIB
from autopar.inputs.stack import DEFAULT_STACK, SWITCHES
from tests.conftest import REPO

SHIPPED = (
    "megatron-2021",
    "megatron-core-0.8",
    "megatron-lm",
    "nemo-24.07",
    "megatron-bridge-25.09",
)
LAYOUT = dict(model="llama-3-8b", gpus=16, seq_len=4096, global_batch=64, tp=2, pp=2, mbs=1)


def test_shipped_presets_load_and_are_listed(runner) -> None:
    assert set(SHIPPED) <= set(preset_names("stacks"))
    listing = runner.invoke(app, ["stacks"])
    assert listing.exit_code == 0
    for name in SHIPPED:
        assert name in listing.output
    assert f"{DEFAULT_STACK} " in listing.output and "(default)" in listing.output
    assert load_stack("mbridge").name == "megatron-bridge-25.09"  # alias


def test_default_stack_is_stated_in_readme_and_outputs(runner) -> None:
    assert f"`{DEFAULT_STACK}`" in (REPO / "README.md").read_text()
    table = runner.invoke(app, ["evaluate", "--model", "llama-3-8b", "--gpus", "8"])
    assert f"stack {DEFAULT_STACK}" in table.output
    data = json.loads(
        runner.invoke(app, ["solve", "-m", "llama-3-8b", "-n", "8", "-f", "json"]).output
    )
    assert data["inputs"]["stack"] == DEFAULT_STACK


def test_inputs_echo_the_assumptions() -> None:
    inputs = autopar.evaluate(**LAYOUT, precision="fp8", stack="nemo-24.07").to_dict()["inputs"]
    assert inputs["model"] == "llama-3-8b" and 7.9e9 < inputs["parameters"] < 8.1e9
    assert (inputs["gpus"], inputs["gpu"], inputs["seq_len"]) == (16, "h100-sxm", 4096)
    assert inputs["global_batch_sequences"] == 64
    assert (inputs["precision"], inputs["grad_precision"]) == ("fp8", "bf16")  # NeMo's grads
    assert inputs["fp8_recipe"] == "delayed" and inputs["stack"] == "nemo-24.07"


def test_unknown_stack_name_exits_2_listing_known(runner) -> None:
    result = runner.invoke(app, ["evaluate", "-m", "llama-3-8b", "-n", "8", "--stack", "nemo-99"])
    assert result.exit_code == 2
    assert "--stack" in result.output and all(name in result.output for name in SHIPPED)


def test_unknown_stack_key_exits_2_with_suggestion(runner, tmp_path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\ntp_comm_overlapp: true\n")
    result = runner.invoke(app, ["evaluate", "-m", "llama-3-8b", "-n", "8", "--stack", str(path)])
    assert result.exit_code == 2
    assert "did you mean 'tp_comm_overlap'" in result.output and str(path) in result.output


def test_stack_file_overrides_a_preset_key(tmp_path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\ntp_comm_overlap: true\nfp8_recipe: tensorwise\n")
    stack = load_stack(str(path))
    assert stack.tp_comm_overlap and stack.fp8_recipe == "current"
    assert autopar.evaluate(**LAYOUT, stack=str(path)).inputs["stack"] == "mine"


def test_every_switch_is_an_api_argument_a_cli_flag_and_a_stacks_row(runner) -> None:
    """Each switch is declared once (``autopar.inputs.stack.switch``); its flag, its API keyword,
    its YAML key and its row of ``autopar stacks`` all follow from that declaration."""
    help_text = runner.invoke(app, ["solve", "--help"], terminal_width=200).output
    table = runner.invoke(app, ["stacks"]).output.splitlines()
    for switch in SWITCHES:
        assert switch.flag in help_text, switch.flag
        autopar.make_problem(model="llama-3-8b", gpus=8, **{switch.keyword: None})
        assert any(line.startswith(switch.label + " ") for line in table), switch.label
    flag = {s.name: s.flag for s in SWITCHES}
    assert flag["grad_reduce_dtype"] == "--grad-precision"  # the keyword differs from the key
    assert flag["flash_attention"] == "--flash-attention"


def test_a_switch_value_is_checked_from_its_declaration(tmp_path) -> None:
    for key, value in (("fp8_recipe", "bogus"), ("kernel_efficiency", 9.0), ("dropout", "maybe")):
        path = tmp_path / f"{key}.yaml"
        path.write_text(f"name: mine\n{key}: {value}\n")
        with pytest.raises(InputError) as err:
            load_stack(str(path))
        assert key in str(err.value)


def test_switches_change_the_estimate() -> None:
    base = autopar.evaluate(**LAYOUT)
    overlap = autopar.evaluate(**LAYOUT, tp_comm_overlap=True)
    assert overlap.time_s["tp_comm"] < 0.5 * base.time_s["tp_comm"]
    unfused = autopar.evaluate(**LAYOUT, flash_attention=False)
    assert unfused.memory_bytes["activations"] > base.memory_bytes["activations"]
    no_dropout = autopar.evaluate(**LAYOUT, dropout=False)
    assert no_dropout.memory_bytes["activations"] < base.memory_bytes["activations"]
    exposed = autopar.evaluate(**LAYOUT, overlap_grad_reduce=False, overlap_param_gather=False)
    assert exposed.time_s["dp_comm"] > 2 * base.time_s["dp_comm"]


def test_a_switch_without_effect_is_accepted_silently() -> None:
    """CP communication type at CP 1, the FP8 recipe in BF16: same estimate, no error."""
    base = autopar.evaluate(**LAYOUT)
    for switch in (dict(cp_comm_type="a2a"), dict(fp8_recipe="blockwise")):
        assert autopar.evaluate(**LAYOUT, **switch).step_time_s == pytest.approx(base.step_time_s)


def test_memory_reserve_lowers_capacity_and_is_shown(runner) -> None:
    base = autopar.evaluate(**LAYOUT)
    kept = autopar.evaluate(**LAYOUT, memory_reserve_gib=6)
    assert base.capacity_bytes - kept.capacity_bytes == pytest.approx(6 * GIB, abs=1)
    argv = ["evaluate", "-m", "llama-3-8b", "-n", "8", "--memory-reserve-gib", "6"]
    assert "(after 6.00 GiB kept free, --memory-reserve-gib)" in runner.invoke(app, argv).output


@pytest.mark.parametrize("value", ["-1", "80", "1e9"])
def test_memory_reserve_out_of_range_exits_2(runner, value) -> None:
    argv = ["evaluate", "-m", "llama-3-8b", "-n", "8", "--memory-reserve-gib", value]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert "--memory-reserve-gib" in result.output and "Traceback" not in result.output


def test_bad_switch_values_are_input_errors() -> None:
    for switch in (dict(fp8_recipe="nvfp4"), dict(cp_comm_type="ring"), dict(fp8_gemms="qkv,xyz")):
        with pytest.raises(InputError):
            autopar.make_problem(model="llama-3-8b", gpus=8, **switch)


@pytest.mark.parametrize("name", ["llama-3-70b", "gpt3-175b", "mixtral-8x7b", "qwen3-30b-a3b"])
def test_echoed_parameter_count_matches_the_cost_model_shapes(name) -> None:
    from autopar.inputs.echo import parameter_count
    from cost_models.shapes import dense_block_params, expert_params

    model = load_model(name)
    embedding = model.vocab_size * model.hidden_size * (1 if model.tied_embeddings else 2)
    positions = model.max_position_embeddings * model.hidden_size
    positions *= int(model.learned_position_embeddings)
    experts = model.num_moe_layers * expert_params(model)
    assert parameter_count(model) == dense_block_params(model) + experts + embedding + positions


def test_bf16_optimizer_states_take_two_thirds_and_reach_megatron() -> None:
    """``optimizer_state_dtype: bf16``: FP32 master weights + BF16 Adam moments, 8 of 12 bytes
    per parameter; the Megatron output asks for them (arguments.py L3667-3684)."""
    from autopar.api import evaluate_problem, layout_of, make_problem
    from autopar.outputs.emit import megatron_args

    options = dict(model="qwen3-30b-a3b", gpus=16, global_batch=64)
    fp32, bf16 = (make_problem(**options, optimizer_state_dtype=d) for d in ("fp32", "bf16"))
    layout = layout_of(fp32, ep=8)
    a, b = (evaluate_problem(p, layout) for p in (fp32, bf16))
    assert b.memory_bytes["optimizer"] == pytest.approx(a.memory_bytes["optimizer"] * 8 / 12)
    assert b.step_time_s == pytest.approx(a.step_time_s)
    flags = megatron_args(b, bf16)
    assert "--use-precision-aware-optimizer" in flags and "--exp-avg-sq-dtype bf16" in flags
    assert "--use-precision-aware-optimizer" not in megatron_args(a, fp32)


def test_kernel_efficiency_slows_only_the_kernels() -> None:
    """A stack whose kernels reach 0.85 of the GPU's efficiency stretches compute, not
    communication; the 2024 presets carry it, the current ones do not."""
    base = autopar.evaluate(**LAYOUT)
    older = autopar.evaluate(**LAYOUT, kernel_efficiency=0.85)
    assert older.time_s["compute"] > 1.05 * base.time_s["compute"]
    assert older.time_s["compute"] < base.time_s["compute"] / 0.85 + 1e-9
    assert older.time_s["dp_comm"] == pytest.approx(base.time_s["dp_comm"])
    assert load_stack("nemo-24.07").kernel_efficiency < 1.0
    assert load_stack("megatron-bridge-25.09").kernel_efficiency == 1.0


@pytest.mark.parametrize("value", ["0", "-0.5", "2", "nan"])
def test_kernel_efficiency_out_of_range_exits_2(runner, value) -> None:
    argv = ["evaluate", "-m", "llama-3-8b", "-n", "8", "--kernel-efficiency", value]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "kernel" in result.output and "Traceback" not in result.output
