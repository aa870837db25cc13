"""Choose the rendering of a result by ``--format``.

``table`` is for people, ``json`` is the machine contract (``autopar/schemas/*.schema.json``),
``csv`` is one row per layout, and the formats of ``autopar.outputs.emit.FORMATS`` (``megatron``,
``megatron-bridge``, ``torchtitan``, ``torchtitan-0.2``, ``deepspeed``) emit the best layout as
that framework's launch configuration.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any

import typer

from autopar.base.errors import InputError, excerpt
from autopar.cli.output import emit, to_json
from autopar.inputs.specs import Problem
from autopar.layout.alternatives import Optimum
from autopar.layout.plan import Estimate
from autopar.layout.results import flat_row
from autopar.outputs import emit as emitters
from autopar.outputs.report import estimate_text, explanation_text, solve_text
from autopar.outputs.why import optimum_text

FORMATS: tuple[str, ...] = ("table", "json", "csv", *emitters.EMITTERS)
WHY_FORMATS: tuple[str, ...] = ("table", "json")
"""The formats that say why a layout (solve's alternatives, evaluate's gap to the optimum);
launcher files and CSV rows do not, so those commands skip the search for them."""
LAUNCHERS: tuple[str, ...] = tuple(emitters.EMITTERS)
"""The formats that write one layout's launch configuration."""


def _check(fmt: str, formats: Sequence[str] = FORMATS) -> None:
    if fmt not in formats:
        raise InputError(
            f"must be one of {', '.join(formats)}, got {excerpt(fmt)}", source="--format"
        )


def check_format(fmt: str) -> None:
    """Before any work: ``--format`` is one this command renders."""
    _check(fmt)


def implied_by_format(
    formats: Sequence[str], framework: str | None, stack_options: dict[str, Any]
) -> tuple[str, dict[str, Any], str | None]:
    """The framework and stack options to solve with for the ``--format`` list (one problem
    solved once for all of them, ``format_targets``), and the note saying what the formats
    implied. A launch format plans under its framework's rules (``autopar.outputs.emit.FORMATS``)
    and, unless ``--stack`` names one, its stack preset's defaults; an explicit ``--framework``
    that differs, or two formats that imply different frameworks or stacks, are bad input."""
    specs = [(fmt, emitters.FORMATS[fmt]) for fmt in formats if fmt in emitters.FORMATS]
    if not specs:
        return framework or "megatron", stack_options, None
    fmt, spec = specs[0]
    for other, other_spec in specs[1:]:
        if other_spec.framework != spec.framework or (
            stack_options.get("stack") is None
            and None not in (spec.stack, other_spec.stack)
            and other_spec.stack != spec.stack
        ):
            raise InputError(
                f"--format {fmt} and {other} are launched by different frameworks or stacks "
                f"({spec.framework} {spec.stack or 'default'}, {other_spec.framework} "
                f"{other_spec.stack or 'default'}); one solve cannot plan for both: ask for "
                "them in separate calls",
                source="--format",
            )
    if framework is not None and framework != spec.framework:
        raise InputError(
            f"{excerpt(framework)} conflicts with --format {fmt}, which is launched by "
            f"{spec.framework}; drop --framework or use --framework {spec.framework}",
            source="--framework",
        )
    implied = []
    if framework is None and spec.framework != "megatron":
        implied.append(f"framework {spec.framework}")
    stack_fmt, stack = next(((f, s.stack) for f, s in specs if s.stack is not None), (fmt, None))
    if stack is not None and stack_options.get("stack") is None:
        stack_options = {**stack_options, "stack": stack}
        implied.append(f"stack {stack}")
    note = f"{', '.join(implied)} (implied by --format {stack_fmt})" if implied else None
    return spec.framework, stack_options, note


