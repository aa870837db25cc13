"""Megatron's pipeline schedules, simulated: the step time of a pipeline with unequal chunks.

Each pipeline rank runs its operations one at a time, in the order Megatron-LM issues them
(``megatron/core/pipeline_parallel/schedules.py``):

- 1F1B, ``forward_backward_pipelining_without_interleaving``: rank ``i`` of ``p`` runs
  ``min(p - i - 1, m)`` warm-up forwards, then forward/backward pairs, then the remaining
  backwards.
- interleaved, ``forward_backward_pipelining_with_interleaving``: ``v`` chunks per rank;
  ``get_pp_rank_microbatches`` gives ``2*(p - i - 1) + (v - 1)*g`` warm-up forwards (all of the
  ``m*v`` when that is more), ``g = microbatch_group_size_per_vp_stage`` (its default, and here,
  ``p``); forwards take chunks in ``get_schedule_table`` order (groups of ``g`` micro-batches,
  each group through every chunk), backwards the same order with chunk ``v - 1 - c``
  (``get_model_chunk_id(..., forward=False)``); after the warm-up, one forward then one
  backward per step, then the remaining backwards.

An operation starts when its rank is free and its input is ready: the forward of micro-batch
``b`` on virtual stage ``q = c*p + i`` (chunk ``c`` of rank ``i``) after its forward on
``q - 1``; its backward after its backward on ``q + 1``, or after its own forward on the last
virtual stage. Communication is free (its time is in the chunk times). The step is the finish
time of the last operation: the longest path through this graph, found in one pass over the
operations (each rank advances until it waits on an operation not yet done).

``PipelineSchedule`` is what the per-stage figures and search ask of a schedule (in-flight
micro-batches, the closed form they rank by, the simulation); ``MEGATRON`` is Megatron's 1F1B
(``vpp == 1``) and interleaved schedule, the only one so far.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import numpy as np

from autopar.costs.schedule_orders import (
    V_SHAPED,
    first_chunks,
    pipeline_length,
    rank_steps,
)


@functools.cache
def schedule_chunks(num_microbatches: int, vpp: int, group: int) -> tuple[int, ...]:
    """Chunk of each forward in Megatron's interleaved order (``schedules.py``
    ``get_schedule_table``: groups of ``group`` micro-batches, each group through every chunk)."""
    out: list[int] = []
    for first in range(0, num_microbatches, group):
        last = num_microbatches if first + group >= num_microbatches else first + group
        out += [chunk for chunk in range(vpp) for _ in range(first, last)]
    return tuple(out)


def rank_ops(pp: int, vpp: int, num_microbatches: int, rank: int) -> list[tuple[str, int, int]]:
    """``(F|B, micro-batch, chunk)`` in the order ``rank`` runs them (module docstring)."""
    m = num_microbatches
    if vpp == 1:
        warmup = min(pp - rank - 1, m)
        forwards = [("F", b, 0) for b in range(m)]
        backwards = [("B", b, 0) for b in range(m)]
    else:
        total = m * vpp
        warmup = min(2 * (pp - rank - 1) + (vpp - 1) * pp, total)
        chunks = schedule_chunks(m, vpp, pp)
        seen_f, seen_b = [0] * vpp, [0] * vpp
        forwards, backwards = [], []
        for c in chunks:
            forwards.append(("F", seen_f[c], c))
            seen_f[c] += 1
            cb = vpp - 1 - c
            backwards.append(("B", seen_b[cb], cb))
            seen_b[cb] += 1
    ops = forwards[:warmup]
    steady = len(forwards) - warmup
    for k in range(steady):
        ops.append(forwards[warmup + k])
        ops.append(backwards[k])
    ops += backwards[steady:]
    return ops


@functools.lru_cache(maxsize=8)
def _graph(pp: int, vpp: int, num_microbatches: int) -> tuple[tuple, ...]:
    """Per rank: (operation ids, the id each waits on or -1, is-forward flags, chunks) as lists.
    Ids: ``q*m + b`` for forwards, ``S*m + q*m + b`` for backwards (``S = pp*vpp``)."""
    m, stages = num_microbatches, pp * vpp
    out = []
    for rank in range(pp):
        ids, deps, forward, chunk = [], [], [], []
        for kind, b, c in rank_ops(pp, vpp, m, rank):
            q = c * pp + rank
            if kind == "F":
                ids.append(q * m + b)
                deps.append((q - 1) * m + b if q > 0 else -1)
            else:
                ids.append((stages + q) * m + b)
                last = q == stages - 1
                deps.append(q * m + b if last else (stages + q + 1) * m + b)
            forward.append(kind == "F")
            chunk.append(c)
        out.append((ids, deps, np.array(forward), np.array(chunk)))
    return tuple(out)


def simulate_step_s(forward_s, backward_s, num_microbatches: int) -> float:
    """Finish time of one step's pipeline; ``forward_s[i][c]`` / ``backward_s[i][c]``: one
    micro-batch's forward / backward on chunk ``c`` of rank ``i`` (``(pp, vpp)``)."""
    fwd = np.asarray(forward_s, dtype=np.float64)
    bwd = np.asarray(backward_s, dtype=np.float64)
    pp, vpp = fwd.shape
    graph = _graph(pp, vpp, int(num_microbatches))
    durations = [np.where(f, fwd[i, c], bwd[i, c]).tolist() for i, (_, _, f, c) in enumerate(graph)]
    done = [-1.0] * (2 * pp * vpp * int(num_microbatches))
    pos, free = [0] * pp, [0.0] * pp
    remaining = sum(len(g[0]) for g in graph)
    while remaining:
        progressed = 0
        for i in range(pp):
            ids, deps, dur = graph[i][0], graph[i][1], durations[i]
            k, t, n = pos[i], free[i], len(ids)
            while k < n:
                d = deps[k]
                if d >= 0:
                    ready = done[d]
                    if ready < 0.0:
                        break
                    if ready > t:
                        t = ready
                t += dur[k]
                done[ids[k]] = t
                k += 1
            progressed += k - pos[i]
            pos[i], free[i] = k, t
        if not progressed:
            raise AssertionError("schedule deadlocked")
        remaining -= progressed
    return max(free)


