"""What a per-stage search answers (``autopar.pipeline.search`` by CP-SAT,
``autopar.pipeline.expressible`` by enumeration): the outer layout, its plan, the proof's
status and bound, and the rows it kept."""

from __future__ import annotations

import time
from dataclasses import dataclass

from autopar.layout.plan import Layout
from autopar.layout.stages import StagePlan
from autopar.pipeline.candidates import Candidates


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSolution:
    status: str
    """``optimal``, ``feasible``, ``infeasible`` or ``unknown``."""
    layout: Layout | None
    plan: StagePlan | None
    step_time_s: float | None
    bound_s: float | None
    rows_total: int
    rows_kept: int
    candidates: Candidates | None
    build_s: float
    solve_s: float
    row: int | None = None
    """The outer layout's row in ``candidates.grid`` (``None`` without a layout)."""

    @classmethod
    def without_layout(cls, status: str, start: float) -> StageSolution:
        """No layout: ``infeasible`` before the search, or ``unknown`` when time ran out."""
        return cls(
            status=status,
            layout=None,
            plan=None,
            step_time_s=None,
            bound_s=None,
            rows_total=0,
            rows_kept=0,
            candidates=None,
            build_s=time.perf_counter() - start,
            solve_s=0.0,
        )
