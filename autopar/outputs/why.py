""" "Why this layout" for people (issue 24): one line per layout axis with the fastest layout that
changes it, what that costs and which part of the step grows; and, for ``evaluate``, the gap to
the optimum. The figures come from ``autopar.layout.alternatives``; the time categories are the
"time per step" rows printed above them (``Estimate.time_s``)."""

from __future__ import annotations

from typing import Any

from autopar.base.axes import AXIS
from autopar.inputs.specs import GIB
from autopar.layout.alternatives import Alternative, Alternatives, Optimum
from autopar.layout.plan import Estimate


def _shown(axis: str, value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _percent(fraction: float) -> str:
    return f"{fraction:+.2%}" if abs(fraction) < 0.001 else f"{fraction:+.1%}"


def _how(layouts: int | None, time_s: float) -> str:
    if layouts is None:  # the time limit ran out before the scoring covered the space
        return f"the time limit ran out before every layout was scored, {time_s:.2f} s"
    return f"every one of {layouts:,} layouts scored, {time_s:.2f} s"


def _line(item: Alternative, chosen: Estimate) -> str:
    title = AXIS[item.axis].title
    if item.outcome == "cut short":
        return f"{title}: not searched, the time limit ran out first (raise --time-limit)"
    if item.outcome == "none allowed":
        value = _shown(item.axis, item.chosen)
        return f"{title}: the rules allow no other value here than {value}"
    if item.outcome == "none fits":
        least = item.min_memory_bytes
        capacity = chosen.capacity_bytes / GIB
        return (
            f"{title}: no other value fits (at least {least / GIB:.1f} GiB per GPU with "
            f"{title} != {_shown(item.axis, item.chosen)}; capacity {capacity:.1f} GiB)"
        )
    estimate = item.estimate
    grows = item.grows
    before, after = chosen.time_s.get(grows, 0.0), estimate.time_s[grows]
    also = ", ".join(f"{AXIS[a].title} {_shown(a, v)}" for a, v in item.also(chosen.layout).items())
    text = (
        f"{title} {_shown(item.axis, item.value)} instead of {_shown(item.axis, item.chosen)}: "
        f"{_percent(item.slowdown)} ({estimate.step_time_s:.3f} s/step), because {grows} "
        f"grows {before:.3f} -> {after:.3f} s"
    )
    if also:
        text += f"; with {also}"
    return text


def alternatives_text(alternatives: Alternatives) -> str:
    """The "why this layout" block of ``solve``'s table output."""
    how = _how(alternatives.layouts, alternatives.time_s)
    lines = [f"why this layout (the fastest layout with each axis changed; {how})"]
    lines += [f"  {_line(item, alternatives.chosen)}" for item in alternatives.items]
    return "\n".join(lines)


def optimum_text(optimum: Optimum | None, given: Estimate) -> str:
    """``evaluate``'s line on the optimum: how much slower the given layout is."""
    if optimum is None:
        return "optimum      not found (no layout fits, or the time limit ran out first)"
    best = optimum.estimate
    how = _how(optimum.layouts, optimum.time_s)
    head = f"optimum      {best.step_time_s:.3f} s/step: {best.layout.text()} ({how})"
    indent = " " * 13
    if best.layout == given.layout:
        return f"{head}\n{indent}this layout is the optimum"
    if not given.fits:
        return f"{head}\n{indent}this layout does not fit; the optimum is the fastest that does"
    if abs(optimum.gap) < 1e-6:
        return f"{head}\n{indent}this layout ties with the optimum"
    if optimum.gap < 0:  # outside the default search space (a ZeRO stage or size it leaves out)
        faster = _percent(-optimum.gap)[1:]
        return (
            f"{head}\n{indent}this layout is {faster} faster: the search leaves it out by default"
        )
    return f"{head}\n{indent}this layout is {_percent(optimum.gap)[1:]} slower"
