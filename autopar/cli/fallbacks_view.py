"""``solve --fallback-nodes K``: the fallback layouts for losing 1..K servers
(``autopar.sweeps.fallbacks``) as text, JSON and CSV next to the solve, and one of them
(``--emit-fallback k``) in a launcher format."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from autopar.base.errors import InputError
from autopar.cli.failure_options import FAILURES
from autopar.cli.output import to_json
from autopar.layout.results import flat_row

FallbackNodes = Annotated[
    int | None,
    typer.Option(
        "--fallback-nodes",
        help="Also find the best layout after losing 1..K servers (a GB200 NVL72 compute tray "
        "holds 4 GPUs), on the GPUs left, keeping the global batch (see --batch-tolerance).",
        rich_help_panel=FAILURES,
    ),
]
BatchTolerance = Annotated[
    float,
    typer.Option(
        "--batch-tolerance",
        help="Fallbacks may change the global batch by up to this fraction (0..0.5; default 0: "
        "exactly the job's).",
        rich_help_panel=FAILURES,
    ),
]
EmitFallback = Annotated[
    int | None,
    typer.Option(
        "--emit-fallback",
        help="With a launcher --format: write the launch configuration of the fallback for "
        "losing this many servers instead of the job's.",
        rich_help_panel=FAILURES,
    ),
]


def check_fallback_flags(
    fmt: str, nodes: int | None, emit: int | None, launchers, pipeline_plan: str = "uniform"
) -> None:
    """A launcher format writes one layout: with fallbacks, ``--emit-fallback`` names which;
    fallbacks are uniform pipelines."""
    if nodes is not None and pipeline_plan != "uniform":
        raise InputError(
            "fallbacks search uniform pipelines; drop --pipeline-plan per-stage",
            source="--fallback-nodes",
        )
    if emit is not None and nodes is None:
        raise InputError("needs --fallback-nodes K (K >= the fallback)", source="--emit-fallback")
    if emit is not None and not 1 <= emit <= nodes:
        raise InputError(f"must be in 1..{nodes} (--fallback-nodes)", source="--emit-fallback")
    if nodes is not None and fmt in launchers and emit is None:
        raise InputError(
            f"--format {fmt} writes one layout: add --emit-fallback N (1..{nodes}) for a "
            "fallback's, or use table, json or csv for all of them",
            source="--fallback-nodes",
        )


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def fallbacks_text(result) -> str:
    """The rows for people: what is left, what the fallback uses, its status and layout."""
    head = [
        "lost", "left", "uses", "idle", "batch", "status", "tok/s", "vs job", "layout",
    ]  # fmt: skip
    cells = [head]
    notes = []
    for row in result.rows:
        layout = row.estimate.layout.text() if row.estimate else row.explanation.summary
        idle = None if row.gpus is None else row.remaining_gpus - row.gpus
        cells.append(
            [
                str(row.lost_servers),
                f"{row.remaining_gpus:,}",
                _cell(row.gpus, ","),
                _cell(idle, ","),
                _cell(row.global_batch, ""),
                row.status,
                _cell(row.tokens_per_s, ",.0f"),
                _cell(None if row.throughput_lost is None else -row.throughput_lost, "+.1%"),
                layout,
            ]
        )
        if row.note:
            notes.append(f"note {row.lost_servers:<7} {row.note}")
    widths = [max(len(r[c]) for r in cells) for c in range(len(head) - 1)]
    lines = [
        " ".join(v.rjust(w) for v, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in cells
    ]
    batch = (
        "exactly the job's"
        if not result.batch_tolerance
        else f"within {result.batch_tolerance:.0%}"
    )
    ranked = "useful tokens/s (goodput)" if result.objective == "goodput" else "tokens/s"
    title = (
        f"fallbacks    losing servers of {result.gpus_per_server} GPUs; global batch {batch}; "
        f"ranked by {ranked}"
    )
    proof = (
        f"proof        {result.candidates:,} (GPU count, batch) candidates, {result.refined:,} "
        f"bounded by their compute, {result.solved:,} solved by CP-SAT "
        f"({result.solve_time_s:.1f} s)"
    )
    return "\n".join([title, *lines, proof, *notes])


def fallbacks_dict(result) -> dict[str, Any]:
    """The JSON of the fallbacks beside a solve (its baseline is the solve itself)."""
    out = result.to_dict()
    out.pop("baseline", None)
    return out


def render_with_fallbacks(solve_text: str, result, fmt: str) -> str:
    """The solve's output with the fallbacks added (table, JSON) or as the rows (CSV)."""
    import json

    from autopar.cli.render import csv_text

    if fmt == "json":
        data = json.loads(solve_text)
        data["fallbacks"] = fallbacks_dict(result)
        return to_json(data)
    if fmt == "csv":
        rows = []
        for row in result.rows:
            record = {k: v for k, v in row.to_dict().items() if k not in ("layout", "explanation")}
            record["reason"] = row.explanation.summary if row.explanation else None
            record.update(flat_row(row.estimate) if row.estimate else {})
            rows.append(record)
        keys = list(dict.fromkeys(k for record in rows for k in record))
        return csv_text([{k: record.get(k) for k in keys} for record in rows])
    return f"{solve_text}\n\n{fallbacks_text(result)}"


def solve_with_fallbacks(
    result, problem, options: dict[str, Any], formats: list[str]
) -> tuple[list[str], int]:
    """The fallbacks of a solve (``options``: ``autopar.sweeps.fallbacks.fallbacks`` keywords,
    ``emit`` the one to write in a launcher format), searched once and rendered in each of
    ``formats``, and the exit code: 1 only when the fallback asked for in a launcher format has
    no layout."""
    from autopar.cli.render import render_estimate, render_solve
    from autopar.sweeps.fallbacks import fallbacks_problem

    emit = options.pop("emit")
    found = fallbacks_problem(problem, baseline=result, **options)
    if emit is None:
        texts = [
            render_with_fallbacks(render_solve(result, fmt, problem=problem), found, fmt)
            for fmt in formats
        ]
        return texts, 0
    row = found.rows[emit - 1]
    if row.estimate is None:
        lines = [f"# autopar: no fallback after losing {emit} servers ({row.status})"]
        lines.append(f"# {row.explanation.summary if row.explanation else ''}")
        return ["\n".join(lines)] * len(formats), 1
    return [render_estimate(row.estimate, fmt, problem=row.problem) for fmt in formats], 0
