"""Bounded reading of untrusted YAML, JSON and text files (issue 15).

A model file or a log comes from anywhere. Before anything is built from it:

- the file is at most ``max_bytes`` (``MAX_INPUT_BYTES`` unless the caller says otherwise) and
  UTF-8 text; a path the OS refuses (too long, a directory, no permission) is an ``InputError``;
- YAML is loaded with PyYAML's *safe* loader only (no tag ever constructs a Python object), after
  a pass over its event stream that refuses nesting deeper than ``MAX_DEPTH``, more than
  ``MAX_ALIASES`` aliases, and documents that would expand to more than ``MAX_NODES`` nodes once
  aliases are followed (the "billion laughs" bomb is < 1 KB and expands to 10^9 nodes);
- JSON nesting is measured before ``json.loads`` (which recurses), and ``NaN``/``Infinity`` are
  refused;
- every mapping key is a string, and the loaded tree has at most ``MAX_NODES`` nodes.

Numbers are checked where they are read (``autopar.inputs.loading``), before any arithmetic.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import stat
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path
from typing import Any, TypeVar

import yaml

from autopar.base.errors import InputError, excerpt, shorten

MAX_INPUT_BYTES = 1 << 20
"""Model, GPU and cluster files: 1 MiB (a Hugging Face config.json is a few KB)."""
MAX_DEPTH = 32
"""Nesting of mappings and lists (autopar's files nest 3 deep; HF configs about 4)."""
MAX_ALIASES = 64
"""YAML aliases (``*name``) per file: enough for hand-written anchors, not for a bomb."""
MAX_NODES = 200_000
"""Scalars, lists and mappings per file, counted with aliases expanded."""
Built = TypeVar("Built")


class _SafeLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's safe loader where PyYAML was built with it (10x faster), else the pure one;
    also reads ``1e-6`` as a float, as YAML 1.2 and JSON do (YAML 1.1 wants ``1.0e-6``, and
    reads ``1e-6`` as a string)."""


_SafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
SAFE_LOADER = _SafeLoader

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]")


def read_text(path: str | Path, *, max_bytes: int = MAX_INPUT_BYTES, errors: str = "strict") -> str:
    """The UTF-8 text of ``path``, at most ``max_bytes``; any OS or decoding problem is an
    ``InputError`` naming the file."""
    source = _display(path)
    try:
        status = os.stat(path)
        if stat.S_ISDIR(status.st_mode):
            raise InputError("is a directory, not a file", source=source)
        if not stat.S_ISREG(status.st_mode):  # a FIFO or a device would block or never end
            raise InputError("not a regular file", source=source)
        with open(path, "rb") as stream:
            data = _read_at_most(stream, max_bytes + 1, expected=status.st_size)
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError("file not found", source=source) from None
    except (OSError, ValueError) as err:  # ENAMETOOLONG, EACCES, ELOOP, embedded NUL ...
        reason = getattr(err, "strerror", None) or type(err).__name__
        raise InputError(f"cannot read file ({reason})", source=source) from None
    if len(data) > max_bytes:
        raise InputError(f"file is larger than the {max_bytes:,}-byte limit", source=source)
    if b"\x00" in data and errors == "strict":
        raise InputError("binary file (NUL bytes); expected UTF-8 text", source=source)
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as err:
        raise InputError(
            f"not UTF-8 text (byte {err.start}: {excerpt(data[err.start : err.start + 4])})",
            source=source,
        ) from None


def _read_at_most(stream, most: int, *, expected: int) -> bytes:
    """``stream.read(most)``, without a ``most``-byte buffer for a file of ``expected`` bytes:
    ``read(n)`` allocates ``n`` bytes first (1 MiB, about 30 us, for each preset read). A file
    that grew since its size was read is read on, up to ``most``, so the answer is the same."""
    data = stream.read(min(most, expected + 1))
    if len(data) > expected:
        data += stream.read(most - len(data))
    return data


def load_mapping_text(text: str, *, source: str, json_syntax: bool) -> dict[str, Any]:
    """Parse ``text`` (JSON or YAML) into one mapping with string keys, within the limits.

    A text parsed before is not parsed again: the checked tree is kept by content (``_parsed``)
    and each caller gets its own deep copy, so a caller that changes its mapping changes no
    one else's. Presets are read on every ``make_problem``: PyYAML's pure-Python loader and the
    event pass took about two thirds of building a problem from three presets."""
    return copy.deepcopy(_parsed(text, source, json_syntax))


@functools.lru_cache(maxsize=256)
def _parsed(text: str, source: str, json_syntax: bool) -> dict[str, Any]:
    """The checked mapping of one text (a refused text raises each time: errors are not kept)."""
    data = _load_json(text, source) if json_syntax else _load_yaml(text, source)
    _check_tree(data, source)
    if not isinstance(data, dict):
        raise InputError(
            f"must hold a mapping of keys to values, got {excerpt(data)}", source=source
        )
    return data


def load_mapping(
    path: str | Path, *, max_bytes: int = MAX_INPUT_BYTES, json_syntax: bool | None = None
) -> dict[str, Any]:
    """A YAML or JSON file (``.json`` suffix: JSON) holding one mapping."""
    text = read_text(path, max_bytes=max_bytes)
    is_json = str(path).endswith(".json") if json_syntax is None else json_syntax
    return load_mapping_text(text, source=_display(path), json_syntax=is_json)


def load_built(path: str | Path, build: Callable[..., Built], *, name: str) -> Built:
    """``build(load_mapping(path), name=name)``, built once per text: a preset is read on every
    ``make_problem`` (tests/test_emit_consumers.py builds 2,280 problems), and turning its
    mapping into a spec cost more than reading it. The file is still read each time, so a
    changed file is built again; ``build`` must be a pure function of the mapping and the name
    returning a frozen value (``ModelSpec``, ``GpuSpec``, ``StackSpec``), which every caller
    can then share. A refused file raises each time (errors are not kept)."""
    text = read_text(path)
    return _built(build, text, _display(path), str(path).endswith(".json"), name)


@functools.lru_cache(maxsize=128)
def _built(build: Callable[..., Built], text: str, source: str, json_syntax: bool, name: str):
    """The spec ``build`` makes of one text (bounded: a few dozen presets and files in use)."""
    return build(load_mapping_text(text, source=source, json_syntax=json_syntax), name=name)


# ---------------------------------------------------------------------------------------------
# YAML


def _load_yaml(text: str, source: str) -> Any:
    try:
        _check_yaml_events(text, source)
        return yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 -- the safe loader
    except InputError:
        raise
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "syntax error"
        raise InputError(f"invalid YAML{where}: {problem}", source=source) from None
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as err:
        # e.g. an integer of more than 4300 digits, a date that does not exist, a key that
        # cannot be hashed
        raise InputError(f"invalid YAML value ({_reason(err)})", source=source) from None


def _check_yaml_events(text: str, source: str) -> None:
    """Walk the event stream (no objects built): depth, alias count, and the node count with
    every alias expanded (an alias counts the nodes of what it names)."""
    aliases = total = 0
    sizes: dict[str, int] = {}  # anchor -> expanded node count of the anchored node
    stack: list[tuple[str | None, int]] = []  # open collections: (anchor, total at start)
    for event in yaml.parse(text, Loader=SAFE_LOADER):
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise InputError(f"more than {MAX_ALIASES} YAML aliases", source=source)
            total += sizes.get(event.anchor, 1)
        elif isinstance(event, yaml.ScalarEvent):
            total += 1
            if event.anchor:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            stack.append((event.anchor, total))
            total += 1
            if len(stack) > MAX_DEPTH:
                raise InputError(f"nested deeper than {MAX_DEPTH} levels", source=source)
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, start = stack.pop()
            if anchor:
                sizes[anchor] = total - start
        if total > MAX_NODES:
            raise InputError(
                f"expands to more than {MAX_NODES:,} values (YAML aliases?)", source=source
            )


# ---------------------------------------------------------------------------------------------
# JSON


def _json_depth(text: str) -> int:
    """Deepest bracket nesting outside strings, without recursion."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    steps = (1 if char in "[{" else -1 for char in brackets)
    return max(accumulate(steps, initial=0))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _load_json(text: str, source: str) -> Any:
    if _json_depth(text) > MAX_DEPTH:
        raise InputError(f"nested deeper than {MAX_DEPTH} levels", source=source)
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as err:
        raise InputError(f"invalid JSON at line {err.lineno}: {err.msg}", source=source) from None
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as err:
        raise InputError(f"invalid JSON value ({_reason(err)})", source=source) from None


# ---------------------------------------------------------------------------------------------
# the loaded tree


def _check_tree(data: Any, source: str) -> None:
    """String keys only, at most ``MAX_NODES`` nodes (iterative: no recursion on user data).
    Nodes shared through aliases are visited once per reference, as a consumer would."""
    todo, seen = [(data, 0)], 0
    while todo:
        node, depth = todo.pop()
        seen += 1
        if seen > MAX_NODES or depth > MAX_DEPTH:
            raise InputError(f"more than {MAX_NODES:,} values or {MAX_DEPTH} levels", source=source)
        if isinstance(node, dict):
            for key, value in node.items():
                if not isinstance(key, str):
                    raise InputError(f"keys must be strings, got {excerpt(key)}", source=source)
                todo.append((value, depth + 1))
        elif isinstance(node, list):
            todo.extend((item, depth + 1) for item in node)


def _reason(err: BaseException) -> str:
    return shorten(str(err).split("\n")[0], 120) or type(err).__name__


def _display(path: str | Path) -> str:
    """A path for messages: cut when absurdly long (the OS refuses such names anyway)."""
    text = str(path)
    return text if len(text) <= 200 else text[:120] + "..." + text[-40:]
