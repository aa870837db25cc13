"""Input files and presets -> frozen specs. The only module that reads input files.

Model files are Hugging Face ``config.json`` files (or presets in their terms), mapped to a
``ModelSpec`` by ``autopar.inputs.hf_config``; GPU, cluster and stack files are read here. Every
problem raises ``InputError`` naming the file, the field and the rule.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from autopar.base.errors import InputError, excerpt
from autopar.inputs.fields import integer, unknown_key
from autopar.inputs.hf_config import model_from_mapping
from autopar.inputs.limits import MAX_GPUS, check_int
from autopar.inputs.names import string_value
from autopar.inputs.reliability import RELIABILITY_KEYS, reliability_from_values
from autopar.inputs.safe_yaml import SAFE_LOADER, load_built, load_mapping
from autopar.inputs.specs import GIB, ClusterSpec, GpuSpec, ModelSpec
from autopar.inputs.stack import DEFAULT_STACK, StackSpec, stack_from_mapping

MAX_GPUS_PER_NODE = MAX_GPUS
GPU_NUMBER_MAX: dict[str, float] = {
    # key -> largest accepted value (all must be positive and finite): 1000x today's parts.
    "memory_gib": float(1 << 20),
    "peak_bf16_tflop_per_s": 1e7,
    "peak_fp8_tflop_per_s": 1e7,
    "hbm_tb_per_s": 1e4,
    "nvlink_gb_per_s": 1e7,
    "nic_gb_per_s": 1e7,
    "intra_node_latency_us": 1e7,
    "inter_node_latency_us": 1e7,
    "memory_reserve_gib": float(1 << 20),
    "gemm_efficiency": 1.0,
    "fp8_gemm_efficiency": 1.0,
    "fp4_gemm_efficiency": 1.0,
    "peak_fp4_tflop_per_s": 1e7,
    "attention_exp_tera_per_s": 1e4,
    "host_gb_per_s": 1e7,
}
# Spec field -> the key a user writes, for errors raised by the frozen specs.
GPU_FIELD_KEYS: dict[str, str] = {
    "memory_bytes": "memory_gib",
    "peak_bf16_flop_per_s": "peak_bf16_tflop_per_s",
    "peak_fp8_flop_per_s": "peak_fp8_tflop_per_s",
    "hbm_bytes_per_s": "hbm_tb_per_s",
    "nvlink_bytes_per_s": "nvlink_gb_per_s",
    "nic_bytes_per_s": "nic_gb_per_s",
    "peak_fp4_flop_per_s": "peak_fp4_tflop_per_s",
    "attention_exp_per_s": "attention_exp_tera_per_s",
    "host_bytes_per_s": "host_gb_per_s",
    "intra_node_latency_s": "intra_node_latency_us",
    "inter_node_latency_s": "inter_node_latency_us",
    "memory_reserve_bytes": "memory_reserve_gib",
    "checkpoint_bytes_per_s": "checkpoint_gb_per_s",
}

GPU_KEYS: tuple[str, ...] = (
    "name",
    "aliases",
    "description",
    "memory_gib",
    "peak_bf16_tflop_per_s",
    "peak_fp8_tflop_per_s",
    "hbm_tb_per_s",
    "nvlink_gb_per_s",
    "nic_gb_per_s",
    "gpus_per_node",
    "gemm_efficiency",
    "fp8_gemm_efficiency",
    "generation",
    "peak_fp4_tflop_per_s",
    "fp4_gemm_efficiency",
    "attention_exp_tera_per_s",
    "host_gb_per_s",
    "gpus_per_server",
)
GPU_OPTIONAL_NUMBERS: dict[str, tuple[str, float]] = {
    # optional GPU key -> (GpuSpec field, scale to SI units)
    "gemm_efficiency": ("gemm_efficiency", 1.0),
    "fp8_gemm_efficiency": ("fp8_gemm_efficiency", 1.0),
    "peak_fp4_tflop_per_s": ("peak_fp4_flop_per_s", 1e12),
    "fp4_gemm_efficiency": ("fp4_gemm_efficiency", 1.0),
    "attention_exp_tera_per_s": ("attention_exp_per_s", 1e12),
    "host_gb_per_s": ("host_bytes_per_s", 1e9),
}
GPU_OPTIONAL_KEYS: tuple[str, ...] = ("generation", "gpus_per_server", *GPU_OPTIONAL_NUMBERS)
CLUSTER_KEYS: tuple[str, ...] = (
    "gpu",
    "gpus_per_node",
    "memory_gib",
    "peak_bf16_tflop_per_s",
    "peak_fp8_tflop_per_s",
    "hbm_tb_per_s",
    "nvlink_gb_per_s",
    "nic_gb_per_s",
    "peak_fp4_tflop_per_s",
    "host_gb_per_s",
    "intra_node_latency_us",
    "inter_node_latency_us",
    "comm_profile",
    "memory_reserve_gib",
    "name",
    "gpus_per_server",
    *RELIABILITY_KEYS,
)


# ---------------------------------------------------------------------------------------------
# files


def read_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML or JSON file holding one mapping with string keys (safe, bounded loading:
    ``autopar.inputs.safe_yaml``)."""
    return load_mapping(path)


