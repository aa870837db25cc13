"""Estimates and solve results as text tables, JSON-ready dicts and pandas frames.

Bytes become GiB only here. Library code returns strings; the CLI prints them.
"""

from __future__ import annotations

from collections.abc import Sequence

from autopar.base.axes import AXES
from autopar.inputs.echo import inputs_text
from autopar.inputs.specs import GIB
from autopar.layout.plan import Estimate, Layout
from autopar.layout.results import Explanation, SolveResult, Ties, memory_categories
from autopar.layout.stages import PerStage
from autopar.outputs.why import alternatives_text


def layout_text(estimate: Estimate) -> str:
    return estimate.layout.text()


def _bar(fraction: float, width: int = 24) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "#" * filled + "." * (width - filled)


def estimate_text(estimate: Estimate) -> str:
    """The layout, headline figures, and memory and time breakdowns."""
    lines = [f"inputs       {inputs_text(estimate.inputs)}"] if estimate.inputs else []
    lines.append(f"layout       {layout_text(estimate)}")
    if estimate.choices:
        chosen = " ".join(f"{k}={v}" for k, v in estimate.choices.items())
        lines.append(f"chosen       {chosen}")
    band = f" ({estimate.error_band['text']})" if estimate.error_band else ""
    lines += [
        f"step time    {estimate.step_time_s:.3f} s{band}   tokens/s {estimate.tokens_per_s:,.0f}"
        f"   ({estimate.tokens_per_s / estimate.layout.num_gpus:,.0f} per GPU)",
        f"utilisation  MFU {estimate.mfu:.1%}   HFU {estimate.hfu:.1%}",
        *_schedule_lines(estimate),
        *goodput_lines(estimate),
        "",
        f"memory per GPU (most loaded rank)        {'fits' if estimate.fits else 'DOES NOT FIT'}",
    ]
    capacity = estimate.capacity_bytes
    for category in (*memory_categories(estimate), "total"):
        value = estimate.memory_bytes[category]
        lines.append(f"  {category:<12} {value / GIB:8.2f} GiB  {_bar(value / capacity)}")
    kept = (estimate.inputs or {}).get("memory_reserve_bytes") or 0
    note = f"  (after {kept / GIB:.2f} GiB kept free, --memory-reserve-gib)" if kept else ""
    lines.append(f"  {'capacity':<12} {capacity / GIB:8.2f} GiB{note}")
    if estimate.memory_bytes.get("reserve"):
        lines.append("  (reserve: CUDA context, NCCL buffers and allocator fragmentation)")
    lines.append("")
    lines.append("time per step")
    step = estimate.step_time_s
    for category, value in estimate.time_s.items():
        lines.append(f"  {category:<12} {value:8.3f} s  {value / step:6.1%}  {_bar(value / step)}")
    lines.append("  (communication shown is what is not hidden behind compute)")
    if estimate.per_stage is not None:
        lines += ["", stages_text(estimate.per_stage, step_time_s=estimate.step_time_s)]
    return "\n".join(lines)


def schedule_name(layout) -> str:
    """The layout's pipeline schedule as the report names it (``1f1b`` with virtual stages is
    interleaved 1F1B)."""
    name = layout.pipeline_schedule
    return f"interleaved {name}" if name == "1f1b" and layout.vpp > 1 else name


def _schedule_lines(estimate: Estimate) -> list[str]:
    if estimate.layout.pp == 1 and estimate.layout.pipeline_schedule == "1f1b":
        return []
    share = estimate.bubble_fraction
    return [f"pipeline     {schedule_name(estimate.layout)}, bubble {share:.1%} of the pipeline"]


def _bytes_text(value: float) -> str:
    return f"{value / 1e9:,.2f} GB" if value >= 1e8 else f"{value / 1e6:,.1f} MB"


