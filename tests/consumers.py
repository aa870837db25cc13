"""The emitted configs as their consumers read them, at the consumers' current releases (dev
extras, Python 3.12), with vendored field lists (``tests/data/consumers/``) only where a release
cannot be installed beside the current one.

- Megatron-LM ``pretrain_gpt.py``: ``megatron_lm_config`` runs Megatron-LM's own ``parse_args``,
  ``validate_args`` and ``core_transformer_config_from_args`` (shipped in the megatron-core
  0.19.2 wheel); ``megatron_parse`` / ``megatron_transformer_config`` check flags against the
  vendored flag list of Megatron-LM main d98e8a6 and build megatron-core's ``TransformerConfig``.
- Megatron-Bridge 0.6.2: itself, once per session, in ``tests/bridge_probe.py``; elsewhere
  ``bridge_check``: ``model.*`` through megatron-core's ``TransformerConfig`` and the other
  sections against the fields of Bridge's classes read from its installed source.
- torchtitan 0.3.0: ``ParallelismConfig`` / ``TrainingConfig`` (``__post_init__``), its device
  mesh (``ParallelDims.build_mesh`` on a fake process group), its pipeline stage arithmetic and
  its ``ConfigManager``. torchtitan 0.2.2: vendored fields and the same arithmetic.
- DeepSpeed 0.19.8: ``DeepSpeedConfig`` and its pipeline topology class.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shlex
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "consumers"


@functools.cache
def vendored(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


# a character that POSIX shlex reads as other than part of a word or a blank between words:
# a quote, an escape, or anything outside printable ASCII and its blanks (shlex.whitespace)
_SHELL_SPECIAL = re.compile(r"['\"\\]|[^\x21-\x7e \t\r\n]")


def shell_words(line: str) -> list[str]:
    """``shlex.split(line)``, the words a POSIX shell makes of it; a line of plain words (most
    emitted lines: no quote, escape or unusual character) split on shlex's blanks directly,
    the same list ~10x faster than shlex's character-by-character reader."""
    if _SHELL_SPECIAL.search(line):
        return shlex.split(line)
    return re.findall(r"[^ \t\r\n]+", line)


def megatron_parse(line: str) -> dict[str, list[str]]:
    """Flags of a Megatron argument line -> their values, checked against Megatron-LM's parser:
    known flag, right number of values, values among the choices."""
    flags = vendored("megatron-lm-arguments.json")["flags"]
    tokens = shell_words(line)
    out: dict[str, list[str]] = {}
    i = 0
    while i < len(tokens):
        flag = tokens[i]
        assert flag in flags, f"Megatron-LM has no {flag}"
        spec = flags[flag]
        if spec["nargs"] == 0:
            values: list[str] = []
        elif spec["nargs"] == 1:
            values = tokens[i + 1 : i + 2]
        else:  # "+" / "*": up to the next flag
            values = []
            while i + 1 + len(values) < len(tokens) and not tokens[i + 1 + len(values)].startswith(
                "--"
            ):
                values.append(tokens[i + 1 + len(values)])
        if spec["nargs"] == 1:
            assert len(values) == 1 and not values[0].startswith("--"), f"{flag} needs a value"
        if spec["choices"]:
            for value in values:
                assert value in [str(c) for c in spec["choices"]], f"{flag} {value}"
        assert flag not in out, f"{flag} twice"
        out[flag] = values
        i += 1 + len(values)
    return out


