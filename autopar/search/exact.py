"""The best layouts by their simulated step when scoring gives some of them as lower bounds
(``autopar.costs.score``: a zero-bubble or V schedule's slots at reference phase times).

Best first: the scored layouts are taken in the order of their bound; each one that is not
exact is simulated (``autopar.costs.terms.step_time_s``: its slots at its own phase times);
the walk stops once the next bound is at least the ``top_k``-th best simulated step, since
every layout left has a step at least its bound. When the scored list runs out first, the
space is scored again for every layout whose bound is at most that step
(``score_space(upper_bound_s=...)``), at most ``CLOSE_LIMIT`` of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from autopar.costs.score import US_PER_S, Scored, Scores, scored_order
from autopar.costs.terms import CostModel, TermContext, grid_of, step_time_s
from autopar.layout.plan import Layout
from autopar.search.answers import Goal

CLOSE_FIRST = 32
"""Layouts scoring keeps when some are lower bounds (the walk usually ends among them)."""
CLOSE_LIMIT = 4096
"""At most this many layouts under the bound are walked after a second scoring."""
BATCH = 8
"""Layouts simulated at once (the terms are evaluated once per batch)."""
NOT_CLOSED = (
    "not proven: some schedules' scores are lower bounds of their simulated steps, and the "
    f"layouts under the best step found were more than {CLOSE_LIMIT:,} to simulate"
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Objective:
    """What is simulated: the search's ``Goal`` (the step time, times its ``time_factor`` when
    given; only layouts at most its ``upper_bound_s`` count) on this problem."""

    ctx: TermContext
    cost_model: CostModel
    goal: Goal

    def simulated(self, items: list[Scored]) -> list[Scored]:
        """``items`` with their simulated objective (exact), those over the bound left out."""
        grid = grid_of([Layout.from_grid_row(item.row) for item in items])
        value = step_time_s(self.cost_model, grid, self.ctx)
        if self.goal.time_factor is not None:
            value = value * self.goal.time_factor.evaluate(grid, self.ctx)
        out = []
        for item, v in zip(items, np.broadcast_to(value, (len(items),)).tolist(), strict=True):
            limit = self.goal.upper_bound_s
            if limit is None or round(v * US_PER_S) <= int(limit * US_PER_S):
                out.append(dataclasses.replace(item, step_s=float(v), exact=True))
        return out


def needs_closing(scores: Scores, top_k: int) -> bool:
    """Whether one of the ``top_k`` best bounds is not exact (beyond them every layout's step
    is at least the ``top_k``-th bound)."""
    return any(not item.exact for item in scores.best[:top_k])


def close(
    scores: Scores,
    rescore: Callable[[float, int], Scores],
    objective: Objective,
    *,
    top_k: int,
    asked: int,
    band: float = 0.0,
) -> tuple[Scores, bool]:
    """``scores`` with ``best`` the ``top_k`` best simulated layouts (module docstring), and
    whether that is proven. ``asked``: how many layouts ``scores`` was asked to keep (fewer in
    ``best`` means it holds every fitting layout); ``rescore(bound_s, top)`` scores again
    keeping the ``top`` best under ``bound_s``; ``band``: the ties' relative band."""
    done: list[Scored] = []
    seen: set[tuple] = set()

    def kth() -> float:
        return done[top_k - 1].step_s if len(done) >= top_k else np.inf

    def walk(items: list[Scored]) -> bool:
        """Walk ``items`` (bound order); True once the next bound is past the k-th best."""
        pending: list[Scored] = []
        for item in items:
            key = tuple(item.row.items())
            if key in seen:
                continue
            if item.step_s > kth():
                _settle(pending, done, objective)
                if item.step_us > round(kth() * US_PER_S):
                    return True
            seen.add(key)
            pending.append(item)
            if len(pending) >= BATCH:
                _settle(pending, done, objective)
        _settle(pending, done, objective)
        return False

    if walk(list(scores.best)) or len(scores.best) < asked:
        return _closed(scores, done, top_k, band), True
    bound = kth()
    again = rescore(bound if np.isfinite(bound) else np.inf, CLOSE_LIMIT)
    proven = walk(list(again.best)) or len(again.best) < CLOSE_LIMIT
    return _closed(scores, done, top_k, band), proven


def _settle(pending: list[Scored], done: list[Scored], objective: Objective) -> None:
    """Simulate what in ``pending`` is not exact and merge all into ``done`` (kept sorted)."""
    if not pending:
        return
    exact = [item for item in pending if item.exact]
    bounds = [item for item in pending if not item.exact]
    done.extend(exact + (objective.simulated(bounds) if bounds else []))
    done.sort(key=scored_order)
    pending.clear()


def _closed(scores: Scores, done: list[Scored], top_k: int, band: float) -> Scores:
    """``scores`` with the simulated best; the band keeps its exact members and those
    simulated here (a bound's own figure is not a tie)."""
    best = tuple(done[:top_k])
    known = {tuple(item.row.items()): item for item in done}
    within = [known.get(tuple(i.row.items()), i) for i in scores.within_band]
    limit = best[0].step_s * (1 + band) if best else -np.inf
    kept = sorted((i for i in within if i.exact and i.step_s <= limit), key=scored_order)
    return dataclasses.replace(scores, best=best, within_band=tuple(kept))
