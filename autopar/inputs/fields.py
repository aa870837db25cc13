"""Typed readers of input-file values: each checks one key of a mapping and raises
``InputError`` naming it (the rule, the value seen) before the value reaches any arithmetic.
Strings (names, descriptions) are read by ``autopar.inputs.names.string_value``."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

from autopar.base.errors import InputError, excerpt
from autopar.inputs import hf_families
from autopar.inputs.limits import range_rule

MEGATRON_NAMES: dict[str, str] = {
    # Megatron-LM's argument names (arguments.py) -> the Hugging Face key autopar reads
    "num_layers": "num_hidden_layers",
    "ffn_hidden_size": "intermediate_size",
    "num_query_groups": "num_key_value_heads",
    "kv_channels": "head_dim",
    "moe_router_topk": "num_experts_per_tok",
    "moe_ffn_hidden_size": "moe_intermediate_size",
    "rotary_base": "rope_theta",
}
"""Model keys written as Megatron names them: the suggestion is the key autopar reads."""


def unknown_key(key: str, known: tuple[str, ...] | list[str]) -> InputError:
    family_error = hf_families.unmodelled_key_error(key)
    if family_error is not None:
        return family_error  # a family's key: never suggest a key with another meaning
    if MEGATRON_NAMES.get(key) in known:
        return InputError(
            f"unknown key; did you mean {MEGATRON_NAMES[key]!r} (Megatron's --"
            f"{key.replace('_', '-')} in Hugging Face's name)?",
            field=key,
        )
    close = difflib.get_close_matches(key[:100], known, n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return InputError(f"unknown key{hint}", field=excerpt(key, 60).strip("'"))


def integer(
    data: Mapping[str, Any],
    key: str,
    *,
    default: int | None = None,
    minimum: int = 1,
    maximum: int = 1 << 31,
) -> int:
    """An integral value (``4096`` or ``4096.0``) in ``minimum..maximum``, checked before it is
    used in any arithmetic."""
    if key not in data or data[key] is None:
        if default is None:
            raise InputError("required key is missing", field=key)
        return default
    value = data[key]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"must be an integer, got {excerpt(value)}", field=key)
    if not minimum <= value <= maximum:
        raise InputError(f"{range_rule(minimum, maximum)}, got {excerpt(value)}", field=key)
    return value


def boolean(data: Mapping[str, Any], key: str, default: bool) -> bool:
    """``data[key]`` as a boolean (``hf_families.flag``: the same rule for every key)."""
    return hf_families.flag(data, key, default)


def choice(data: Mapping[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or value not in choices:
        raise InputError(f"must be one of {', '.join(choices)}, got {excerpt(value)}", field=key)
    return value
