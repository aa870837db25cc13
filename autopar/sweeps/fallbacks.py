"""Fallback layouts for lost servers (issue 22): for losing 1..K servers (a host, or a GB200
NVL72 compute tray of 4 GPUs: ``ClusterSpec.gpus_per_server``), the best layout on the GPUs
that remain, keeping the global batch exactly or within a tolerance.

**What is searched.** A fallback may leave some of the remaining GPUs idle (spares): losing one
8-GPU server of 16,384 leaves 16,376 = 8 x 23 x 89 GPUs, on which no layout of a
power-of-two batch exists, while 16,128 or 14,336 GPUs run one. So for ``k`` lost servers the
candidates are every pair (GPU count ``n <= N - k*g``, global batch ``B'``) that admits a
factorisation ``n = tp*pp*cp*dp`` with ``dp`` dividing ``B'`` (``tp``, ``pp``, ``cp`` from
the values their own rules allow), ``B'`` being the batch or, with a tolerance ``t``, any
batch in ``[B(1-t), B(1+t)]``. Each candidate is an ordinary problem (the cost terms read the
GPU count, so one CP-SAT model per count), and the answer maximises tokens per second (with
``objective="goodput"``: tokens per second that count, times the goodput at that count).

**Proof.** Best-first over upper bounds of each candidate's throughput, so that the answer is
optimal over every candidate without solving most of them:

1. ``U0 = n x peak / FLOPs-per-token``: no layout beats 100% MFU (checked on every layout the
   solves return; a cost model that reports more is refused);
2. first from the count's compute rows at any batch (a step is at least ``grad_accum``
   micro-batches of compute), then ``U1 = B' s / min(slots x compute)``: the step is at least
   the compute terms (category ``compute``) on the critical path, minimised over the
   candidate's own allowed rows (every other term is non-negative), with the goodput
   objective divided by the smallest overhead factor of that count; a candidate whose memory
   terms, each at its smallest, already overflow the GPU has no layout;
3. the candidate solved by CP-SAT, bounded by the incumbent (``solve_problem``'s
   ``upper_bound_s``: "infeasible" proves it cannot beat it).

A candidate is refined or solved only while its bound beats the incumbent of a lost-server
count that includes it; every candidate is either solved to proven optimality or bounded
below an incumbent, which is what each row's ``optimal`` status states.

**Batch changes.** A fallback whose batch differs from the job's changes the optimisation: the
row's note gives the square-root learning-rate scaling for Adam (Malladi et al., "On the SDEs
and Scaling Rules for Adaptive Gradient Algorithms", NeurIPS 2022) and the steps that keep the
token budget.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autopar import api
from autopar.base.axes import AXES, divisors
from autopar.base.errors import InputError
from autopar.costs.goodput import overhead_factor
from autopar.costs.plugin import load_cost_model
from autopar.costs.terms import CostModel
from autopar.inputs import limits as bounds
from autopar.inputs.specs import Problem
from autopar.layout.plan import Estimate
from autopar.layout.results import Explanation, SolveResult, objective_value_s
from autopar.layout.rules import layout_rules
from autopar.layout.space import build_space

MAX_BATCH_TOLERANCE = 0.5
"""``--batch-tolerance`` is a fraction in 0..0.5."""
MFU_CEILING = 1.0
"""No layout runs above 100% MFU: the first, count-only bound (module docstring)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fallback:
    """The best layout after losing ``lost_servers`` servers, or why there is none."""

    lost_servers: int
    remaining_gpus: int
    status: str
    """``optimal`` (proven over every candidate), ``feasible`` (a solve hit the time limit),
    ``infeasible`` (no layout on any GPU count and batch allowed), ``unknown`` (time ran out)."""
    gpus: int | None = None
    """GPUs the fallback layout uses (the rest of the remaining ones stay idle)."""
    global_batch: int | None = None
    estimate: Estimate | None = None
    tokens_per_s: float | None = None
    """Tokens per second ranked by: with the goodput objective, those that count."""
    throughput_lost: float | None = None
    """``1 - tokens_per_s / the full job's``."""
    batch_change: float | None = None
    """``global_batch / the job's - 1``."""
    note: str | None = None
    explanation: Explanation | None = None
    problem: Problem | None = field(default=None, compare=False, repr=False)
    """The fallback's problem (its GPU count and batch), for the launcher formats."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "lost_servers": self.lost_servers,
            "remaining_gpus": self.remaining_gpus,
            "status": self.status,
            "gpus": self.gpus,
            "idle_gpus": None if self.gpus is None else self.remaining_gpus - self.gpus,
            "global_batch": self.global_batch,
            "tokens_per_s": self.tokens_per_s,
            "throughput_lost": self.throughput_lost,
            "batch_change": self.batch_change,
            "note": self.note,
            "layout": self.estimate.to_dict() if self.estimate else None,
            "explanation": self.explanation.to_dict() if self.explanation else None,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class FallbackResult:
    """What ``fallbacks`` returns: the full job's layout and one row per lost-server count."""

    baseline: SolveResult
    rows: tuple[Fallback, ...]
    objective: str
    gpus_per_server: int
    batch_tolerance: float
    candidates: int
    """(GPU count, batch) pairs considered."""
    refined: int
    """Candidates whose compute bound was evaluated."""
    solved: int
    """Candidates CP-SAT solved."""
    solve_time_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "objective": self.objective,
            "gpus_per_server": self.gpus_per_server,
            "batch_tolerance": self.batch_tolerance,
            "baseline": self.baseline.to_dict(),
            "fallbacks": [row.to_dict() for row in self.rows],
            "candidates": self.candidates,
            "refined": self.refined,
            "solved": self.solved,
            "solve_time_s": self.solve_time_s,
        }