@functools.cache
def in_flight(pp: int, vpp: int, num_microbatches: int, stage: int) -> tuple[int, ...]:
    """Micro-batches whose activations each chunk of ``stage`` holds at the stage's peak under
    Megatron's schedules. 1F1B: ``min(p - i, m)`` (``p - i - 1`` warm-up forwards, then one more
    before the first backward). Interleaved: ``2*(p - i - 1) + (v-1)*p`` warm-up forwards plus
    one, at most ``m*v``, taken in the order of ``get_schedule_table`` (groups of ``p``
    micro-batches per chunk); for equal chunks this is Korthikanti et al. 2022 §4.2.3's
    ``p * (1 + (p-1)/(p*v))`` (``theoretical_memory_usage.py``)."""
    m = num_microbatches
    if vpp == 1:
        return (min(pp - stage, m),)
    total = m * vpp
    warmup = min(2 * (pp - stage - 1) + (vpp - 1) * pp, total)
    return first_chunks(m, vpp, pp, min(warmup + 1, total))


class PipelineSchedule(Protocol):
    """A pipeline schedule as the per-stage figures and search use it. ``T_i`` is one
    micro-batch's forward + backward (+ recompute) on stage ``i``."""

    name: str

    def in_flight(self, pp: int, vpp: int, num_microbatches: int, stage: int) -> tuple[int, ...]:
        """Micro-batches whose activations each chunk of ``stage`` holds at its peak."""
        ...

    def step_weights(self, pp: int, vpp: int, num_microbatches: int) -> tuple[Fraction, Fraction]:
        """``(a, b)``, both >= 0: the pipeline part of the step is ``a * max_i T_i + b * sum_i
        T_i``, the closed form the search ranks plans by and proves for (the bounds need
        ``a, b >= 0``)."""
        ...

    def pipeline_s(self, slowest_s, total_s, num_microbatches, *, pp: int, vpp: int) -> np.ndarray:
        """The same closed form in float, over rows (``max_i T_i``, ``sum_i T_i``, ``m``)."""
        ...

    def simulate_s(self, forward_s, backward_s, num_microbatches: int, *, weight_s=None) -> float:
        """The pipeline part of the step by simulation over ``(pp, vpp)`` chunk times; the
        backwards take ``weight_s`` of weight gradient (read only by schedules that run it
        apart, the zero-bubble ones)."""
        ...


