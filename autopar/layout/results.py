"""What a search answers: ``SolveResult`` (the best layouts, the status, the bound) and, when
nothing fits, its ``Explanation``; and the flat rows of estimates that CSV, sweeps and pandas
frames share. One type for the uniform and the per-stage search alike; the JSON contract is
``to_dict()`` (``autopar/schemas/solve.schema.json``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autopar.base.axes import AXES
from autopar.base.errors import InfeasibleError
from autopar.inputs.specs import GIB
from autopar.layout.alternatives import Alternatives
from autopar.layout.coverage import Coverage
from autopar.layout.plan import Estimate, Layout


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleFamily:
    """A family of layout rules in an infeasible core, with its rules as the user reads them."""

    family: str
    rules: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "rules": list(self.rules)}


@dataclass(frozen=True, slots=True, kw_only=True)
class NearestMiss:
    """The layout (and, for a per-stage plan, the stage) that comes closest to fitting, among
    the layouts worth training with (``autopar.search.explain.SENSIBLE_SLOWDOWN``); the least
    memory at any speed beside it when that is another layout."""

    min_memory_bytes: float
    capacity_bytes: float
    layout: dict[str, Any]
    """``Layout.to_dict()`` of the smallest footprint."""
    stage: int | None = None
    """The fullest stage of the closest per-stage plan."""
    stage_layers: int | None = None
    step_time_s: float | None = None
    least_memory_bytes: float | None = None
    """The least memory at any speed (splitting the sequence or the model past reason)."""
    least_layout: dict[str, Any] | None = None
    least_step_time_s: float | None = None

    def text(self) -> str:
        out = (
            f"The smallest per-GPU footprint worth training with is "
            f"{self.min_memory_bytes / GIB:.1f} GiB ({_layout_text(self.layout)}"
            + (f", {self.step_time_s:.2f} s" if self.step_time_s else "")
            + f"), above {self.capacity_bytes / GIB:.1f} GiB"
        )
        if self.least_layout and self.least_layout != self.layout and self.least_step_time_s:
            out += (
                f"; at any speed {self.least_memory_bytes / GIB:.1f} GiB "
                f"({_layout_text(self.least_layout)}, {self.least_step_time_s:.2f} s)"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        out = {
            "min_memory_bytes": self.min_memory_bytes,
            "capacity_bytes": self.capacity_bytes,
            "layout": self.layout,
        }
        if self.stage is not None:
            out.update(stage=self.stage, stage_layers=self.stage_layers)
        if self.step_time_s is not None:
            out.update(
                step_time_s=self.step_time_s,
                least_memory_bytes=self.least_memory_bytes,
                least_layout=self.least_layout,
                least_step_time_s=self.least_step_time_s,
            )
        return out


def _layout_text(layout: dict[str, Any]) -> str:
    return Layout(**layout).text()


@dataclass(frozen=True, slots=True, kw_only=True)
class Explanation:
    """Why no layout fits (DESIGN §3, "Infeasibility"): the binding rule families, the nearest
    miss when memory binds, the changes that were checked to fit, in one summary line."""

    summary: str
    families: tuple[RuleFamily, ...] = ()
    nearest_miss: NearestMiss | None = None
    suggestions: tuple[str, ...] = ()
    cut_short: bool = False
    """The time limit ended the explanation before every check ran."""

    @classmethod
    def time_ran_out(cls) -> Explanation:
        return cls(
            summary="the time limit ran out before any layout was found; raise --time-limit",
            cut_short=True,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "families": [f.to_dict() for f in self.families],
            "nearest_miss": self.nearest_miss.to_dict() if self.nearest_miss else None,
            "suggestions": list(self.suggestions),
            "cut_short": self.cut_short,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Proof:
    """How the status was established and over what: ``enumeration`` (every layout of the space
    scored: ``layouts`` of them) or ``cp-sat`` (CP-SAT's optimality proof or bound), over
    ``coverage`` (``autopar.layout.coverage``)."""

    method: str
    coverage: Coverage
    layouts: int | None = None

    def text(self) -> str:
        return self.coverage.text(self.layouts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "layouts": self.layouts,
            "covers": self.text(),
            **self.coverage.to_dict(),
        }


HEADROOM_FILL = 0.85
"""The share of the usable memory a preferred tie fills at most: the 83 published runs of the
validation fill a median 72% of their GPU's memory by autopar's prediction, three in four at most
83%, nine in ten at most 87% (``benchmarks/validate_published.py``, memory column)."""
PREFERENCE: tuple[str, ...] = (
    f"fills at most {HEADROOM_FILL:.0%} of the usable memory",
    "fastest",
    "fewest GPUs per model replica (tp*cp*pp)",
)
"""How autopar ranks layouts whose predicted step times tie within the error band."""
PREFER: tuple[str, ...] = ("fastest", "headroom")
"""``fastest``: the fastest prediction first, its ties marked; ``headroom``: the tied layouts
first, ranked by ``PREFERENCE``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ties:
    """The layouts whose step time is within the cost model's error band of the fastest
    (``|t - t_fastest| <= rel_error * t_fastest``, the band of the problem's class: issue 20)."""

    rel_error: float
    band: str
    """The band as the user reads it (``±8%, 38 published runs``)."""
    count: int
    """Layouts of the space within the band (the fastest included)."""
    tied: tuple[int, ...]
    """Indices of ``SolveResult.layouts`` that tie with the fastest."""
    fastest: Estimate
    preferred: Estimate
    """The tie ``PREFERENCE`` puts first."""
    prefer: str = "fastest"
    fastest_index: int | None = None
    """Index of ``fastest`` in ``SolveResult.layouts`` (``None``: not among them)."""
    preferred_index: int | None = None

    def text(self) -> str:
        fast = self.fastest
        fastest = f"the fastest ({fast.step_time_s:.3f} s, {_gib(fast)} GiB)"
        if self.count <= 1:
            return f"no other layout within the error band ({self.band}) of {fastest}"
        head = (
            f"{self.count - 1} layout{'s' if self.count != 2 else ''} tie with {fastest}: "
            f"within the error band ({self.band})"
        )
        order = ", then ".join(PREFERENCE)
        if self.prefer == "headroom":
            return f"{head}; ranked among them: {order}"
        if self.preferred.layout == fast.layout:
            return f"{head}; preferred among them ({order}): the fastest itself"
        pick = self.preferred
        where = f"#{self.preferred_index + 1}" if self.preferred_index is not None else "it"
        return (
            f"{head}; preferred among them ({order}): {pick.layout.text()} ({where}: "
            f"{_gib(pick)} GiB, {pick.step_time_s:.3f} s; --prefer headroom puts it first)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "rel_error": self.rel_error,
            "band": self.band,
            "count": self.count,
            "tied": list(self.tied),
            "fastest": _tie_dict(self.fastest, self.fastest_index),
            "preferred": _tie_dict(self.preferred, self.preferred_index),
            "prefer": self.prefer,
            "preference": list(PREFERENCE),
        }


def _tie_dict(estimate: Estimate, index: int | None) -> dict[str, Any]:
    return {
        "index": index,
        "layout": estimate.layout.to_dict(),
        "step_time_s": estimate.step_time_s,
        "memory_bytes": estimate.memory_bytes["total"],
    }


def _gib(estimate: Estimate) -> str:
    return f"{estimate.memory_bytes['total'] / GIB:.1f}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SolveResult:
    """What ``autopar.solve`` returns: status, timing and the best layouts, best first."""

    status: str
    """``optimal`` (proven), ``feasible`` (time limit hit; see ``gap``), ``infeasible``,
    ``unknown`` (nothing found within the time limit)."""
    solve_time_s: float
    layouts: tuple[Estimate, ...]
    best_bound_step_time_s: float | None = None
    """Lower bound proven by the solver on the objective: the best step time, or with
    ``objective == "goodput"`` the best expected time per useful step."""
    explanation: Explanation | None = None
    num_workers: int = 1
    notes: tuple[str, ...] = field(default_factory=tuple)
    inputs: dict[str, Any] | None = None
    """The assumptions behind the answer (``autopar.inputs.echo``)."""
    alternatives: Alternatives | None = None
    """Why this layout: the fastest layout with each axis changed (``solve(alternatives=True)``)."""
    objective: str = "step-time"
    """What the search minimised: ``step-time`` or ``goodput`` (the expected time per useful
    step under failures, ``Goodput.time_per_useful_step_s``)."""
    proof: Proof | None = None
    """What the status covers (the method and the space searched)."""
    ties: Ties | None = None
    """The layouts within the error band of the fastest, and the one autopar prefers."""

    @property
    def best(self) -> Estimate:
        """The fastest layout. When there is none (status ``infeasible``, or ``unknown``: the
        time ran out first) it raises ``InfeasibleError`` carrying the explanation (``IndexError``
        before: ``autopar.solve(model="llama-70b", gpus=384).best``); test ``layouts`` (empty
        then) or ``status`` to avoid the exception."""
        if not self.layouts:
            explanation = self.explanation or Explanation.time_ran_out()
            raise InfeasibleError(
                f"no layout ({self.status}): {explanation.summary}",
                explanation=explanation.to_dict(),
            )
        return self.layouts[0]

    @property
    def gap(self) -> float | None:
        if not self.layouts or self.best_bound_step_time_s is None:
            return None
        best = objective_value_s(self.layouts[0], self.objective)
        return max(0.0, (best - self.best_bound_step_time_s) / best)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "solve_time_s": self.solve_time_s,
            "best_bound_step_time_s": self.best_bound_step_time_s,
            "gap": self.gap,
            "objective": self.objective,
            "layouts": [estimate.to_dict() for estimate in self.layouts],
            "explanation": self.explanation.to_dict() if self.explanation else None,
            "notes": list(self.notes),
            "alternatives": self.alternatives.to_dict() if self.alternatives else None,
            "proof": self.proof.to_dict() if self.proof else None,
            "ties": self.ties.to_dict() if self.ties else None,
            **({"inputs": self.inputs} if self.inputs is not None else {}),
        }

    def to_frame(self):
        return estimates_frame(self.layouts)