def _number(data: Mapping[str, Any], key: str, *, minimum: float = 0.0) -> float:
    """A finite number above ``minimum`` and at most ``GPU_NUMBER_MAX[key]``."""
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"must be a number, got {excerpt(value)}", field=key)
    maximum = GPU_NUMBER_MAX.get(key, 1e12)
    if isinstance(value, int) and value.bit_length() > 64 or not math.isfinite(value):
        raise InputError(f"must be a finite number, got {excerpt(value)}", field=key)
    if not minimum < value <= maximum:
        raise InputError(
            f"must be a number above {minimum:g} and at most {maximum:g}, got {excerpt(value)}",
            field=key,
        )
    return float(value)


# ---------------------------------------------------------------------------------------------
# models


def _preset_dir(kind: str) -> Path:
    return Path(str(resources.files("autopar") / "presets" / kind))


@cache
def _preset_index(kind: str) -> dict[str, Path]:
    """Preset and alias names -> file, for ``models`` or ``gpus``."""
    index: dict[str, Path] = {}
    for path in sorted(_preset_dir(kind).glob("*.yaml")):
        index[path.stem] = path
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER) or {}
        for alias in data.get("aliases", []) or []:
            index[str(alias)] = path
    return index


def preset_names(kind: str) -> list[str]:
    """Canonical preset names (file stems), sorted."""
    return sorted(path.stem for path in _preset_dir(kind).glob("*.yaml"))


def preset_aliases(kind: str, name: str) -> tuple[str, ...]:
    """The other names a preset answers to (its ``aliases``: ``llama-70b`` for
    ``llama-3-70b``), in the order the file lists them."""
    path = preset_path(kind, name)
    return tuple(a for a, p in _preset_index(kind).items() if p == path and a != path.stem)


def preset_path(kind: str, name: str) -> Path | None:
    return _preset_index(kind).get(name.lower())


def _exists(path: Path) -> bool:
    """``path.exists()`` that answers False where the OS refuses the name (too long, NUL)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _resolve(kind: str, name_or_path: str, flag: str) -> Path:
    if not name_or_path.strip():
        raise InputError("must name a preset or a file, got an empty string", source=flag)
    path = preset_path(kind, name_or_path)
    if path is not None:
        return path
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml", ".json") or _exists(candidate):
        return candidate
    names = list(_preset_index(kind))
    close = difflib.get_close_matches(name_or_path.lower()[:100], names, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f"; see `autopar {kind}`"
    raise InputError(f"no preset or file named {excerpt(name_or_path)}{hint}", source=flag)


def load_model(name_or_path: str | ModelSpec) -> ModelSpec:
    """A model preset name (``llama-70b``) or a YAML/JSON file with HF config keys."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    path = _resolve("models", str(name_or_path), "--model")
    try:
        return load_built(path, model_from_mapping, name=path.stem)
    except InputError as err:
        raise err.with_source(str(path)) from None


