"""Choose the rendering of a result by ``--format``."""

from __future__ import annotations

from autopar.cli.output import to_json
from autopar.errors import InputError
from autopar.plan import Estimate
from autopar.report import estimate_text, solve_text

FORMATS: tuple[str, ...] = ("table", "json")


def _check(fmt: str) -> None:
    if fmt not in FORMATS:
        raise InputError(f"must be one of {', '.join(FORMATS)}, got {fmt!r}", source="--format")


def render_estimate(estimate: Estimate, fmt: str, *, framework: str = "megatron") -> str:
    _check(fmt)
    if fmt == "json":
        return to_json(estimate.to_dict())
    return estimate_text(estimate)


def render_solve(result, fmt: str, *, framework: str = "megatron") -> str:
    _check(fmt)
    if fmt == "json":
        return to_json(result.to_dict())
    if not result.layouts:
        return f"status       {result.status}"
    return solve_text(result)