OBJECTIVES: tuple[str, ...] = ("step-time", "goodput")
"""What ``--objective`` may minimise (``SolveResult.objective``)."""


def objective_value_s(estimate: Estimate, objective: str) -> float:
    """The figure ``objective`` ranks ``estimate`` by: its step time, or its expected time per
    useful step under failures."""
    if objective == "goodput" and estimate.goodput is not None:
        useful_s = estimate.goodput.time_per_useful_step_s
        return math.inf if useful_s is None else useful_s
    return estimate.step_time_s


def flat_row(estimate: Estimate) -> dict[str, Any]:
    """One estimate as a flat record (layout, figures, memory in GiB, time per category)."""
    layout = estimate.layout
    row: dict[str, Any] = {axis.layout_attr: getattr(layout, axis.layout_attr) for axis in AXES}
    row.update(
        fits=estimate.fits,
        step_time_s=estimate.step_time_s,
        tokens_per_s=estimate.tokens_per_s,
        tokens_per_s_per_gpu=estimate.tokens_per_s / layout.num_gpus,
        mfu=estimate.mfu,
        hfu=estimate.hfu,
        memory_gib=estimate.memory_bytes["total"] / GIB,
    )
    g = estimate.goodput
    row.update(
        goodput=g.goodput if g else None,
        time_per_useful_step_s=g.time_per_useful_step_s if g else None,
        checkpoint_interval_steps=g.checkpoint_interval_steps if g else None,
        checkpoint_interval_s=g.checkpoint_interval_s if g else None,
        interruptions_per_day=g.interruptions_per_day if g else None,
        days_to_train=estimate.days_to_train,
        days_to_train_failure_free=estimate.days_to_train_failure_free,
        cost=estimate.cost,
        cost_failure_free=estimate.cost_failure_free,
    )
    for category in memory_categories(estimate):
        row[f"memory_{category}_gib"] = estimate.memory_bytes[category] / GIB
    for category, value in estimate.time_s.items():
        row[f"time_{category}_s"] = value
    return row


def memory_categories(estimate: Estimate) -> list[str]:
    """Every memory category the cost model filled, ``total`` excepted."""
    return [c for c in estimate.memory_bytes if c != "total"]


def estimates_frame(estimates: Sequence[Estimate]):
    """A pandas DataFrame, one row per estimate, best first."""
    import pandas as pd

    return pd.DataFrame([flat_row(e) for e in estimates])