def check_fallback_options(problem: Problem, lost_servers: object, tolerance: object) -> None:
    """``--fallback-nodes`` is a positive whole number of servers that leaves at least one GPU;
    ``--batch-tolerance`` a fraction in 0..0.5."""
    bounds.check_int(lost_servers, source="--fallback-nodes", maximum=bounds.MAX_GPUS)
    per_server = problem.cluster.gpus_per_server
    gpus = problem.training.num_gpus
    if lost_servers * per_server >= gpus:
        raise InputError(
            f"losing {lost_servers} servers of {per_server} GPUs removes every GPU of the "
            f"{gpus}-GPU job",
            source="--fallback-nodes",
        )
    bounds.check_number(
        tolerance, source="--batch-tolerance", maximum=MAX_BATCH_TOLERANCE, inclusive=True
    )


def _allowed(problem: Problem, axis: str, limit: int) -> np.ndarray:
    """Values ``1..limit`` of ``axis`` that the problem's rules on that axis alone allow."""
    values = np.arange(1, max(1, limit) + 1, dtype=np.int64)
    keep = np.ones(len(values), dtype=bool)
    for rule in layout_rules(problem):
        if rule.axes == (axis,):
            keep &= np.asarray(rule.check({axis: values}), dtype=bool)
    return values[keep]


def _batches(batch: int, tolerance: float) -> list[int]:
    low = max(1, math.ceil(batch * (1 - tolerance) - 1e-9))
    high = math.floor(batch * (1 + tolerance) + 1e-9)
    return sorted(set(range(low, high + 1)) | {batch}, key=lambda b: (abs(b - batch), b))


def candidates(problem: Problem, max_gpus: int, tolerance: float) -> list[tuple[int, int]]:
    """Every (GPU count <= ``max_gpus``, global batch) with a factorisation ``tp*pp*cp*dp``,
    ``dp`` dividing the batch, each size among the values its own rules allow."""
    model, training = problem.model, problem.training
    tp = _allowed(problem, "tp", min(max_gpus, problem.cluster.gpus_per_node * 64))
    pp = _allowed(problem, "pp", min(max_gpus, model.num_layers))
    cp = _allowed(problem, "cp", min(max_gpus, training.seq_len))
    shapes = np.unique(np.multiply.outer(np.multiply.outer(tp, pp), cp).ravel())
    shapes = shapes[shapes <= max_gpus]
    out: set[tuple[int, int]] = set()
    for batch in _batches(training.global_batch_sequences, tolerance):
        for dp in divisors(batch):
            counts = shapes[shapes * dp <= max_gpus] * dp
            out.update((int(n), batch) for n in counts)
    return sorted(out, key=lambda c: (-c[0], abs(c[1] - training.global_batch_sequences)))