def goodput_lines(estimate: Estimate) -> list[str]:
    """Failures, the checkpoint, its interval and the goodput (issue 22); days to train and
    cost with and without failures when the run's tokens (and price) are given."""
    g = estimate.goodput
    if g is None:
        return []
    mode = "async: the host copy blocks" if g.async_checkpoint else "sync"
    lines = [
        f"failures     {g.interruptions_per_day:.2f} interruptions/day (one per "
        f"{g.job_mtbf_s / 3600:.2f} h; MTBF {g.gpu_mtbf_hours:,.0f} h per GPU), "
        f"restart {g.restart_s:,.0f} s",
        f"checkpoint   {_bytes_text(g.checkpoint_bytes_per_gpu)} per GPU, "
        f"{_bytes_text(g.checkpoint_bytes_per_server)} per server: write "
        f"{g.checkpoint_write_s:.2f} s, blocks {g.checkpoint_blocking_s:.2f} s ({mode})",
        f"interval     every {g.checkpoint_interval_steps:,} steps "
        f"({g.checkpoint_interval_s:,.0f} s; --save-interval {g.checkpoint_interval_steps})",
        f"goodput      {g.goodput:.1%} of wall time trains   "
        f"{_useful_text(g.time_per_useful_step_s)} s per useful step",
    ]
    if estimate.days_to_train is not None:
        days = (
            f"days         {estimate.days_to_train:,.1f} to train "
            f"({estimate.days_to_train_failure_free:,.1f} without failures)"
        )
        if estimate.cost is not None:
            days += (
                f"   cost {estimate.cost:,.0f} ({estimate.cost_failure_free:,.0f} without failures)"
            )
        lines.append(days)
    return lines


