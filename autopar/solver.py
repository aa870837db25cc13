"""Run CP-SAT: the optimum, the runners-up, and the status (DESIGN §3).

Determinism: the optimum's objective value is unique; layouts tied on the integer objective are
enumerated with a single worker and ordered by ``TIE_ORDER`` (smaller tp, then pp, cp, ep, etp,
vpp; larger micro-batch; less recompute; lower ZeRO stage), so the same input gives the same
answer and order whatever the worker count. Top-k: after each objective value, the model is told
``objective >= value + 1`` and solved again; results are distinct layouts, best first.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from ortools.sat.python import cp_model

from autopar.cpsat import US_PER_S, VarMap, build_model
from autopar.estimate import estimate_many
from autopar.plan import GRID_AXES, Estimate, Layout
from autopar.space import build_space
from autopar.specs import Problem
from autopar.terms import CostModel, TermContext

MAX_TIES = 64
"""At most this many layouts tied on one objective value are enumerated."""
SEED = 20240607


def tie_key(row: dict[str, int]) -> tuple[int, ...]:
    """The documented secondary order among layouts of equal predicted step time."""
    return (
        row["tp"],
        row["pp"],
        row["cp"],
        row["ep"],
        row["etp"],
        row["vpp"],
        -row["mbs"],
        row["recompute"],
        row["zero"],
        row["sp"],
        row["dp"],
        row["grad_accum"],
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SolveResult:
    """What ``autopar.solve`` returns: status, timing and the best layouts, best first."""

    status: str
    """``optimal`` (proven), ``feasible`` (time limit hit; see ``gap``), ``infeasible``."""
    solve_time_s: float
    layouts: tuple[Estimate, ...]
    best_bound_step_time_s: float | None = None
    """Lower bound on the best step time proven by the solver."""
    explanation: dict[str, Any] | None = None
    num_workers: int = 1
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def best(self) -> Estimate:
        return self.layouts[0]

    @property
    def gap(self) -> float | None:
        if not self.layouts or self.best_bound_step_time_s is None:
            return None
        best = self.layouts[0].step_time_s
        return max(0.0, (best - self.best_bound_step_time_s) / best)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "solve_time_s": self.solve_time_s,
            "best_bound_step_time_s": self.best_bound_step_time_s,
            "gap": self.gap,
            "layouts": [estimate.to_dict() for estimate in self.layouts],
            "explanation": self.explanation,
        }

    def to_frame(self):
        from autopar.report import estimates_frame

        return estimates_frame(self.layouts)


def default_num_workers() -> int:
    """CP-SAT's portfolio needs 8 workers for parallel search; fewer cores than that make the
    extra workers pure overhead (benchmarks/solve_scaling.py measures it)."""
    return max(1, min(8, os.cpu_count() or 1))


def _solver(*, time_limit_s: float, num_workers: int) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = num_workers
    solver.parameters.random_seed = SEED
    solver.parameters.max_time_in_seconds = time_limit_s
    # No presolve and no probing: the tables arrive reduced to their allowed rows, and both spend
    # seconds on the row booleans that the linear relaxation does not need
    # (benchmarks/solve_scaling.py has the before/after figures).
    solver.parameters.cp_model_presolve = False
    solver.parameters.cp_model_probing_level = 0
    return solver


class _Collector(cp_model.CpSolverSolutionCallback):
    def __init__(self, axes: dict[str, cp_model.IntVar], limit: int) -> None:
        super().__init__()
        self._axes, self._limit, self.rows = axes, limit, []

    def on_solution_callback(self) -> None:
        self.rows.append({a: int(self.value(v)) for a, v in self._axes.items()})
        if len(self.rows) >= self._limit:
            self.stop_search()


def _ties(
    model: cp_model.CpModel, vm: VarMap, value: int, time_limit_s: float
) -> list[dict[str, int]]:
    """All layouts whose integer objective equals ``value`` (at most MAX_TIES), in tie order."""
    model.clear_objective()
    tie = model.new_bool_var(f"objective=={value}")
    model.add(vm.objective == value).only_enforce_if(tie)
    model.clear_assumptions()
    model.add_assumptions([tie])
    solver = _solver(time_limit_s=time_limit_s, num_workers=1)
    solver.parameters.enumerate_all_solutions = True
    collector = _Collector(vm.axes, MAX_TIES)
    solver.solve(model, collector)
    model.clear_assumptions()
    model.add(tie == 0)
    return sorted(collector.rows, key=tie_key)


def _optimise(model, vm, *, time_limit_s, num_workers):
    model.minimize(vm.objective)
    solver = _solver(time_limit_s=time_limit_s, num_workers=num_workers)
    status = solver.solve(model)
    return solver, status


def _layouts_from_rows(rows: list[dict[str, int]]) -> list[Layout]:
    return [Layout.from_grid_row({a: row[a] for a in GRID_AXES}) for row in rows]


def run_solver(
    problem: Problem,
    ctx: TermContext,
    cost_model: CostModel,
    *,
    top_k: int = 1,
    time_limit_s: float = 10.0,
    num_workers: int | None = None,
) -> SolveResult:
    """Minimise the cost model's step time over the layouts ``problem`` allows."""
    start = time.perf_counter()
    workers = num_workers or default_num_workers()
    deadline = start + time_limit_s
    space = build_space(problem)
    model, vm = build_model(space, cost_model, ctx)
    rows: list[dict[str, int]] = []
    status_name, bound_s = "optimal", None
    while len(rows) < top_k:
        left = max(0.05, deadline - time.perf_counter())
        solver, status = _optimise(model, vm, time_limit_s=left, num_workers=workers)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if not rows:
                return _no_solution(problem, ctx, cost_model, status, start, workers)
            break
        value = int(round(solver.objective_value))
        if not rows:
            status_name = "optimal" if status == cp_model.OPTIMAL else "feasible"
            bound_s = solver.best_objective_bound / US_PER_S
        if status == cp_model.OPTIMAL:
            tied = _ties(model, vm, value, max(0.05, deadline - time.perf_counter()))
        else:
            tied = [{a: int(solver.value(v)) for a, v in vm.axes.items()}]
        rows.extend(tied or [{a: int(solver.value(v)) for a, v in vm.axes.items()}])
        # Next round: strictly worse objective values only (distinct layouts by construction).
        model.add(vm.objective >= value + 1)
    estimates = estimate_many(_layouts_from_rows(rows[:top_k]), ctx, cost_model)
    return SolveResult(
        status=status_name,
        solve_time_s=time.perf_counter() - start,
        layouts=tuple(estimates),
        best_bound_step_time_s=bound_s,
        num_workers=workers,
    )


def _no_solution(problem, ctx, cost_model, status, start, workers) -> SolveResult:
    from autopar.explain import explain_infeasible

    if status == cp_model.INFEASIBLE:
        explanation = explain_infeasible(problem, ctx, cost_model)
        return SolveResult(
            status="infeasible",
            solve_time_s=time.perf_counter() - start,
            layouts=(),
            explanation=explanation,
            num_workers=workers,
        )
    explanation = {
        "summary": "the time limit ran out before any layout was found; raise --time-limit",
        "families": [],
        "nearest_miss": None,
        "suggestions": [],
    }
    return SolveResult(
        status="unknown",
        solve_time_s=time.perf_counter() - start,
        layouts=(),
        explanation=explanation,
        num_workers=workers,
    )