def _candidate_problem(problem: Problem, gpus: int, batch: int) -> Problem:
    training = dataclasses.replace(problem.training, num_gpus=gpus, global_batch_sequences=batch)
    return dataclasses.replace(problem, training=training)


def compute_bound_s(problem: Problem, cost_model: CostModel, objective: str) -> float:
    """A lower bound on ``problem``'s objective (module docstring, bound 2): the smallest
    ``slots x compute`` over its allowed rows, with the goodput objective times the smallest
    overhead factor; ``inf`` when the rules leave no row."""
    ctx = api.make_context(problem)
    space = build_space(problem)
    terms = [t for t in cost_model.microbatch_terms if t.category == "compute"]
    axes = tuple(
        dict.fromkeys(a for t in terms for a in (*t.depends_on, *cost_model.slots.depends_on))
    )
    grid = space.pruned_grid(axes or cost_model.slots.depends_on)
    size = len(next(iter(grid.values()))) if grid else 1
    if size == 0:
        return math.inf
    compute = sum((np.broadcast_to(t.evaluate(grid, ctx), (size,)) for t in terms), np.zeros(size))
    bound = float(np.min(np.broadcast_to(cost_model.slots.evaluate(grid, ctx), (size,)) * compute))
    if _least_memory_bytes(space, ctx, cost_model) > ctx.cluster.usable_memory_bytes:
        return math.inf  # no row fits: every memory term at its smallest already overflows
    if objective == "goodput":
        bound *= _smallest_factor(problem, cost_model)
    return bound


def _least_memory_bytes(space, ctx, cost_model: CostModel) -> float:
    """A lower bound on the most loaded rank's memory over the allowed rows: each static term
    and each ``in_flight x per-micro-batch`` term at its own smallest (all are non-negative)."""
    parts = [(t, None) for t in cost_model.static_memory_terms]
    parts += [(t, cost_model.in_flight) for t in cost_model.microbatch_memory_terms]
    total = 0.0
    for term, times in parts:
        axes = (*term.depends_on, *(times.depends_on if times else ()))
        grid = space.pruned_grid(axes)
        size = len(next(iter(grid.values()))) if grid else 1
        if size == 0:
            return math.inf
        values = np.broadcast_to(term.evaluate(grid, ctx), (size,))
        if times is not None:
            values = values * np.broadcast_to(times.evaluate(grid, ctx), (size,))
        total += float(np.min(values))
    return total


def _smallest_factor(problem: Problem, cost_model: CostModel) -> float:
    """The smallest failure-overhead factor over a count's allowed rows (``inf`` if none)."""
    factor = overhead_factor(cost_model)
    rows = build_space(problem).pruned_grid(factor.depends_on)
    if not rows:
        return float(np.min(factor.evaluate(rows, api.make_context(problem))))
    if len(next(iter(rows.values()))) == 0:
        return math.inf
    return float(np.min(factor.evaluate(rows, api.make_context(problem))))


def _count_bounds(problem: Problem, cost_model: CostModel) -> tuple[np.ndarray, np.ndarray]:
    """For one GPU count, every row of the compute terms' axes (any micro-batch up to its cap,
    whatever the batch) as (``mbs * dp``, compute seconds per sequence): a step of that row
    takes at least ``grad_accum x compute`` (slots >= grad_accum, ``CostModel.slots``), and
    ``grad_accum = batch / (mbs * dp)``, so a sequence takes at least ``compute / (mbs * dp)``
    at any batch that ``mbs * dp`` divides."""
    ctx = api.make_context(problem)
    space = build_space(problem)
    axis = next(a for a in AXES if a.name == "mbs")
    cap = dict(problem.options.maxima).get("mbs", axis.cap or 16)
    space = dataclasses.replace(space, domains={**space.domains, "mbs": tuple(range(1, cap + 1))})
    terms = [t for t in cost_model.microbatch_terms if t.category == "compute"]
    axes = tuple(
        dict.fromkeys(a for t in terms for a in t.depends_on if a not in ("dp", "grad_accum"))
    )
    grid = space.pruned_grid((*axes, "tp", "pp", "cp", "mbs"))
    size = len(grid["tp"])
    if size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    compute = sum((np.broadcast_to(t.evaluate(grid, ctx), (size,)) for t in terms), np.zeros(size))
    dp = problem.training.num_gpus // (grid["tp"] * grid["pp"] * grid["cp"])
    return grid["mbs"] * dp, compute / (grid["mbs"] * dp)