def stages_text(per_stage: PerStage, *, step_time_s: float) -> str:
    """The per-stage pipeline plan of an estimate (``Estimate.per_stage``): layers per chunk and
    their kinds, what the stage also holds, recompute, one micro-batch's time, peak memory,
    micro-batches in flight per chunk, and the simulated step against the formula's."""
    cells = [
        ["stage", "layers", "chunks", "kinds", "holds", "recompute", "ms/mb", "GiB", "in flight"]
    ]
    for stage in per_stage.stages:
        kinds = ", ".join(f"{n} {kind}" for kind, n in stage.layer_kinds.items())
        cells.append(
            [
                str(stage.stage),
                str(sum(stage.chunk_layers)),
                "+".join(map(str, stage.chunk_layers)),
                kinds or "-",
                "+".join(stage.holds) or "-",
                stage.recompute,
                f"{stage.time_s * 1e3:.1f}",
                f"{stage.memory_bytes / GIB:.1f}",
                "+".join(map(str, stage.in_flight)),
            ]
        )
    widths = [max(len(row[c]) for row in cells) for c in range(len(cells[0]))]
    rows = [" ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    text = per_stage.schedule_text(step_time_s)
    return "\n".join(["pipeline plan (per stage)", *rows, text])


def runners_up_text(
    estimates: Sequence[Estimate], *, objective: str = "step-time", ties: Ties | None = None
) -> str:
    """One row per layout: every axis that varies or is not at its default, then the figures
    (with the goodput objective, the goodput and the expected time per useful step too); with
    ``ties``, a ``tie`` column marks the layouts within the error band of the fastest (``=``),
    the fastest (``fastest``) and the preferred tie (``prefer``)."""
    useful = objective == "goodput" and all(e.goodput is not None for e in estimates)
    axes = [
        axis
        for axis in AXES
        if axis.show == "always"
        or any(getattr(e.layout, axis.layout_attr) != axis.default for e in estimates)
    ]
    tie_head = ["tie"] if ties else []
    cells = [
        [
            "#",
            *(axis.title for axis in axes),
            "step s",
            *(("goodput", "useful s") if useful else ()),
            "tok/s/GPU",
            "MFU",
            "GiB",
            *tie_head,
        ],
        *(
            [
                str(i),
                *(_cell(getattr(e.layout, axis.layout_attr)) for axis in axes),
                f"{e.step_time_s:.3f}",
                *(
                    (f"{e.goodput.goodput:.1%}", _useful_text(e.goodput.time_per_useful_step_s))
                    if useful
                    else ()
                ),
                f"{e.tokens_per_s / e.layout.num_gpus:,.0f}",
                f"{e.mfu:.1%}",
                f"{e.memory_bytes['total'] / GIB:.1f}",
                *([_tie_mark(ties, i - 1)] if ties else []),
            ]
            for i, e in enumerate(estimates, 1)
        ),
    ]
    widths = [max(len(row[c]) for row in cells) for c in range(len(cells[0]))]
    return "\n".join(
        " ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells
    )


def _tie_mark(ties: Ties, index: int) -> str:
    if index == ties.fastest_index:
        return "fastest"
    if index == ties.preferred_index:
        return "prefer"
    return "=" if index in ties.tied else ""


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def solve_text(result: SolveResult) -> str:
    """A solve result for people: status, the chosen layout in full, then the runners-up."""
    status = {"optimal": "proven optimal", "feasible": "best found (time limit)"}.get(
        result.status, result.status
    )
    if result.best.per_stage is not None:
        # per-stage plans: the search ranks by the schedule formula; the figures are the
        # simulated schedule (the notes say both)
        status += " for the schedule formula"
    if result.objective == "goodput":
        status += " for the expected time per useful step"
    head = f"status       {status} in {result.solve_time_s:.2f} s"
    if result.status == "feasible" and result.gap is not None:
        head += f" (gap to the proven bound {result.gap:.1%})"
    covers = [f"covers       {result.proof.text()}"] if result.proof else []
    ties = [f"ties         {result.ties.text()}"] if result.ties else []
    notes = [f"note         {note}" for note in result.notes]
    parts = [head, *covers, *ties, *notes, estimate_text(result.best)]
    if len(result.layouts) > 1:
        parts += [
            "",
            "best layouts",
            runners_up_text(result.layouts, objective=result.objective, ties=result.ties),
        ]
    if result.alternatives is not None:
        parts += ["", alternatives_text(result.alternatives)]
    return "\n".join(parts)


def explanation_text(result: SolveResult) -> str:
    """Why nothing fits: the conflicting rule families, the nearest miss, the changes that fit."""
    explanation = result.explanation or Explanation(summary="no layout found")
    lines = [f"status       {result.status}"]
    if result.inputs:
        lines.append(f"inputs       {inputs_text(result.inputs)}")
    if result.proof:
        lines.append(f"searched     {result.proof.text()}")
    lines += [f"note         {note}" for note in result.notes]
    for family in explanation.families:
        lines.append(f"conflict     {family.family}: {'; '.join(family.rules)}")
    miss = explanation.nearest_miss
    if miss:
        step = f", {miss.step_time_s:.2f} s" if miss.step_time_s else ""
        lines.append(
            f"nearest miss {miss.min_memory_bytes / GIB:.1f} GiB per GPU at best, "
            f"{Layout(**miss.layout).text()}{step} "
            f"(capacity {miss.capacity_bytes / GIB:.1f} GiB)"
        )
        if miss.least_layout and miss.least_layout != miss.layout:
            lines.append(
                f"             (at any speed {miss.least_memory_bytes / GIB:.1f} GiB, "
                f"{Layout(**miss.least_layout).text()}, {miss.least_step_time_s:.2f} s)"
            )
    if explanation.suggestions:
        lines.append("would fit:")
        lines += [f"  - {change}" for change in explanation.suggestions]
    elif not explanation.families:
        lines.append(explanation.summary)
    return "\n".join(lines)


def _useful_text(useful_s: float | None) -> str:
    """Seconds per useful step, or "never" where the goodput is 0."""
    return "never" if useful_s is None else f"{useful_s:.3f}"