@dataclass(frozen=True, slots=True)
class MegatronSchedule:
    """Megatron-LM's 1F1B (``vpp == 1``) and interleaved 1F1B schedules. Closed form
    ``(m - 1/v) * max_i T_i + sum_i T_i / v``: the slowest stage runs ``m`` micro-batches back
    to back, the first forward and the last backward cross every other stage once (warm-up
    and drain); with equal stages Narayanan et al. 2021 §2.2 ``(m + p - 1) * t`` and, for the
    interleaved schedule, ``(m + (p-1)/v) * t`` (§2.2.2). Exact for equal stages only
    (``tests/test_stages.py`` measures it against ``simulate_step_s``)."""

    name: str = "megatron"

    def in_flight(self, pp: int, vpp: int, num_microbatches: int, stage: int) -> tuple[int, ...]:
        return in_flight(pp, vpp, num_microbatches, stage)

    def step_weights(self, pp: int, vpp: int, num_microbatches: int) -> tuple[Fraction, Fraction]:
        return Fraction(num_microbatches * vpp - 1, vpp), Fraction(1, vpp)

    def pipeline_s(self, slowest_s, total_s, num_microbatches, *, pp: int, vpp: int) -> np.ndarray:
        m = np.asarray(num_microbatches, dtype=np.float64)
        return (m - 1.0 / vpp) * slowest_s + total_s / vpp

    def simulate_s(self, forward_s, backward_s, num_microbatches: int, *, weight_s=None) -> float:
        return simulate_step_s(forward_s, backward_s, num_microbatches)


MEGATRON = MegatronSchedule()
"""The schedule every per-stage plan runs today."""
PHASES: tuple[str, ...] = ("F", "I", "W", "B")
"""Operation phases (``autopar.costs.schedule_orders``): forward, input gradient, weight
gradient, whole backward (``I + W``)."""


@dataclass(frozen=True, slots=True)
class _Graph:
    """One schedule's operations as arrays, per rank: the steps' phase and chunk of their first
    and (for paired steps, else -1) second operation, and the step each waits on (-1: none)."""

    steps: tuple[tuple[np.ndarray, ...], ...]
    """Per rank ``(phase0, chunk0, phase1, chunk1)`` (int arrays) in run order."""
    waits: tuple[tuple[list[int], ...], ...]
    """Per rank, per step: the global ids of the (one or two) steps it waits on, -1 for none."""
    offsets: tuple[int, ...]
    """Global id of each rank's first step."""


def _step_table(schedule: str, pp: int, vpp: int, m: int) -> list[np.ndarray]:
    """Per rank, ``(steps, 2, 3)`` ints: each step's (phase code, stage, micro-batch) of its one
    or two operations, ``-1`` where a step has one."""
    out = []
    for steps in rank_steps(schedule, pp, vpp, m):
        table = np.full((len(steps), 2, 3), -1, dtype=np.int64)
        for k, step in enumerate(steps):
            for j, (phase, stage, b) in enumerate(step):
                table[k, j] = (PHASES.index(phase), stage, b)
        out.append(table)
    return out