@dataclass(slots=True)
class _Search:
    """The best-first search's state (module docstring): per lost-server count its incumbent,
    and what could not be settled in time."""

    problem: Problem
    cost_model: CostModel
    objective: str
    limits: list[int]
    """GPUs left after losing 1, 2, ... servers."""
    deadline: float
    num_workers: int | None
    best: dict[int, tuple[float, SolveResult, int, int]] = field(default_factory=dict)
    """Lost-server index -> (tokens/s, result, GPUs, batch)."""
    open_bound: dict[int, float] = field(default_factory=dict)
    """Lost-server index -> the largest bound left unsettled (time ran out, or a solve did)."""
    refined: int = 0
    solved: int = 0
    counts: dict[int, tuple[np.ndarray, np.ndarray, float]] = field(default_factory=dict)
    explained: dict[int, Explanation] = field(default_factory=dict)
    """GPUs left -> why no layout runs on them (the first row without a fallback)."""
    """GPU count -> ``_count_bounds`` and the count's smallest overhead factor."""

    def count_bound(self, gpus: int, batch: int) -> float:
        """Tokens/s a candidate cannot beat, from its count's compute rows (``_count_bounds``)."""
        if gpus not in self.counts:
            probe = _candidate_problem(
                self.problem, gpus, self.problem.training.global_batch_sequences
            )
            products, per_sequence = _count_bounds(probe, self.cost_model)
            factor = (
                _smallest_factor(probe, self.cost_model) if self.objective == "goodput" else 1.0
            )
            self.counts[gpus] = (products, per_sequence, factor)
        products, per_sequence, factor = self.counts[gpus]
        allowed = per_sequence[batch % np.maximum(products, 1) == 0]
        if allowed.size == 0:
            return 0.0
        return self.problem.training.seq_len / (float(allowed.min()) * factor)

    def members(self, gpus: int) -> list[int]:
        return [i for i, limit in enumerate(self.limits) if gpus <= limit]

    def threshold(self, gpus: int) -> float:
        """The throughput a candidate on ``gpus`` GPUs must beat to matter to any row."""
        return min((self.best[i][0] if i in self.best else 0.0) for i in self.members(gpus))

    def left_s(self) -> float:
        return max(0.0, self.deadline - time.perf_counter())


def _tokens(problem: Problem, value_s: float) -> float:
    return problem.training.global_batch_tokens / value_s


def _solve(search: _Search, candidate: Problem, threshold: float) -> None:
    """CP-SAT on one candidate, bounded by the incumbent it must beat; updates the rows."""
    tokens = candidate.training.global_batch_tokens
    result = api.solve_problem(
        candidate,
        top=1,
        time_limit=search.left_s(),
        num_workers=search.num_workers,
        cost_model=search.cost_model,
        objective=search.objective,
        upper_bound_s=tokens / threshold if threshold > 0 else 1e9,
    )
    search.solved += 1
    gpus = candidate.training.num_gpus
    if result.status == "infeasible":
        return  # none as good as the incumbent (or none at all)
    if not result.layouts:  # the time limit: this candidate stays open
        for i in search.members(gpus):
            search.open_bound[i] = max(search.open_bound.get(i, 0.0), math.inf)
        return
    best = result.best
    if best.mfu > MFU_CEILING:
        raise InputError(
            f"the cost model reports {best.mfu:.0%} MFU, above 100%: fallbacks bound "
            "throughput by the GPUs' peak",
            source="--cost-model",
        )
    value = _tokens(candidate, objective_value_s(best, search.objective))
    for i in search.members(gpus):
        if i not in search.best or value > search.best[i][0]:
            search.best[i] = (value, result, gpus, candidate.training.global_batch_sequences)


def _first_bound(baseline: SolveResult, problem: Problem) -> float:
    """Tokens/s per GPU at 100% MFU, from the full job's layout (inf without one)."""
    if not baseline.layouts:
        return math.inf
    best = baseline.best
    peak = problem.cluster.gpu.peak_flop_per_s(problem.training.precision)
    flop_per_token = best.mfu * peak * problem.training.num_gpus / best.tokens_per_s
    return MFU_CEILING * peak / flop_per_token