def _typed(text: str) -> Any:
    """A flag value as argparse's ``type=`` would give it (int, float or str)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# Megatron-LM flag dests named otherwise in TransformerConfig (core_transformer_config_from_args)
_RENAMED = {
    "num_virtual_stages_per_pipeline_rank": "virtual_pipeline_model_parallel_size",
    "num_experts": "num_moe_experts",
    "decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
    "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage",
}


def megatron_transformer_config(line: str | dict[str, list[str]]):
    """megatron-core's ``TransformerConfig`` from a Megatron argument line (or the flags
    ``megatron_parse`` read from it)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    flags = vendored("megatron-lm-arguments.json")["flags"]
    fields = {f.name: f for f in dataclasses.fields(MLATransformerConfig)}
    kwargs: dict[str, Any] = {}
    parsed = megatron_parse(line) if isinstance(line, str) else line
    for flag, values in parsed.items():
        dest = _RENAMED.get(flags[flag]["dest"], flags[flag]["dest"])
        if flag == "--swiglu":
            kwargs |= {"gated_linear_unit": True, "activation_func": F.silu}
        elif flag == "--squared-relu":
            kwargs["activation_func"] = lambda x: torch.pow(F.relu(x), 2)
        elif flag == "--disable-bias-linear":
            kwargs["add_bias_linear"] = False
        elif flag == "--bf16":
            # core_transformer_config_from_args: pipeline_dtype = params_dtype
            kwargs |= {
                "bf16": True,
                "params_dtype": torch.bfloat16,
                "pipeline_dtype": torch.bfloat16,
            }
        elif flag == "--num-layers-per-virtual-pipeline-stage":
            kwargs["_vpp_layers"] = int(values[0])
        elif flag == "--moe-layer-freq":
            kwargs["moe_layer_freq"] = eval(values[0], {"__builtins__": {}})  # noqa: S307
        elif flag == "--cuda-graph-impl" and values == ["full_iteration"]:
            # main's full_iteration impl is megatron-core 0.16's local impl, full_iteration scope
            kwargs |= {"cuda_graph_impl": "local", "cuda_graph_scope": ["full_iteration"]}
        elif flag == "--cuda-graph-modules":  # 0.16 names main's cuda_graph_modules scope
            kwargs["cuda_graph_scope"] = list(values)
        elif dest == "recompute_modules":  # a list field (cp_comm_type takes one value too)
            kwargs[dest] = list(values)
        elif dest in fields and dest != "moe_router_load_balancing_type":
            kwargs[dest] = True if not values else _typed(values[0])
    if kwargs.get("cpu_offloading_num_layers", 0) > 0:  # arguments.py L1950-1951
        kwargs["cpu_offloading"] = True
        if kwargs.get("cuda_graph_scope") == ["full_iteration"]:
            # main graphs the full iteration with offloading (transformer_config.py L2800);
            # megatron-core 0.16 refused any graph with it: check the rest without the graph
            del kwargs["cuda_graph_impl"], kwargs["cuda_graph_scope"]
    vpp_layers = kwargs.pop("_vpp_layers", None)
    if vpp_layers:
        stages = kwargs["num_layers"] // vpp_layers
        kwargs["virtual_pipeline_model_parallel_size"] = (
            stages // kwargs["pipeline_model_parallel_size"]
        )
    return transformer_config(**kwargs)


def megatron_lm_config(line: str, world_size: int):
    """Megatron-LM's own path from ``pretrain_gpt.py`` arguments to the model config, as the
    megatron-core 0.19.2 wheel ships it (``megatron/training/arguments.py``): ``parse_args``,
    ``validate_args`` (with ``WORLD_SIZE``), ``core_transformer_config_from_args``. Returns
    ``(args, TransformerConfig)``. Run as on a Hopper machine with Transformer Engine: the device
    probe answers 9 (compute capability 9.0), TE version probes "recent enough", the fused-RoPE
    kernel exists (the checks that need CUDA; no model is built)."""
    import contextlib
    import io
    import os
    import sys

    import torch
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.transformer import transformer_config as module

    _megatron_training()
    from megatron.training import arguments

    saved = (
        sys.argv,
        dict(os.environ),
        module.is_te_min_version,
        rope_utils.fused_apply_rotary_pos_emb,
        arguments.get_device_arch_version,
        torch.cuda.is_available,
        torch.cuda.get_device_capability,
    )
    sys.argv = ["pretrain_gpt.py", *shlex.split(line)]
    os.environ.update(
        WORLD_SIZE=str(world_size), RANK="0", LOCAL_RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1"
    )
    module.is_te_min_version = lambda *a, **k: True
    rope_utils.fused_apply_rotary_pos_emb = lambda *a, **k: None
    arguments.get_device_arch_version = lambda: 9
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # validate_args prints every argument
            args = arguments.parse_args()
            arguments.validate_args(args)
            return args, arguments.core_transformer_config_from_args(args)
    finally:
        sys.argv = saved[0]
        os.environ.clear()
        os.environ.update(saved[1])
        module.is_te_min_version = saved[2]
        rope_utils.fused_apply_rotary_pos_emb = saved[3]
        arguments.get_device_arch_version = saved[4]
        torch.cuda.is_available = saved[5]
        torch.cuda.get_device_capability = saved[6]


