"""Estimates and solve results as text tables, JSON-ready dicts and pandas frames.

Bytes become GiB only here. Library code returns strings; the CLI prints them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autopar.plan import Estimate
from autopar.specs import GIB
from autopar.terms import MEMORY_CATEGORIES, TIME_CATEGORIES


def flat_row(estimate: Estimate) -> dict[str, Any]:
    """One estimate as a flat record (layout, figures, memory in GiB, time per category)."""
    layout = estimate.layout
    row: dict[str, Any] = dict(estimate.to_dict()["layout"])
    row.update(
        fits=estimate.fits,
        step_time_s=estimate.step_time_s,
        tokens_per_s=estimate.tokens_per_s,
        tokens_per_s_per_gpu=estimate.tokens_per_s / layout.num_gpus,
        mfu=estimate.mfu,
        hfu=estimate.hfu,
        memory_gib=estimate.memory_bytes["total"] / GIB,
    )
    for category in MEMORY_CATEGORIES:
        row[f"memory_{category}_gib"] = estimate.memory_bytes.get(category, 0.0) / GIB
    for category in TIME_CATEGORIES:
        row[f"time_{category}_s"] = estimate.time_s.get(category, 0.0)
    return row


def estimates_frame(estimates: Sequence[Estimate]):
    """A pandas DataFrame, one row per estimate, best first."""
    import pandas as pd

    return pd.DataFrame([flat_row(e) for e in estimates])


def layout_text(estimate: Estimate) -> str:
    lay = estimate.layout
    parts = [f"TP={lay.tp}", f"PP={lay.pp}"]
    if lay.vpp > 1:
        parts.append(f"VPP={lay.vpp}")
    parts += [f"CP={lay.cp}", f"DP={lay.dp}"]
    if lay.ep > 1 or lay.etp > 1:
        parts += [f"EP={lay.ep}", f"ETP={lay.etp}"]
    parts += [
        f"mbs={lay.mbs}",
        f"grad_accum={lay.grad_accum}",
        f"recompute={lay.recompute}",
        f"ZeRO-{lay.zero}",
        f"SP={'on' if lay.sequence_parallel else 'off'}",
    ]
    return " ".join(parts)


def _bar(fraction: float, width: int = 24) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "#" * filled + "." * (width - filled)


def estimate_text(estimate: Estimate) -> str:
    """The layout, headline figures, and memory and time breakdowns."""
    lines = [
        f"layout       {layout_text(estimate)}",
        f"step time    {estimate.step_time_s:.3f} s   tokens/s {estimate.tokens_per_s:,.0f}"
        f"   ({estimate.tokens_per_s / estimate.layout.num_gpus:,.0f} per GPU)",
        f"utilisation  MFU {estimate.mfu:.1%}   HFU {estimate.hfu:.1%}",
        "",
        f"memory per GPU (most loaded rank)        {'fits' if estimate.fits else 'DOES NOT FIT'}",
    ]
    capacity = estimate.capacity_bytes
    for category in (*MEMORY_CATEGORIES, "total"):
        value = estimate.memory_bytes.get(category, 0.0)
        lines.append(f"  {category:<12} {value / GIB:8.2f} GiB  {_bar(value / capacity)}")
    lines.append(f"  {'capacity':<12} {capacity / GIB:8.2f} GiB")
    lines.append("")
    lines.append("time per step")
    step = estimate.step_time_s
    for category in TIME_CATEGORIES:
        value = estimate.time_s.get(category, 0.0)
        lines.append(f"  {category:<12} {value:8.3f} s  {value / step:6.1%}  {_bar(value / step)}")
    lines.append("  (communication shown is what is not hidden behind compute)")
    return "\n".join(lines)


def runners_up_text(estimates: Sequence[Estimate]) -> str:
    header = (
        f"{'#':>2} {'TP':>3} {'PP':>3} {'VPP':>3} {'CP':>3} {'DP':>5} {'EP':>3} {'mbs':>3} "
        f"{'GA':>5} {'recompute':>9} {'ZeRO':>4} {'step s':>8} {'tok/s/GPU':>9} {'MFU':>6}"
        f" {'GiB':>6}"
    )
    lines = [header]
    for i, e in enumerate(estimates, 1):
        lay = e.layout
        lines.append(
            f"{i:>2} {lay.tp:>3} {lay.pp:>3} {lay.vpp:>3} {lay.cp:>3} {lay.dp:>5} {lay.ep:>3} "
            f"{lay.mbs:>3} {lay.grad_accum:>5} {lay.recompute:>9} {lay.zero:>4} "
            f"{e.step_time_s:>8.3f} {e.tokens_per_s / lay.num_gpus:>9,.0f} {e.mfu:>6.1%} "
            f"{e.memory_bytes['total'] / GIB:>6.1f}"
        )
    return "\n".join(lines)


def solve_text(result) -> str:
    """A solve result for people: status, the chosen layout in full, then the runners-up."""
    status = {"optimal": "proven optimal", "feasible": "best found (time limit)"}.get(
        result.status, result.status
    )
    head = f"status       {status} in {result.solve_time_s:.2f} s"
    if result.status == "feasible" and result.gap is not None:
        head += f" (gap to the proven bound {result.gap:.1%})"
    parts = [head, estimate_text(result.best)]
    if len(result.layouts) > 1:
        parts += ["", "best layouts", runners_up_text(result.layouts)]
    return "\n".join(parts)


def explanation_text(result) -> str:
    """Why nothing fits: the conflicting rule families, the nearest miss, the changes that fit."""
    explanation = result.explanation or {}
    lines = [f"status       {result.status}"]
    for family in explanation.get("families", []):
        lines.append(f"conflict     {family['family']}: {'; '.join(family['rules'])}")
    miss = explanation.get("nearest_miss")
    if miss:
        lay = miss["layout"]
        lines.append(
            f"nearest miss {miss['min_memory_bytes'] / GIB:.1f} GiB per GPU at best, "
            f"TP={lay['tp']} PP={lay['pp']} CP={lay['cp']} DP={lay['dp']} mbs={lay['mbs']} "
            f"recompute={lay['recompute']} ZeRO-{lay['zero']} "
            f"(capacity {miss['capacity_bytes'] / GIB:.1f} GiB)"
        )
    suggestions = explanation.get("suggestions", [])
    if suggestions:
        lines.append("would fit:")
        lines += [f"  - {change}" for change in suggestions]
    elif not explanation.get("families"):
        lines.append(explanation.get("summary", ""))
    return "\n".join(lines)
