"""Why this layout (issue 24): for each layout axis, the fastest layout with that axis changed,
what it costs and which part of the step grows; and, for a given layout, how far it is from the
optimum. Types only; ``autopar.search.alternatives`` finds them, ``autopar.outputs.report``
prints them, ``to_dict()`` is the JSON (``alternatives`` in ``solve.schema.json``, ``optimum`` in
``evaluate.schema.json``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from autopar.base.axes import AXIS
from autopar.layout.plan import Estimate, Layout

Outcome = Literal["found", "none fits", "none allowed", "cut short"]
Method = Literal["enumeration"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Alternative:
    """The fastest layout whose ``axis`` differs from the chosen layout's, or why there is none."""

    axis: str
    chosen: Any
    """The chosen layout's value of the axis."""
    outcome: Outcome
    estimate: Estimate | None = None
    """The fastest fitting layout with another value of the axis (``found``)."""
    slowdown: float | None = None
    """Its step time over the chosen one's, less 1 (0.061: 6.1% slower)."""
    grows: str | None = None
    """The time category (``estimate.time_s`` key) that grows most from the chosen layout."""
    min_memory_bytes: float | None = None
    """``none fits``: the least memory per GPU of any layout with the axis changed."""
    proven: bool = True
    """Whether the layout is known to be the fastest: always, as every layout was scored (the
    JSON keeps the field)."""

    @property
    def value(self) -> Any:
        return None if self.estimate is None else _value(self.estimate.layout, self.axis)

    def also(self, chosen: Layout) -> dict[str, Any]:
        """The other axes the alternative changes too (``{"pp": 4, "vpp": 20}``)."""
        if self.estimate is None:
            return {}
        return {
            name: _value(self.estimate.layout, name)
            for name in AXIS
            if name != self.axis and _value(self.estimate.layout, name) != _value(chosen, name)
        }

    def to_dict(self, chosen: Estimate) -> dict[str, Any]:
        out: dict[str, Any] = {
            "axis": self.axis,
            "chosen": self.chosen,
            "outcome": self.outcome,
            "value": self.value,
            "slowdown": self.slowdown,
            "grows": self.grows,
            "proven": self.proven,
            "also": self.also(chosen.layout),
            "min_memory_bytes": self.min_memory_bytes,
        }
        if self.estimate is not None:
            out["step_time_s"] = self.estimate.step_time_s
            out["time_s"] = dict(self.estimate.time_s)
            out["layout"] = self.estimate.layout.to_dict()
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Alternatives:
    """One ``Alternative`` per layout axis the problem leaves more than one value, and how they
    were found."""

    chosen: Estimate
    items: tuple[Alternative, ...]
    method: Method
    """``enumeration``: every layout the rules allow was scored (exact)."""
    layouts: int | None
    """How many layouts the enumeration scored; None when the time limit ran out first (every
    axis ``cut short``)."""
    time_s: float
    """What finding them added to the solve (little when the search's own scoring by step time
    is read: ``autopar.search.alternatives.find_alternatives``)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "layouts": self.layouts,
            "time_s": self.time_s,
            "axes": [item.to_dict(self.chosen) for item in self.items],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Optimum:
    """The fastest layout of the problem, against a given one (``evaluate``)."""

    estimate: Estimate
    gap: float
    """The given layout's step time over the optimum's, less 1 (0 when it is the optimum)."""
    proven: bool
    method: Method
    layouts: int | None = None
    time_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_time_s": self.estimate.step_time_s,
            "gap": self.gap,
            "proven": self.proven,
            "method": self.method,
            "layouts": self.layouts,
            "time_s": self.time_s,
            "layout": self.estimate.layout.to_dict(),
        }


def _value(layout: Layout, axis: str) -> Any:
    return getattr(layout, AXIS[axis].layout_attr)
