"""A communication profile as a YAML file: written atomically, read back as untrusted input
(every entry checked against the profile's dataclasses, bounded in size and number)."""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Mapping
from pathlib import Path

import yaml

from autopar.base.errors import InputError, excerpt, shorten
from autopar.base.files import printable, write_atomic
from autopar.calibration.fit import SPANS, CollectiveFit, Curve, Regime
from autopar.calibration.profile import CommProfile, GemmPoint, SourceLog
from autopar.costs.comm import COLLECTIVES, CollectiveModel
from autopar.inputs.safe_yaml import load_mapping

PROFILE_VERSION = 1


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _plain(obj: object) -> object:
    """Frozen dataclasses -> YAML-safe builtins (tuples as lists, inf as None)."""
    if hasattr(obj, "__dataclass_fields__"):
        return {
            name: _plain(getattr(obj, name))
            for name in obj.__dataclass_fields__
            if name != "fallback"
        }
    if isinstance(obj, tuple | list):
        return [_plain(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, str):  # a log's name may not be UTF-8: YAML holds it as \xff
        return printable(obj)
    return obj


def profile_to_dict(profile: CommProfile) -> dict[str, object]:
    data = _plain(profile)
    assert isinstance(data, dict)
    return {"version": PROFILE_VERSION, **data}


def save_profile(profile: CommProfile, path: str | Path) -> None:
    """Write ``profile.yaml`` atomically (temporary file in the same folder, then os.replace)."""
    path = Path(path)
    write_atomic(
        path, yaml.safe_dump(profile_to_dict(profile), sort_keys=False, default_flow_style=None)
    )


MAX_PROFILE_BYTES = 64 << 20
"""A profile holds curves of many logs: up to 64 MiB."""
MAX_PROFILE_ITEMS = 100_000
"""Entries of any list in a profile (curves, fits, points of a curve ...)."""
MAX_PROFILE_NUMBER = 1e30
"""Any number in a profile (sizes in bytes, times in s, FLOP/s) is finite and at most this."""


def _bad(rule: str, *, source: str, where: str) -> InputError:
    return InputError(rule, source=source, field=where)


def _scalar(value: object, kind: str, *, source: str, where: str) -> object:
    """One field value of type ``kind`` (``int``, ``float``, ``str``, ``bool``), checked: numbers
    finite, non-negative and at most ``MAX_PROFILE_NUMBER``."""
    if kind == "str":
        if not isinstance(value, str) or len(value) > 4096:
            raise _bad(f"must be a string, got {excerpt(value)}", source=source, where=where)
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise _bad(f"must be true or false, got {excerpt(value)}", source=source, where=where)
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(f"must be a number, got {excerpt(value)}", source=source, where=where)
    if kind == "int" and not (isinstance(value, int) or float(value).is_integer()):
        raise _bad(f"must be an integer, got {excerpt(value)}", source=source, where=where)
    if isinstance(value, int) and value.bit_length() > 100:
        raise _bad(f"out of range: {excerpt(value)}", source=source, where=where)
    if not (math.isfinite(value) and 0 <= value <= MAX_PROFILE_NUMBER):
        raise _bad(
            f"must be a finite number in 0..{MAX_PROFILE_NUMBER:g}, got {excerpt(value)}",
            source=source,
            where=where,
        )
    return int(value) if kind == "int" else float(value)


def _value(value: object, annotation: str, *, source: str, where: str) -> object:
    """A field value by its dataclass annotation (``float``, ``str | None``,
    ``tuple[int, ...]``...); tuples of dataclasses are built by the caller."""
    if annotation.endswith(" | None"):
        if value is None:
            return None
        annotation = annotation.removesuffix(" | None")
    if annotation.startswith("tuple["):
        if not isinstance(value, list | tuple) or len(value) > MAX_PROFILE_ITEMS:
            raise _bad(f"must be a list, got {excerpt(value)}", source=source, where=where)
        kind = annotation.removeprefix("tuple[").split(",")[0]
        return tuple(
            _scalar(item, kind, source=source, where=f"{where}[{i}]")
            for i, item in enumerate(value)
        )
    return _scalar(value, annotation, source=source, where=where)


def _build(cls: type, data: object, *, source: str, where: str = "") -> object:
    """``cls`` from a mapping of its fields, each type-checked (a profile is a user file)."""
    where = where or cls.__name__
    if not isinstance(data, Mapping):
        raise _bad(f"must be a mapping, got {excerpt(data)}", source=source, where=where)
    hints = {name: f.type for name, f in cls.__dataclass_fields__.items() if name != "fallback"}
    values: dict[str, object] = {}
    for name, annotation in hints.items():
        if name not in data:
            continue
        value = data[name]
        if name == "median_abs_pct_error" and value is None:
            values[name] = math.nan  # saved as null when not computed
        elif name == "regimes":
            values[name] = value  # built by the caller
        else:
            values[name] = _value(value, str(annotation), source=source, where=f"{where}.{name}")
    try:
        built = cls(**values)
    except TypeError as err:  # a required field is missing
        raise _bad(f"bad entry ({shorten(err, 80)})", source=source, where=where) from None
    _check_entry(built, source=source, where=where)
    return built


def _check_entry(entry: object, *, source: str, where: str) -> None:
    """Rules across fields: known collectives and spans, curves that can be interpolated."""
    collective = entry.collective if isinstance(entry, Curve | CollectiveFit) else None
    if collective is not None and collective not in COLLECTIVES:
        raise _bad(
            f"unknown collective {excerpt(collective)}; expected one of {', '.join(COLLECTIVES)}",
            source=source,
            where=where,
        )
    if isinstance(entry, CollectiveFit) and entry.span not in SPANS:
        raise _bad(
            f"span must be intra or inter, got {excerpt(entry.span)}", source=source, where=where
        )
    if isinstance(entry, Curve):
        sizes, times = entry.size_bytes, entry.time_s
        if not sizes or len(sizes) != len(times):
            raise _bad(
                "size_bytes and time_s must be non-empty lists of one length",
                source=source,
                where=where,
            )
        if min(sizes) <= 0 or min(times) <= 0 or any(b <= a for a, b in itertools.pairwise(sizes)):
            raise _bad(
                "sizes must be positive and increasing, times positive", source=source, where=where
            )
    if isinstance(entry, Curve | SourceLog) and min(entry.num_ranks, entry.num_nodes) < 1:
        raise _bad("num_ranks and num_nodes must be >= 1", source=source, where=where)
    if isinstance(entry, GemmPoint) and min(entry.m, entry.n, entry.k, entry.flop_per_s) <= 0:
        raise _bad("m, n, k and flop_per_s must be positive", source=source, where=where)


def _entries(data: Mapping[str, object], key: str, *, source: str) -> list[object]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_PROFILE_ITEMS:
        raise _bad(f"must be a list, got {excerpt(value)}", source=source, where=key)
    return value


def profile_from_dict(
    data: Mapping[str, object], *, source: str, fallback: CollectiveModel | None = None
) -> CommProfile:
    if not isinstance(data, Mapping) or data.get("version") != PROFILE_VERSION:
        raise InputError(f"not a version {PROFILE_VERSION} autopar profile", source=source)
    fits = []
    for i, entry in enumerate(_entries(data, "fits", source=source)):
        where = f"fits[{i}]"
        if not isinstance(entry, Mapping):
            raise _bad(f"must be a mapping, got {excerpt(entry)}", source=source, where=where)
        raw = entry.get("regimes")
        if not isinstance(raw, list) or not 1 <= len(raw) <= 16:
            raise _bad("regimes must be a list of 1 to 16 entries", source=source, where=where)
        regimes = tuple(
            _build(Regime, r, source=source, where=f"{where}.regimes[{j}]")
            for j, r in enumerate(raw)
        )
        fits.append(
            _build(CollectiveFit, {**entry, "regimes": regimes}, source=source, where=where)
        )
    return CommProfile(
        curves=_built(Curve, data, "curves", source),
        fits=tuple(fits),
        sources=_built(SourceLog, data, "sources", source),
        gemm=_built(GemmPoint, data, "gemm", source),
        fallback=fallback,
    )


def _built(cls: type, data: Mapping[str, object], key: str, source: str) -> tuple:
    return tuple(
        _build(cls, entry, source=source, where=f"{key}[{i}]")
        for i, entry in enumerate(_entries(data, key, source=source))
    )


def load_profile(path: str | Path, *, fallback: CollectiveModel | None = None) -> CommProfile:
    """Read a ``profile.yaml`` written by ``save_profile`` (bounded, safe loading, every field
    type-checked: ``InputError`` naming the entry otherwise)."""
    data = load_mapping(path, max_bytes=MAX_PROFILE_BYTES)
    return profile_from_dict(data, source=str(path), fallback=fallback)