def format_targets(fmt: str, output: str | None) -> list[tuple[str, str | None]]:
    """``--format`` as one format or several, comma-separated (``json,megatron``), each with its
    ``--output`` file: one problem solved once, written in every format asked for (issue 21:
    two calls of the same problem could give two answers). Several formats need as many files,
    comma-separated in the same order."""
    formats = [f.strip() for f in fmt.split(",")] if isinstance(fmt, str) else [fmt]
    for one in formats:
        _check(one)
    if len(formats) == 1:
        return [(formats[0], output)]
    files = [f.strip() for f in output.split(",")] if output else []
    if len(files) != len(formats) or not all(files):
        raise InputError(
            f"{len(formats)} formats need {len(formats)} files, comma-separated in the same "
            f"order, got {excerpt(output)}",
            source="--output",
        )
    return list(zip(formats, files, strict=True))


def _framework_text(estimate: Estimate, fmt: str, problem: Problem | None) -> str:
    if problem is None:
        raise InputError(
            "needs the problem (model layers, sequence length, batch, precision): "
            "pass problem=autopar.make_problem(...)",
            source=f"--format {fmt}",
        )
    form = emitters.FORMATS[fmt]
    if estimate.per_stage is not None and not form.per_stage:
        raise emitters.refuse_stage_plan(fmt)
    return form.text(estimate, problem)


def framework_notes(estimate: Estimate | None, fmt: str, problem: Problem | None) -> list[str]:
    """What the launch script must do that ``fmt``'s output cannot say (the CLI writes these to
    stderr, after what the formats implied, ``implied_by_format``); empty for other formats or
    without a layout."""
    if fmt not in emitters.EMITTERS or problem is None or estimate is None:
        return []
    return [f"autopar: {note}" for note in emitters.FORMATS[fmt].notes(estimate, problem)]


def write_formats(
    targets: Sequence[tuple[str, str | None]],
    texts: Sequence[str],
    estimate: Estimate | None,
    problem: Problem | None,
    implied: str | None,
) -> None:
    """Every rendered format to its file (``format_targets``), after the line saying what the
    formats implied and followed by each launcher's notes, on stderr."""
    if implied:
        typer.echo(f"autopar: {implied}", err=True)
    for (fmt, path), text in zip(targets, texts, strict=True):
        emit(text, path)
        for note in framework_notes(estimate, fmt, problem):
            typer.echo(note, err=True)


def csv_text(rows: Sequence[dict[str, Any]]) -> str:
    """Records as CSV with a header row (columns in the order of the first record)."""
    if not rows:
        return ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue().rstrip("\n")


def render_estimate(
    estimate: Estimate,
    fmt: str,
    *,
    problem: Problem | None = None,
    optimum: Optimum | None = None,
    optimum_searched: bool = False,
) -> str:
    """``evaluate``'s output; with ``optimum_searched``, the table and JSON also say how far
    the layout is from ``optimum`` (``api.optimum_of``; None: none was found)."""
    _check(fmt)
    if fmt == "json":
        data = estimate.to_dict()
        if optimum_searched:
            data["optimum"] = optimum.to_dict() if optimum else None
        return to_json(data)
    if fmt == "csv":
        return csv_text([flat_row(estimate)])
    if fmt in emitters.EMITTERS:
        return _framework_text(estimate, fmt, problem)
    text = estimate_text(estimate)
    return f"{text}\n\n{optimum_text(optimum, estimate)}" if optimum_searched else text


def render_solve(result, fmt: str, *, problem: Problem | None = None) -> str:
    _check(fmt)
    if fmt == "json":
        return to_json(result.to_dict())
    if fmt == "csv" and result.layouts:
        return csv_text([flat_row(e) for e in result.layouts])
    if fmt == "csv":  # no layout: the explanation, one line per row of a one-column CSV
        return csv_text([{"explanation": line} for line in explanation_text(result).splitlines()])
    if not result.layouts:
        if fmt in emitters.EMITTERS:  # a launcher file that says why it launches nothing
            lines = explanation_text(result).splitlines()
            return "\n".join(
                [f"# autopar: no layout (status {result.status})"] + [f"# {line}" for line in lines]
            )
        return explanation_text(result)
    if fmt in emitters.EMITTERS:
        return _framework_text(result.best, fmt, problem)
    return solve_text(result)