# ---------------------------------------------------------------------------------------------
# GPUs and clusters


def gpu_from_mapping(data: Mapping[str, Any], *, name: str) -> GpuSpec:
    for key in data:
        if key not in GPU_KEYS:
            raise unknown_key(key, list(GPU_KEYS))
    for key in GPU_KEYS[3:]:
        if key not in data and key not in GPU_OPTIONAL_KEYS:
            raise InputError("required key is missing", field=key)
    fp8 = data["peak_fp8_tflop_per_s"]
    try:
        return GpuSpec(
            name=string_value(data, "name", name),
            description=string_value(data, "description", ""),
            memory_bytes=int(round(_number(data, "memory_gib") * GIB)),
            peak_bf16_flop_per_s=_number(data, "peak_bf16_tflop_per_s") * 1e12,
            peak_fp8_flop_per_s=None
            if fp8 is None
            else _number(data, "peak_fp8_tflop_per_s") * 1e12,
            hbm_bytes_per_s=_number(data, "hbm_tb_per_s") * 1e12,
            nvlink_bytes_per_s=_number(data, "nvlink_gb_per_s") * 1e9,
            nic_bytes_per_s=_number(data, "nic_gb_per_s") * 1e9,
            gpus_per_node=integer(data, "gpus_per_node", maximum=MAX_GPUS_PER_NODE),
            generation=string_value(data, "generation", "").strip().lower(),
            **{
                field: _number(data, key) * scale
                for key, (field, scale) in GPU_OPTIONAL_NUMBERS.items()
                if data.get(key) is not None
            },
            gpus_per_server=integer(data, "gpus_per_server", maximum=MAX_GPUS_PER_NODE)
            if data.get("gpus_per_server") is not None
            else None,
        )
    except InputError as err:
        raise err.with_field(GPU_FIELD_KEYS.get(err.field or "", err.field)) from None


def _gpu_mapping(name_or_path: str) -> tuple[dict[str, Any], Path]:
    path = _resolve("gpus", name_or_path, "--gpu")
    return read_mapping(path), path


def load_gpu(name_or_path: str | GpuSpec) -> GpuSpec:
    """A GPU preset name (``h100``) or a YAML file with the preset keys."""
    if isinstance(name_or_path, GpuSpec):
        return name_or_path
    path = _resolve("gpus", str(name_or_path), "--gpu")
    try:
        return load_built(path, gpu_from_mapping, name=path.stem)
    except InputError as err:
        raise err.with_source(str(path)) from None


def _cluster_from_mapping(data: Mapping[str, Any], *, base_dir: Path) -> ClusterSpec:
    for key in data:
        if key not in CLUSTER_KEYS:
            raise unknown_key(key, list(CLUSTER_KEYS))
    gpu_ref = data.get("gpu")
    if not isinstance(gpu_ref, str | dict):
        raise InputError("must name a GPU preset or hold the GPU keys", field="gpu")
    if isinstance(gpu_ref, str):
        gpu_data, gpu_path = _gpu_mapping(gpu_ref)
        gpu_name = gpu_path.stem
    else:
        gpu_data, gpu_name = dict(gpu_ref), string_value(gpu_ref, "name", "custom")
    overrides = {k: data[k] for k in GPU_KEYS[3:] if k in data}
    gpu = gpu_from_mapping({**gpu_data, **overrides}, name=gpu_name)
    profile = data.get("comm_profile")
    if profile is not None and not (isinstance(profile, str) and profile.strip()):
        raise InputError("must be a path to a profile YAML", field="comm_profile")
    reserve_gib = (
        _number(data, "memory_reserve_gib", minimum=-1.0) if "memory_reserve_gib" in data else 0.0
    )
    if not 0 <= reserve_gib * GIB < gpu.memory_bytes:
        raise InputError(
            f"must be >= 0 and below the GPU's memory ({gpu.memory_bytes / GIB:g} GiB), "
            f"got {reserve_gib:g}",
            field="memory_reserve_gib",
        )
    kwargs: dict[str, Any] = {
        "gpu": gpu,
        "gpus_per_node": integer(
            data, "gpus_per_node", default=gpu.gpus_per_node, maximum=MAX_GPUS_PER_NODE
        ),
        "comm_profile_path": str(base_dir / profile) if profile else None,
        "memory_reserve_bytes": int(round(reserve_gib * GIB)),
        "reliability": reliability_from_values({k: data[k] for k in RELIABILITY_KEYS if k in data}),
    }
    for key, field in (
        ("intra_node_latency_us", "intra_node_latency_s"),
        ("inter_node_latency_us", "inter_node_latency_s"),
    ):
        if key in data:
            kwargs[field] = _number(data, key) * 1e-6
    try:
        return ClusterSpec(**kwargs)
    except InputError as err:
        raise err.with_field(GPU_FIELD_KEYS.get(err.field or "", err.field)) from None