def _megatron_training() -> None:
    """Megatron-LM's ``megatron.training`` without its ``__init__``, which imports the training
    loop and, through its checkpointing, nvidia-modelopt, transformers and diffusers: about 10
    of the 19 CPU-seconds ``arguments`` and ``config`` cost with it (``tests/package_init.py``)."""
    import importlib

    package_init = importlib.import_module(
        f"{__package__}.package_init" if __package__ else "package_init"
    )
    package_init.skip_init("megatron.training")


def megatron_chunk_layers(config) -> list[int]:
    """Decoder layers of every virtual stage (virtual-stage order) of a megatron-core
    ``TransformerConfig``, by megatron-core's own code: ``get_num_layers_to_build`` for its split
    flags, the parsed ``PipelineParallelLayerLayout`` for ``--pipeline-model-parallel-layout``."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pp = config.pipeline_model_parallel_size
    vpp = config.virtual_pipeline_model_parallel_size or 1
    layout = config.pipeline_model_parallel_layout
    if layout is not None:
        return [layout.layout[i][j].count(LayerType.decoder) for j in range(vpp) for i in range(pp)]
    stage = None if vpp == 1 else 0
    return [
        get_num_layers_to_build(config, vp_stage=None if stage is None else j, pp_rank=i)
        for j in range(vpp)
        for i in range(pp)
    ]


def transformer_config(**kwargs: Any):
    """megatron-core's ``TransformerConfig``, its checks run as on a machine with Transformer
    Engine (which needs CUDA): version probes answer "recent enough" instead of crashing on None."""
    from megatron.core.transformer import transformer_config as module

    original = module.is_te_min_version
    module.is_te_min_version = lambda *a, **k: True
    cls = module.MLATransformerConfig if kwargs.get("multi_latent_attention") else None
    cls = cls or module.TransformerConfig
    # GPTModel's own arguments (rotary_base, rope scaling) are not TransformerConfig fields:
    # pretrain_gpt.py passes them to GPTModel; the tests check them on the parsed flags
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in kwargs.items() if k in names}
    try:
        return cls(**kwargs)
    finally:
        module.is_te_min_version = original


@functools.cache
def bridge_source_fields() -> dict[str, set[str]]:
    """Field names of Megatron-Bridge 0.6.2's own config classes, read from the installed
    package's source with ``ast`` (importing Bridge costs ~20 CPU-s; ``tests/test_bridge.py``
    runs Bridge itself once per session): each class's own annotated fields, and the keys of
    ``ACTIVATION_FUNC_MAP`` and the registered mixed-precision recipes."""
    import ast
    import importlib.util

    root = Path(importlib.util.find_spec("megatron.bridge").submodule_search_locations[0])
    wanted = {
        "models/gpt_provider.py": ("GPTModelProvider",),
        "training/config.py": ("ConfigContainer", "GPTDatasetConfig", "TrainingConfig",
                               "CheckpointConfig"),
        "training/comm_overlap.py": ("CommOverlapConfig",),
    }  # fmt: skip
    out: dict[str, set[str]] = {}
    for path, classes in wanted.items():
        tree = ast.parse((root / path).read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name in classes:
                out[node.name] = {
                    item.target.id
                    for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                }
    activations = (root / "utils/activation_map.py").read_text(encoding="utf-8")
    out["activations"] = set(re.findall(r'^\s+"([a-z_0-9]+)":', activations, re.M))
    recipes = (root / "training/mixed_precision.py").read_text(encoding="utf-8")
    out["mixed_precision"] = set(re.findall(r"@register\s+def (\w+)\(", recipes))
    return out


def bridge_check(overrides: dict[str, dict[str, Any]]) -> None:
    """Megatron-Bridge 0.6.2 overrides, section by section, against the classes that hold them:
    ``model.*`` through megatron-core's ``TransformerConfig`` (its ``__post_init__`` checks) plus
    ``GPTModelProvider``'s own fields, ``ddp.*`` through ``DistributedDataParallelConfig``, the
    rest against Bridge's class fields (``bridge_source_fields``)."""
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    bridge = bridge_source_fields()
    assert set(overrides) <= bridge["ConfigContainer"], set(overrides) - bridge["ConfigContainer"]
    model = dict(overrides["model"])
    core = {f.name for f in dataclasses.fields(MLATransformerConfig)}
    provider_only = bridge["GPTModelProvider"] - core
    extra = {k: model.pop(k) for k in list(model) if k in provider_only}
    unknown = set(model) - core - {"activation_func"}
    assert not unknown, unknown
    if "activation_func" in model:
        assert model["activation_func"] in bridge["activations"], model["activation_func"]
        import torch.nn.functional as F  # the callable Bridge resolves the name to, for the checks

        model["activation_func"] = F.silu
    import torch

    recipe = overrides["mixed_precision"][""]
    model |= {"bf16": True, "params_dtype": torch.bfloat16, "pipeline_dtype": torch.bfloat16}
    if "fp8" in recipe:
        fp8_recipe = {
            "delayed": "delayed",
            "current": "tensorwise",
            "subchannel": "blockwise",
            "mxfp8": "mxfp8",
        }
        name = next(v for k, v in fp8_recipe.items() if k in recipe)
        model |= {"fp8": "e4m3" if name == "mxfp8" else "hybrid", "fp8_recipe": name}
    if "nvfp4" in recipe:  # bf16_with_nvfp4_mixed
        model |= {"fp4": "e2m1", "fp4_recipe": "nvfp4"}
    if "attention_backend" in model:  # OmegaConf turns the member name into the enum
        from megatron.core.transformer.enums import AttnBackend

        model["attention_backend"] = AttnBackend[model["attention_backend"]]
    model.pop("pipeline_model_parallel_layout", None)  # null: the split flags decide
    transformer_config(**model)  # MLATransformerConfig when multi_latent_attention
    assert set(extra) >= {"seq_length", "vocab_size"}, extra  # GPTModelProvider's own
    DistributedDataParallelConfig(**overrides["ddp"])
    names = {f.name for f in dataclasses.fields(OptimizerConfig)}
    assert set(overrides.get("optimizer", {})) <= names, overrides["optimizer"]
    dataset = bridge["GPTDatasetConfig"] | {f.name for f in dataclasses.fields(GPTDatasetConfig)}
    assert set(overrides.get("dataset", {})) <= dataset, overrides["dataset"]
    assert "seq_length" in overrides["dataset"]  # 0.6 re-syncs the model from it
    _megatron_training()
    from megatron.training import config as training_config

    for section, cls in (("train", "TrainingConfig"), ("checkpoint", "CheckpointConfig")):
        inherited = {f.name for f in dataclasses.fields(getattr(training_config, cls))}
        assert set(overrides.get(section, {})) <= bridge[cls] | inherited, section
    overlap = overrides["comm_overlap"]
    assert overlap == {"": None} or (
        overlap["_target_"].endswith(".CommOverlapConfig")
        and set(overlap) - {"_target_"} <= bridge["CommOverlapConfig"]
    ), overlap
    assert recipe in bridge["mixed_precision"], recipe