@functools.lru_cache(maxsize=64)
def _schedule_graph(schedule: str, pp: int, vpp: int, m: int) -> _Graph:
    """The dependencies of ``rank_steps`` (module docstring): ``F`` of a stage after ``F`` of
    the stage before; ``I`` / ``B`` after the next stage's ``I`` / ``B``, or after the stage's
    own ``F`` on the last stage of the pipeline; ``W`` after its ``I``, which the rank ran
    before it (every order puts it later in the same rank's list). Operations are keyed
    ``(phase*S + stage)*m + micro-batch``, so each wait is found by indexing."""
    tables = _step_table(schedule, pp, vpp, m)
    length = pipeline_length(schedule, pp, vpp)
    stages = 2 * pp if schedule == "dualpipe" else pp * vpp
    offsets = np.cumsum([0] + [len(t) for t in tables])[:-1]
    flat = np.concatenate(tables) if tables else np.zeros((0, 2, 3), dtype=np.int64)
    phase, stage, b = flat[..., 0], flat[..., 1], flat[..., 2]
    owner = np.full(len(PHASES) * stages * m, -1, dtype=np.int64)
    ok = phase >= 0
    ids = np.broadcast_to(np.arange(len(flat))[:, None], phase.shape)
    owner[((phase * stages + stage) * m + b)[ok]] = ids[ok]

    def key(code: int, at: np.ndarray) -> np.ndarray:
        return owner[(code * stages + at) * m + b]

    first, last = stage % length == 0, stage % length == length - 1
    nxt = np.minimum(stage + 1, stages - 1)
    after_next = np.where(key(1, nxt) >= 0, key(1, nxt), key(3, nxt))
    wait = np.select(
        [
            ~ok | (phase == 2),
            (phase == 0) & first,
            phase == 0,
            last,
        ],
        [-1, -1, key(0, np.maximum(stage - 1, 0)), key(0, stage)],
        default=after_next,
    )
    chunk = np.where(ok, _chunks(schedule, pp, stage), -1)
    steps, waits = [], []
    for rank, start in enumerate(offsets):
        rows = slice(int(start), int(start) + len(tables[rank]))
        steps.append((phase[rows, 0], chunk[rows, 0], phase[rows, 1], chunk[rows, 1]))
        waits.append(tuple(wait[rows].tolist()))
    return _Graph(steps=tuple(steps), waits=tuple(waits), offsets=tuple(int(o) for o in offsets))


def _chunks(schedule: str, pp: int, stage: np.ndarray) -> np.ndarray:
    """``chunk_of`` over an array of stages."""
    if schedule in V_SHAPED:
        return (stage >= pp).astype(np.int64)
    return stage // pp


@dataclass(frozen=True, slots=True)
class Simulation:
    """One simulated step of a schedule."""

    step_s: float
    """Finish time of the last operation."""
    critical: tuple[int, int, int, int]
    """On the longest path: forwards, input-gradient and weight-gradient backwards (a whole
    backward counts once in each), and paired steps; empty counts unless asked for."""
    spans: tuple[tuple[float, float], ...] = ()
    """Each rank's first start and last finish: with no synchronisation between steps (Qi et
    al. 2024 §5, optimizer post-validation) a rank's next step starts at its own finish, so
    its span, not the whole step, is what repeats."""


def _durations(graph: _Graph, forward, input_grad, weight_grad, pair_hidden) -> list[list[float]]:
    """Each rank's step durations from per-(rank, chunk) phase times."""
    out = []
    for rank, (p0, c0, p1, c1) in enumerate(graph.steps):
        table = np.stack(
            [forward[rank], input_grad[rank], weight_grad[rank]]
            + [input_grad[rank] + weight_grad[rank]]
        )
        paired = p1 >= 0
        second = np.where(paired, table[np.maximum(p1, 0), np.maximum(c1, 0)], 0.0)
        hidden = np.where(paired, pair_hidden[rank, np.maximum(c1, 0)], 0.0)
        out.append((table[p0, c0] + second - hidden).tolist())
    return out