def load_cluster(
    *,
    gpu: str | GpuSpec | None = None,
    cluster_file: str | None = None,
    gpus_per_node: int | None = None,
    comm_profile: str | None = None,
) -> ClusterSpec:
    """A cluster from a cluster YAML and/or a GPU preset; flags override the file. A flag given
    empty (``--gpu ''``) or zero (``--gpus-per-node 0``) is an error, never the default."""
    for value, flag in ((cluster_file, "--cluster"), (comm_profile, "--comm-profile")):
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise InputError(f"must name a file, got {excerpt(value)}", source=flag)
    if gpus_per_node is not None:
        check_int(gpus_per_node, source="--gpus-per-node", maximum=MAX_GPUS)
    if cluster_file is not None:
        try:
            data = read_mapping(cluster_file)
            if gpu is not None:
                data["gpu"] = gpu.name if isinstance(gpu, GpuSpec) else gpu
            spec = _cluster_from_mapping(data, base_dir=Path(cluster_file).parent)
        except InputError as err:
            raise err.with_source(str(cluster_file)) from None
    else:
        spec_gpu = load_gpu("h100" if gpu is None else gpu)
        spec = ClusterSpec(gpu=spec_gpu, gpus_per_node=spec_gpu.gpus_per_node)
    if gpus_per_node is not None or comm_profile is not None:
        spec = dataclasses.replace(
            spec,
            gpus_per_node=spec.gpus_per_node if gpus_per_node is None else gpus_per_node,
            comm_profile_path=comm_profile or spec.comm_profile_path,
        )
    return spec


def preset_text(kind: str, name: str) -> str:
    """The preset file as a user can save and edit it."""
    path = preset_path(kind, name)
    if path is None:
        _resolve(kind, name, "--show")  # raises with a suggestion
        raise InputError(f"no preset named {excerpt(name)}", source="--show")
    return path.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# training stacks (issue 11)


def load_stack(name_or_path: str | StackSpec | None) -> StackSpec:
    """A stack preset name (``nemo-24.07``) or a YAML file with ``StackSpec`` keys; ``None`` is
    ``autopar.inputs.stack.DEFAULT_STACK``. An unknown name exits 2 listing the presets."""
    if isinstance(name_or_path, StackSpec):
        return name_or_path
    name = DEFAULT_STACK if name_or_path is None else str(name_or_path)
    path = preset_path("stacks", name)
    if path is None:
        candidate = Path(name)
        if candidate.suffix not in (".yaml", ".yml", ".json") and not _exists(candidate):
            known = ", ".join(preset_names("stacks"))
            raise InputError(
                f"no stack preset or file named {excerpt(name)}; known: {known}", source="--stack"
            )
        if not _exists(candidate):
            known = ", ".join(preset_names("stacks"))
            raise InputError(f"file not found; known stacks: {known}", source=str(candidate))
        path = candidate
    try:
        return load_built(path, stack_from_mapping, name=path.stem)
    except InputError as err:
        raise err.with_source(str(path)) from None