def torchtitan_stage_layers(num_layers: int, parallelism: dict[str, Any]) -> list[int]:
    """Transformer layers per virtual stage as torchtitan splits them
    (``distributed/pipeline_parallel.py``)."""
    from torchtitan.config.configs import ParallelismConfig
    from torchtitan.distributed import pipeline_parallel as pp_mod

    config = ParallelismConfig(**parallelism)

    class Dims:  # the one attribute _get_pipeline_metadata reads
        pp = config.pipeline_parallel_degree

    class Model:
        layers = [None] * num_layers

    stages, layers, first_w, last_w = pp_mod._get_pipeline_metadata(Dims(), config, Model())
    parts = pp_mod._generate_llm_fqn_per_model_part(stages, layers, first_w, last_w)
    return [sum(name.startswith("layers.") for name in part) for part in parts]


def torchtitan_mesh(parallelism: dict[str, Any], world_size: int) -> None:
    """torchtitan 0.3's own ``ParallelDims.build_mesh`` for the emitted parallelism, on a fake
    process group of ``world_size`` ranks (no GPU): raises where the device mesh cannot be built
    (a zero-sized expert mesh, a world the degrees do not cover)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.config.configs import ParallelismConfig
    from torchtitan.distributed.parallel_dims import ParallelDims

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        config = ParallelismConfig(**parallelism)
        ParallelDims.from_config(config, world_size).build_mesh()
    finally:
        dist.destroy_process_group()


def torchtitan_parse(args: list[str]):
    """torchtitan 0.3's own ``ConfigManager`` on the emitted arguments."""
    from torchtitan.config.manager import ConfigManager

    return ConfigManager().parse_args(args)


