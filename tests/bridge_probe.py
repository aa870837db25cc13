"""Megatron-Bridge 0.6.2 itself on autopar's overrides: one process, every case (run by
``tests/test_bridge.py``; ``python tests/bridge_probe.py CASES.json RESULTS.json``).

Importing Megatron-Bridge as a whole costs about 17 CPU-seconds (its package ``__init__`` files
import every model family's bridge and every recipe, and Megatron-LM's ``megatron.training``
imports its training loop and nvidia-modelopt), so the cases are batched into one process per
test session, which skips those ``__init__`` files (``tests/package_init.py``): it imports the
recipes it runs and the bridges registered for the architectures of their ``config.json``
files (about 12 CPU-seconds; the results are the same as with the whole package imported).
Each case is what a user does with autopar's output (``scripts/training/run_recipe.py:483-523``
at the v0.6 tag):

1. the recipe function builds its ``ConfigContainer``; its model comes from Hugging Face
   (``AutoBridge.from_hf_pretrained(ID).to_megatron_provider(load_weights=False)``): the probe
   lays the repository's own ``config.json`` into an offline Hugging Face cache under the ID the
   recipe asks for, so Bridge's HF -> Megatron conversion reads exactly the file autopar read;
2. ``apply_cli_overrides`` = ``omegaconf_utils.process_config_with_overrides`` (Hydra's override
   parser on the struct config) with autopar's overrides;
3. ``sync_model_pipeline_layout`` (a recipe's layout builder re-runs after a PP/VPP override
   unless the layout itself is overridden), ``sync_model_dataset_sequence_length``;
4. ``runtime_config_update`` with ``WORLD_SIZE`` set, as the runner's dry run does: it finalises
   the model config (``TransformerConfig.__post_init__``), the DDP and optimizer configs, and
   runs ``ConfigContainer.validate``.

Steps 3 and 4's helpers live in the repository's ``scripts/training/recipe_runner.py``, which the
wheel does not ship; they are restated here line for line (``_sync_layout``, ``_sync_seq``).
The result of each case: the error if any step raised, else the model and layout as Bridge holds
them (``MODEL_FIELDS``, ``LAYOUT_FIELDS``) and the decoder layers of every virtual stage as
megatron-core builds them from that config (``consumers.megatron_chunk_layers``).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import sys
import tempfile
import traceback
from pathlib import Path

MODEL_FIELDS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "vocab_size",
    "num_moe_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "rotary_base",
    "rotary_percent",
    "position_embedding_type",
    "add_bias_linear",
    "add_qkv_bias",
    "qk_layernorm",
    "gated_linear_unit",
    "normalization",
    "layernorm_epsilon",
    "share_embeddings_and_output_weights",
    "multi_latent_attention",
    "mtp_num_layers",
    "moe_router_score_function",
    "moe_router_enable_expert_bias",
    "moe_router_topk_scaling_factor",
    "moe_router_pre_softmax",
    "hidden_dropout",
    "attention_dropout",
    "seq_length",
)
LAYOUT_FIELDS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "sequence_parallel",
    "pipeline_model_parallel_layout",
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "recompute_granularity",
    "moe_token_dispatcher_type",
    "moe_shared_expert_overlap",
)


def _hf_cache(root: Path, repo_id: str, config: dict, revisions: list[str]) -> None:
    """``config`` as the offline Hugging Face cache holds ``repo_id``'s ``config.json``, at the
    main ref and at each pinned revision a recipe may ask for."""
    base = root / "hub" / ("models--" + repo_id.replace("/", "--"))
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text("0" * 40)
    for revision in ["0" * 40, *revisions]:
        snapshot = base / "snapshots" / revision
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps(config))


def _recipe(name: str):
    module, function = name.split(":")
    import importlib

    return getattr(importlib.import_module(module), function)


def _hf_ids(function) -> tuple[list[str], list[str]]:
    """The Hugging Face IDs and pinned revisions a recipe's module names (literally in
    ``from_hf_pretrained("org/name")`` or as ``_..._MODEL_ID`` / ``_..._REVISION`` constants)."""
    source = inspect.getsource(inspect.getmodule(function))
    ids = re.findall(r'from_hf_pretrained\(\s*"([^"]+)"', source)
    ids += re.findall(r'_MODEL_ID\s*=\s*"([^"]+)"', source)
    revisions = re.findall(r'_REVISION\s*=\s*"([0-9a-f]{40})"', source)
    return sorted(set(ids)), sorted(set(revisions))


def _sync_layout(config, overrides: list[str]):
    """recipe_runner.py sync_model_pipeline_layout (v0.6)."""
    fields = {override.lstrip("+~").split("=", 1)[0] for override in overrides}
    topology = {"model.pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size"}
    if not fields & topology or "model.pipeline_model_parallel_layout" in fields:
        return config
    builder = getattr(config.model, "_pipeline_model_parallel_layout_builder", None)
    if builder is not None:
        config.model.pipeline_model_parallel_layout = builder(
            config.model.pipeline_model_parallel_size,
            config.model.virtual_pipeline_model_parallel_size,
        )
    return config


def _sync_seq(config):
    """recipe_runner.py sync_model_dataset_sequence_length (v0.6)."""
    seq = getattr(config.dataset, "seq_length", None)
    if seq is not None and config.model.seq_length != seq:
        config.model.seq_length = seq
    return config


def _plain(value):
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def _model_of(model) -> dict:
    out = {name: _plain(getattr(model, name, None)) for name in (*MODEL_FIELDS, *LAYOUT_FIELDS)}
    activation = getattr(model, "activation_func", None)
    out["activation_func"] = getattr(activation, "__name__", str(activation))
    return out


def run_case(case: dict, cache: Path) -> dict:
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    function = _recipe(case["recipe"])
    config_json = json.loads(Path(case["config"]).read_text())
    ids, revisions = _hf_ids(function)
    for repo_id in ids:
        _hf_cache(cache, repo_id, config_json, revisions)
    stage = "recipe"
    try:
        config = function()
        if case.get("convert_only"):  # Bridge's own HF -> Megatron conversion, nothing else
            return {"ok": True, "config": _model_of(config.model)}
        stage = "overrides"
        config = process_config_with_overrides(config, cli_overrides=case["overrides"])
        stage = "sync"
        config = _sync_seq(_sync_layout(config, case["overrides"]))
        stage = "runtime_config_update"
        os.environ.update(WORLD_SIZE=str(case["world_size"]), RANK="0", LOCAL_RANK="0")
        runtime_config_update(config)
    except Exception as error:  # the consumer's refusal is the result
        last = traceback.format_exception_only(type(error), error)[-1].strip()
        return {"ok": False, "stage": stage, "error": last[:2000]}
    out = _model_of(config.model)
    out["dataset_seq_length"] = config.dataset.seq_length
    out["micro_batch_size"] = config.train.micro_batch_size
    out["global_batch_size"] = config.train.global_batch_size
    out["use_distributed_optimizer"] = config.ddp.use_distributed_optimizer
    out["grad_reduce_in_fp32"] = config.ddp.grad_reduce_in_fp32
    out["tp_comm_overlap"] = bool(config.comm_overlap and config.comm_overlap.tp_comm_overlap)
    out["data_parallel_size"] = getattr(config, "data_parallel_size", None)
    import consumers  # tests/consumers.py: megatron-core's own stage arithmetic

    out["chunk_layers"] = consumers.megatron_chunk_layers(config.model)
    return {"ok": True, "config": out}


def _import_bridge(cases: list[dict]) -> None:
    """Megatron-Bridge and Megatron-LM's training package without their ``__init__`` files, and
    the modules that register a bridge for the cases' architectures (``tests/package_init.py``).
    Run after ``HF_HOME`` is set: Hugging Face reads it when imported."""
    import importlib

    import package_init

    for package in PACKAGES_WITHOUT_INIT:
        package_init.skip_init(package)
    architectures = set()
    for case in cases:
        architectures |= set(json.loads(Path(case["config"]).read_text())["architectures"])
    for module in package_init.registering_modules("megatron.bridge.models", architectures):
        importlib.import_module(module)


PACKAGES_WITHOUT_INIT = (
    "megatron.training",
    "megatron.bridge",
    "megatron.bridge.models",
    "megatron.bridge.recipes",
)


def main(cases_path: str, results_path: str) -> None:
    """Every case, then the results file; the process ends without the interpreter's teardown.

    The probe lives a few seconds and keeps what it imports to the end, so the cyclic garbage
    collector is off (its passes over the millions of objects torch, megatron-core, transformers
    and Bridge create cost about 0.8 CPU-s, and the probe needs nothing they free) and the
    teardown is skipped (``tests/quick_exit.py``: another 0.8 s). Measured on 2 cores, the probe
    alone, runs in turn: 7.2-7.6 s wall, 6.1 CPU-s before; 5.0-5.5 s, 4.3 CPU-s after; peak
    memory 1.05 -> 0.95 GB; the results file byte-identical."""
    import gc
    import warnings

    gc.disable()
    warnings.simplefilter("ignore")
    sys.path.insert(0, str(Path(__file__).parent))
    import lazy_compile
    import quick_exit
    import transformer_engine_stub

    lazy_compile.install()  # before torch is imported (tests/lazy_compile.py)
    transformer_engine_stub.install()
    cache = Path(tempfile.mkdtemp(prefix="bridge-hf-"))
    os.environ.update(HF_HOME=str(cache), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cases = json.loads(Path(cases_path).read_text())
    _import_bridge(cases)
    results = {case["id"]: run_case(case, cache) for case in cases}
    Path(results_path).write_text(json.dumps(results, indent=1))
    quick_exit.exit_now()


if __name__ == "__main__":
    main(*sys.argv[1:3])
