"""What a model file is called in reports (issue 24), and the one way a name or description is
read from an input file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autopar.base.errors import InputError, excerpt

MAX_NAME_CHARS = 200
"""``name`` / ``description`` strings are cut to this length for reports."""


def string_value(data: Mapping[str, Any], key: str, default: str) -> str:
    """``data[key]`` as a string of at most ``MAX_NAME_CHARS`` (numbers are written out);
    ``default`` when absent or null."""
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise InputError(f"must be a string, got {excerpt(value)}", field=key)
    return str(value)[:MAX_NAME_CHARS]


GENERIC_STEMS = frozenset({"config"})
"""File names that say nothing of the model: Hugging Face names every model's file
``config.json``."""


def model_name(data: Mapping[str, Any], stem: str) -> str:
    """What reports call the model: ``name`` (autopar's key), else ``_name_or_path`` (what
    ``transformers`` records the config was loaded from: a hub id such as
    ``meta-llama/Meta-Llama-3-70B``, whose last part is kept when it is a local directory), else
    the file name unless it is ``config``, else ``architectures[0]`` (``LlamaForCausalLM``),
    else ``model_type``, else the file name."""
    if data.get("name") is not None:
        return string_value(data, "name", stem)
    origin = string_value(data, "_name_or_path", "").strip().rstrip("/\\")
    if origin.startswith(("/", ".", "~")) or "\\" in origin or origin.count("/") > 1:
        origin = origin.replace("\\", "/").rsplit("/", 1)[-1]
    if origin:
        return origin
    if stem.lower() not in GENERIC_STEMS:
        return stem
    architectures = data.get("architectures")
    if isinstance(architectures, list | tuple) and architectures:
        return string_value({"architectures": architectures[0]}, "architectures", stem)
    return string_value(data, "model_type", "") or stem