def _run(search: _Search, pairs: Sequence[tuple[int, int]], per_gpu_ceiling: float) -> None:
    """Best-first over the candidates' bounds (module docstring): each pop refines the bound
    of the most promising candidate one stage (100% MFU, its count's compute rows, its own
    compute on the critical path) or, refined, solves it."""
    heap = [(-gpus * per_gpu_ceiling, i, 0) for i, (gpus, _) in enumerate(pairs)]
    heapq.heapify(heap)
    while heap:
        key, i, stage = heapq.heappop(heap)
        gpus, batch = pairs[i]
        bound = -key
        if len(search.best) == len(search.limits) and bound <= min(
            v[0] for v in search.best.values()
        ):
            return  # nothing left can beat any row's incumbent
        threshold = search.threshold(gpus)
        if bound <= threshold:
            continue
        if search.left_s() <= 0:
            for j in search.members(gpus):
                search.open_bound[j] = max(search.open_bound.get(j, 0.0), bound)
            continue
        if stage == 2:
            _solve(search, _candidate_problem(search.problem, gpus, batch), threshold)
            continue
        search.refined += stage == 1
        refined = _refine(search, gpus, batch, stage)
        if refined > threshold:
            heapq.heappush(heap, (-min(refined, bound), i, stage + 1))


def _refine(search: _Search, gpus: int, batch: int, stage: int) -> float:
    """The candidate's next bound: its count's (stage 0), then its own (stage 1)."""
    if stage == 0:
        return search.count_bound(gpus, batch)
    candidate = _candidate_problem(search.problem, gpus, batch)
    lower_s = compute_bound_s(candidate, search.cost_model, search.objective)
    if math.isinf(lower_s):
        return 0.0
    return math.inf if lower_s == 0 else _tokens(candidate, lower_s)


def batch_note(batch: int, original: int, train_tokens: float | None) -> str | None:
    """What a changed global batch implies: Adam's square-root learning-rate scaling (Malladi
    et al., NeurIPS 2022) and, for a token budget, the steps that keep it."""
    if batch == original:
        return None
    ratio = batch / original
    note = (
        f"global batch {batch} instead of {original} ({ratio - 1:+.1%}): scale the learning "
        f"rate by sqrt({batch}/{original}) = {math.sqrt(ratio):.4f} (Adam's square-root rule, "
        "Malladi et al. 2022) and keep the warm-up and decay in tokens"
    )
    return note


def _no_fallback(problem: Problem, pairs, limit: int, search: _Search) -> Explanation:
    """Why nothing runs on at most ``limit`` GPUs: the largest candidate's explanation (or,
    with none, the remaining GPU count's: its product rule binds); the rows after the first
    such row (fewer GPUs still) repeat its explanation."""
    inside = [(g, b) for g, b in pairs if g <= limit]
    gpus, batch = inside[0] if inside else (limit, problem.training.global_batch_sequences)
    if search.explained:  # fewer GPUs than a row already explained: the same causes bind
        (first_limit, first), *_ = search.explained.items()
        summary = f"no layout on {limit} GPUs or fewer either; at {first_limit}: {first.summary}"
        return dataclasses.replace(first, summary=summary)
    search.explained[limit] = _explain(problem, gpus, batch, limit, search, bool(inside))
    return search.explained[limit]


def _explain(
    problem: Problem, gpus: int, batch: int, limit: int, search: _Search, inside: bool
) -> Explanation:
    result = api.solve_problem(
        _candidate_problem(problem, gpus, batch),
        top=1,
        time_limit=max(1.0, search.left_s()),
        num_workers=search.num_workers,
        cost_model=search.cost_model,
    )
    explanation = result.explanation or Explanation(summary="no layout found")
    if not inside:
        rule = (
            f"no GPU count up to {limit} splits into tp*pp*cp*dp with dp dividing a global "
            "batch allowed (raise --batch-tolerance)"
        )
        return dataclasses.replace(
            explanation, summary=f"{rule}; at {limit}: {explanation.summary}"
        )
    return dataclasses.replace(
        explanation, summary=f"no layout fits at {gpus} GPUs or fewer: {explanation.summary}"
    )