def _leaves(tree: Any, path: str = ""):
    """(path, value) of every leaf of a torchtitan ``Config.to_dict()`` tree."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _leaves(value, f"{path}.{key}")
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from _leaves(value, f"{path}[{i}]")
    else:
        yield path, tree


def torchtitan_architecture(model) -> dict[str, Any]:
    """A torchtitan 0.3 decoder config (``model_spec.model``) in autopar's ``ModelSpec`` terms
    (the names of ``autopar.outputs.emit.torchtitan.ARCH_FIELDS``): its layer list, attention and
    MoE sub-configs as torchtitan builds them."""
    found: dict[str, set[Any]] = {}
    for path, value in _leaves(model.to_dict()):
        if path.startswith(".mtp_layers"):
            continue
        name = path.rsplit(".", 1)[-1]
        if ".rope." in path and name in ("theta", "scaling", "rope_factor", "scaling_factor"):
            found.setdefault(f"rope_{name}", set()).add(value)
        if not isinstance(value, int):
            continue
        if name == "hidden_dim" and "experts" in path:
            name = "expert_hidden_dim"
        found.setdefault(name, set()).add(value)

    def one(name: str, default: int = 0) -> int:
        values = found.get(name, {default})
        assert len(values) == 1, (name, values)  # every layer alike
        return values.pop()

    heads = one("n_heads")
    experts = one("num_experts")
    return {
        "num_layers": len(model.layers),
        "hidden_size": model.dim,
        "num_attention_heads": heads,
        "num_kv_heads": one("n_kv_heads", heads),  # MLA keeps a head per query head
        "vocab_size": model.vocab_size,
        "num_experts": experts,
        "experts_per_token": one("top_k") if experts else 0,
        "moe_ffn_hidden_size": one("expert_hidden_dim") if experts else 0,
        "num_mtp_layers": len(getattr(model, "mtp_layers", None) or []),
        **_torchtitan_rope(one),
    }


# torchtitan RoPEConfig.scaling -> autopar RopeSpec.scaling, and the field holding its factor
_TT_SCALING = {
    "none": ("none", None),
    "llama": ("llama3", "scaling_factor"),
    "yarn": ("yarn", "rope_factor"),
}


def _torchtitan_rope(one) -> dict[str, Any]:
    """The RoPE of every layer of a torchtitan model (``RoPE.Config``): base, scaling kind, and
    the factor that kind reads (``scaling_factor`` for Llama-3.1's, ``rope_factor`` for YaRN)."""
    scaling, factor_field = _TT_SCALING[one("rope_scaling")]
    factor = float(one(f"rope_{factor_field}")) if factor_field else 1.0
    return {"rope_theta": float(one("rope_theta")), "rope_scaling": scaling, "rope_factor": factor}


def deepspeed_config(config: dict[str, Any], dp: int):
    """DeepSpeed's ``DeepSpeedConfig`` (no process group: rank 0, a DP-only model-parallel unit)."""
    from deepspeed.runtime import config as ds_config

    class Mpu:  # DeepSpeed's world size for batch checks is the data-parallel size
        def get_data_parallel_world_size(self) -> int:
            return dp

    original = ds_config.dist.get_rank
    ds_config.dist.get_rank = lambda *a, **k: 0
    try:
        return ds_config.DeepSpeedConfig(config, mpu=Mpu())
    finally:
        ds_config.dist.get_rank = original