def local_chunks(schedule: str, vpp: int) -> int:
    """Chunks a rank holds: ``vpp``, or two (one per direction) in DualPipe."""
    return 2 if schedule == "dualpipe" else vpp


def _as_grid(value, pp: int, vpp: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(value, dtype=np.float64), (pp, vpp))


def simulate(
    schedule: str,
    pp: int,
    vpp: int,
    num_microbatches: int,
    forward_s,
    input_grad_s,
    weight_grad_s,
    *,
    pair_hidden_s=0.0,
    critical: bool = False,
) -> Simulation:
    """Simulate one step of ``schedule``: each rank runs its steps in order, a step starting
    when its rank is free and what it waits on is done (the longest path through the graph,
    one pass over the steps). Times are one micro-batch's, per chunk: a scalar (every chunk
    alike) or ``(pp, vpp)``; a whole backward takes ``input_grad + weight_grad``; a paired step
    takes the sum of its two operations less ``pair_hidden_s`` of the backward's chunk (the
    communication the pairing hides). With ``critical`` the longest path's operations are
    counted (``Simulation.critical``)."""
    m = int(num_microbatches)
    graph = _schedule_graph(schedule, pp, vpp, m)
    chunks = local_chunks(schedule, vpp)
    forward, input_grad, weight_grad, hidden = (
        _as_grid(x, pp, chunks) for x in (forward_s, input_grad_s, weight_grad_s, pair_hidden_s)
    )
    durations = _durations(graph, forward, input_grad, weight_grad, hidden)
    total = graph.offsets[-1] + len(durations[-1])
    done = [-1.0] * total
    came = [-1] * total if critical else None
    pos, free, last = [0] * pp, [0.0] * pp, [-1] * pp
    remaining = total
    while remaining:
        progressed = 0
        for rank in range(pp):
            waits, dur, base = graph.waits[rank], durations[rank], graph.offsets[rank]
            k, t, n, prev = pos[rank], free[rank], len(dur), last[rank]
            while k < n:
                start, origin = t, prev
                for d in waits[k]:
                    if d < 0:
                        continue
                    ready = done[d]
                    if ready < 0.0:
                        break
                    if ready > start:
                        start, origin = ready, d
                else:
                    t = start + dur[k]
                    done[base + k] = t
                    if came is not None:
                        came[base + k] = origin
                    prev = base + k
                    k += 1
                    continue
                break
            progressed += k - pos[rank]
            pos[rank], free[rank], last[rank] = k, t, prev
        if not progressed:
            raise AssertionError(f"{schedule} deadlocked")
        remaining -= progressed
    step = max(free)
    counts = _critical_counts(graph, came, done) if came is not None else (0, 0, 0, 0)
    spans = tuple(
        (done[base] - dur[0], end) if dur else (0.0, 0.0)
        for base, dur, end in zip(graph.offsets, durations, free, strict=True)
    )
    return Simulation(step_s=step, critical=counts, spans=spans)


def _critical_counts(graph: _Graph, came: list[int], done: list[float]):
    """The operations on the longest path, walked back from the last step to finish."""
    rank_of = np.searchsorted(np.asarray(graph.offsets), np.arange(len(done)), side="right") - 1
    i = int(np.argmax(done))
    counts = [0, 0, 0, 0]
    while i >= 0:
        rank = int(rank_of[i])
        k = i - graph.offsets[rank]
        p0, _, p1, _ = (a[k] for a in graph.steps[rank])
        for phase in (p0, p1):
            if phase == 3:
                counts[1] += 1
                counts[2] += 1
            elif phase >= 0:
                counts[int(phase)] += 1
        counts[3] += int(p1 >= 0)
        i = came[i]
    return tuple(counts)