def _row(search: _Search, index: int, baseline_tokens: float | None, pairs) -> Fallback:
    problem = search.problem
    limit = search.limits[index]
    lost = index + 1
    if index not in search.best:
        if index in search.open_bound:
            return Fallback(lost_servers=lost, remaining_gpus=limit, status="unknown",
                            explanation=Explanation.time_ran_out())  # fmt: skip
        explanation = _no_fallback(problem, pairs, limit, search)
        return Fallback(
            lost_servers=lost, remaining_gpus=limit, status="infeasible", explanation=explanation
        )
    value, result, gpus, batch = search.best[index]
    proven = result.status == "optimal" and search.open_bound.get(index, 0.0) <= value
    original = problem.training.global_batch_sequences
    return Fallback(
        lost_servers=lost,
        remaining_gpus=limit,
        status="optimal" if proven else "feasible",
        gpus=gpus,
        global_batch=batch,
        estimate=result.best,
        tokens_per_s=value,
        throughput_lost=1.0 - value / baseline_tokens if baseline_tokens else None,
        batch_change=batch / original - 1.0,
        note=batch_note(batch, original, problem.training.train_tokens),
        problem=_candidate_problem(problem, gpus, batch),
    )


def fallbacks_problem(
    problem: Problem,
    *,
    lost_servers: int,
    batch_tolerance: float = 0.0,
    objective: str = "step-time",
    cost_model: str | CostModel | None = None,
    time_limit: float = 60.0,
    num_workers: int | None = None,
    baseline: SolveResult | None = None,
) -> FallbackResult:
    """The best layout after losing 1..``lost_servers`` servers of ``problem``'s cluster
    (module docstring), each proven optimal over every GPU count and batch allowed, or the
    row says why not. ``baseline`` is the full job's solve (solved here when not given)."""
    check_fallback_options(problem, lost_servers, batch_tolerance)
    api.check_objective(objective)
    start = time.perf_counter()
    cm = load_cost_model(cost_model)
    if baseline is None:
        baseline = api.solve_problem(
            problem, top=1, time_limit=time_limit, num_workers=num_workers, cost_model=cm,
            objective=objective,
        )  # fmt: skip
    per_server = problem.cluster.gpus_per_server
    limits = [problem.training.num_gpus - k * per_server for k in range(1, lost_servers + 1)]
    search = _Search(
        problem=problem,
        cost_model=cm,
        objective=objective,
        limits=limits,
        deadline=start + time_limit,
        num_workers=num_workers,
    )
    pairs = candidates(problem, limits[0], batch_tolerance)
    _run(search, pairs, _first_bound(baseline, problem))
    baseline_tokens = None
    if baseline.layouts:
        baseline_tokens = _tokens(problem, objective_value_s(baseline.best, objective))
    rows = tuple(_row(search, i, baseline_tokens, pairs) for i in range(len(limits)))
    return FallbackResult(
        baseline=baseline,
        rows=rows,
        objective=objective,
        gpus_per_server=per_server,
        batch_tolerance=float(batch_tolerance),
        candidates=len(pairs),
        refined=search.refined,
        solved=search.solved,
        solve_time_s=time.perf_counter() - start,
    )


FALLBACK_KEYWORDS: tuple[str, ...] = (
    "batch_tolerance",
    "objective",
    "cost_model",
    "time_limit",
    "num_workers",
)
"""``fallbacks_problem``'s own keywords; ``fallbacks`` passes the others to ``make_problem``."""


def fallbacks(
    *, fallback_nodes: int | None = None, lost_servers: int | None = None, **options: Any
) -> FallbackResult:
    """``fallbacks_problem`` for the options of ``make_problem`` (``model=``, ``gpus=`` ...) and
    its own (``FALLBACK_KEYWORDS``); ``fallback_nodes`` is the CLI's ``--fallback-nodes`` (one
    vocabulary, issue 21), ``lost_servers`` its earlier name."""
    if (fallback_nodes is None) == (lost_servers is None):
        raise TypeError("fallbacks() takes one of fallback_nodes= or lost_servers=")
    lost = fallback_nodes if fallback_nodes is not None else lost_servers
    own = {k: options.pop(k) for k in FALLBACK_KEYWORDS if k in options}
    return fallbacks_problem(api.make_problem(**options), lost_servers=lost, **own)
