"""What a search of the uniform space answers with, shared by scoring (``autopar.search.solver``)
and CP-SAT's proof (``autopar.search.prove``): the goal, the layouts of grid rows, and the
result when no layout is found."""

from __future__ import annotations

import time
from dataclasses import dataclass

from autopar.costs.estimate import estimate_many
from autopar.costs.terms import CostTerm
from autopar.layout.plan import Layout
from autopar.layout.results import Proof, SolveResult


def layouts_from_rows(rows: list[dict[str, int]]) -> list[Layout]:
    return [Layout.from_grid_row(row) for row in rows]


@dataclass(frozen=True, slots=True)
class Goal:
    """What the search minimises: the step time, or with ``time_factor`` the step time times it
    (the expected time per useful step, ``autopar.costs.goodput``); with ``upper_bound_s``, only
    layouts whose objective is at most that."""

    time_factor: CostTerm | None = None
    upper_bound_s: float | None = None

    @property
    def name(self) -> str:
        return "step-time" if self.time_factor is None else "goodput"


def no_solution(status: str, start: float, workers: int, proof: Proof | None) -> SolveResult:
    return SolveResult(
        status=status,
        solve_time_s=time.perf_counter() - start,
        layouts=(),
        num_workers=workers,
        proof=proof,
    )


def hinted(hint, ctx, cost_model, start, workers, proof, *, bound, goal) -> SolveResult:
    """The hint as the answer when the time limit struck before CP-SAT bettered it."""
    if hint is None:
        return no_solution("unknown", start, workers, proof)
    return SolveResult(
        status="feasible",
        solve_time_s=time.perf_counter() - start,
        layouts=tuple(estimate_many(layouts_from_rows([hint.row]), ctx, cost_model)),
        best_bound_step_time_s=bound,
        num_workers=workers,
        objective=goal.name,
        notes=("the time limit struck first: the best layout scored, not proven optimal",),
        proof=proof,
    )
