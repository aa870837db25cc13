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
    units = min(warmup + 1, total)
    order = schedule_chunks(m, vpp, pp)[:units]
    return tuple(order.count(j) for j in range(vpp))


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

    def simulate_s(self, forward_s, backward_s, num_microbatches: int) -> float:
        """The pipeline part of the step by simulation over ``(pp, vpp)`` chunk times."""
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

    def simulate_s(self, forward_s, backward_s, num_microbatches: int) -> float:
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
    counts = _critical_counts(graph, came, done, step) if came is not None else (0, 0, 0, 0)
    spans = tuple(
        (done[base] - dur[0], end) if dur else (0.0, 0.0)
        for base, dur, end in zip(graph.offsets, durations, free, strict=True)
    )
    return Simulation(step_s=step, critical=counts, spans=spans)


def _critical_counts(graph: _Graph, came: list[int], done: list[float], step: float):
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


EXTRAPOLATE_ABOVE = 3
"""Past ``3*pp`` micro-batches a schedule's activation peak no longer grows (its warm-up is
over; ``tests/test_schedule_slots.py``)."""
STEADY_FROM = 2
"""From ``2*pp`` micro-batches on, a schedule's slots are simulated at ``2*pp`` and ``3*pp``
and taken on the line through them: with equal stages every schedule here is in its steady
state by then, and each micro-batch adds the same operations to the longest path
(``tests/test_schedule_slots.py`` checks it against direct simulation)."""


def orderable(schedule: str, pp: int, vpp: int, m: int) -> bool:
    """Whether ``schedule`` has an order for this shape (what its code builds at all; the
    frameworks' further limits are rules, ``autopar.layout.schedule_rules``): the V schedules
    two chunks per rank, GPipe one, DualPipeV ``m >= 2*pp``, DualPipe an even ``pp`` and ``m``
    with ``m >= 2*pp`` (deepseek-ai/DualPipe dualpipe.py L332-333), the interleaved orders whole
    rounds of micro-batches."""
    if schedule in V_SHAPED:
        return vpp == 2 and (schedule != "dualpipe-v" or m >= 2 * pp)
    if schedule == "gpipe" or schedule == "dualpipe":
        even = schedule == "gpipe" or (pp % 2 == 0 and m % 2 == 0 and m >= 2 * pp)
        return vpp == 1 and even
    if vpp > 1 and schedule in ("1f1b", "zb-h1"):  # torch: whole rounds (L3192-3198)
        return m % max(1, m // pp) == 0
    if schedule == "combined-1f1b":  # Megatron: VPP with pp > 1, whole groups of pp
        return pp == 1 or (vpp > 1 and m % pp == 0)
    return True


def _closed_slots(schedule: str, pp: int, vpp: int, m: int, ratio) -> tuple | None:
    """The slots of the schedules whose longest path has a closed form for equal stages, or
    ``None``: 1F1B and GPipe ``m + pp - 1`` (Narayanan et al. 2021 §2.2, GPipe Huang et al.
    2019 §2.2), interleaved and Looped BFS ``m + (pp-1)/vpp`` (Narayanan §2.2.2, Lamy-Poirier
    2023 §4; interleaved with fewer than ``pp`` micro-batches, torch's one round of ``m``, each
    missing one adds ``(vpp-1)/vpp``), ZB-H1 ``(pp-1)/vpp`` times
    ``max(F, B, F + B - W)`` beyond ``m`` (Qi et al. 2024 §3.1, ZB-H1: ``(p-1)(T_F + T_B -
    T_W)`` where ``T_W`` is at most ``T_F`` and ``T_B``; the max covers the others), Megatron's
    combined 1F1B the interleaved slots for every phase with ``pp`` fewer paired steps on the
    path than slots (the warm-up and drain run unpaired), each found equal to the simulation
    in ``tests/test_schedule_slots.py``."""
    f, b, w, _ = ratio
    if pp == 1 and schedule not in ("dualpipe-v", "dualpipe"):  # one rank: no bubble
        return (m, m, m, m - 1) if schedule == "combined-1f1b" else (m, m, m, 0)
    if schedule == "gpipe" or (schedule == "1f1b" and vpp == 1):
        return (m + pp - 1,) * 3 + (0,)
    if schedule == "1f1b":  # torch's rounds of max(pp, m) micro-batches; below pp, less overlap
        short = max(0, pp - m)
        return (m + (pp - 1) / vpp + short * (vpp - 1) / vpp,) * 3 + (0,)
    if schedule == "combined-1f1b" and m % pp == 0:  # every phase as interleaved; pp pairs less
        slots = m + (pp - 1) / vpp
        return (slots, slots, slots, slots - pp)
    if m % pp == 0 and schedule == "looped-bfs":
        return (m + (pp - 1) / vpp,) * 3 + (0,)
    if m >= pp and schedule == "zb-h1":
        extra = (pp - 1) / vpp
        forms = {f: (1, 0, 0), b: (0, 1, 0), f + b - w: (1, 1, -1)}
        shape = forms[max(forms)]
        return tuple(m + extra * k for k in shape) + (0,)
    return None


def ratio_free(schedule: str, pp: int, vpp: int, m: int) -> bool:
    """Whether ``schedule_slots`` are the same at every phase time: a closed form with one
    longest path (all but ZB-H1's, whose path is the longest of three forms)."""
    if not orderable(schedule, pp, vpp, m):
        return True
    closed = _closed_slots(schedule, pp, vpp, m, (1.0, 1.0, 1.0, 0.0))
    return closed is not None and (schedule != "zb-h1" or pp == 1)


def _simulated_counts(schedule: str, pp: int, vpp: int, m: int, ratio) -> np.ndarray:
    f, b, w, h = (x / vpp for x in ratio)
    sim = simulate(schedule, pp, vpp, m, f, b, w, pair_hidden_s=h, critical=True)
    return np.asarray(sim.critical, dtype=np.float64) / vpp


@functools.lru_cache(maxsize=65536)
def schedule_slots(schedule: str, pp: int, vpp: int, m: int, ratio) -> tuple[float, ...]:
    """Slots of each phase: ``(forward, input gradient, weight gradient, pairs)`` such that one
    step's pipeline takes ``sF*F + sI*I + sW*W - sP*H`` for equal stages whose micro-batch
    times are ``ratio = (F, I, W, H)`` (``H``: what one paired step hides). They are the
    operations on the longest path at those times (per stage: a chunk's operation counts
    ``1/vpp``), so at any other times they give the length of that same path: a lower bound of
    the step, exact at ``ratio`` (and everywhere for the closed forms)."""
    if not orderable(schedule, pp, vpp, m):
        return (np.inf, np.inf, np.inf, 0.0)
    closed = _closed_slots(schedule, pp, vpp, m, ratio)
    if closed is not None:
        return tuple(float(x) for x in closed)
    if pp == 1 or m < STEADY_FROM * pp or m in (STEADY_FROM * pp, (STEADY_FROM + 1) * pp):
        return tuple(_simulated_counts(schedule, pp, vpp, m, ratio).tolist())
    low = _simulated_counts(schedule, pp, vpp, STEADY_FROM * pp, ratio)
    high = _simulated_counts(schedule, pp, vpp, (STEADY_FROM + 1) * pp, ratio)
    return tuple((low + (high - low) * (m - STEADY_FROM * pp) / pp).tolist())


SEQUENTIAL_PAIRS: frozenset[str] = frozenset({"dualpipe-v"})
"""Schedules whose paired steps run the forward to its end before the backward: torch's
runtime runs ``OVERLAP_F_B``'s sub-actions one after the other (schedules.py L2889-2894;
torchtitan registers no overlapped runner), so the forward's activations are all held before
the backward frees any. Megatron's combined 1F1B and DeepSeek's DualPipe interleave the two
layer by layer, so their pairs are counted once done."""


def _held_at_peak(arrays, vpp: int, *, sequential_pairs: bool) -> tuple[int, ...]:
    """Per chunk, the micro-batches whose activations a rank holds at its peak, from its steps'
    ``(phase0, chunk0, phase1, chunk1)`` (``_Graph.steps``): a forward takes them, a whole
    backward or a weight gradient gives them back (an input gradient keeps what the weight
    gradient needs: Qi et al. 2024 §4.1 count ``M_B`` until ``W``)."""
    p0, c0, p1, c1 = arrays
    sign = np.array([1, 0, -1, -1])  # F, I, W, B
    first = np.zeros((len(p0), vpp), dtype=np.int64)
    first[np.arange(len(p0)), c0] = sign[p0]
    second = np.zeros_like(first)
    paired = p1 >= 0
    second[np.flatnonzero(paired), c1[paired]] = sign[p1[paired]]
    after = np.cumsum(first + second, axis=0)
    held = after
    if sequential_pairs:  # the moment between a pair's forward and its backward counts too
        held = np.concatenate([after, after - second])
    peak = int(np.argmax(held.sum(axis=1)))
    return tuple(int(x) for x in held[peak])


def _first_chunks(m: int, vpp: int, group: int, units: int) -> tuple[int, ...]:
    """How many of the first ``units`` forwards of ``megatron_chunks(m, vpp, group)`` fall on
    each chunk, group by group (each group of micro-batches runs through every chunk)."""
    counts = [0] * vpp
    for first in range(0, m, group):
        size = min(group, m - first)
        for chunk in range(vpp):
            take = min(size, units)
            counts[chunk] += take
            units -= take
            if units == 0:
                return tuple(counts)
    return tuple(counts)


def _closed_in_flight(schedule: str, pp: int, vpp: int, m: int, rank: int) -> tuple | None:
    """The peaks that have a closed form (each equal to the order's in
    ``tests/test_schedule_slots.py``), or ``None``. The loop-style schedules peak once their
    warm-up is done: 1F1B (and the combined 1F1B, whose extra warm-up forward is offset by the
    pair that follows) holds the first ``warm-up + 1`` forwards, ``min(pp - rank, m)`` without
    interleaving (Megatron ``get_pp_rank_microbatches``, torch ``_get_warmup_ops``); ZB-H1
    frees nothing before its first ``W``, ``rank`` steps later (torch
    ``num_1f1b_microbatches = rank``). The V schedules peak in their first ``F1``: ZB-V holds
    ``2*pp - rank - 1`` micro-batches on the first chunk and ``rank + 1`` on the second (once the
    padding to ``2*pp - 1`` is gone), DualPipeV one more on the first (its first pair)."""
    total = m * vpp
    if schedule in ("1f1b", "combined-1f1b", "zb-h1") and (vpp > 1 or schedule != "zb-h1"):
        if vpp == 1:
            return (min(pp - rank, m),)
        group = m // max(1, m // pp)
        factor, extra = (1, rank) if schedule == "zb-h1" else (2, 0)
        warm = min((vpp - 1) * group + factor * (pp - 1 - rank), total)
        return _first_chunks(m, vpp, group, min(warm + 1 + extra, total))
    if schedule == "zb-v" and m >= 2 * pp - 1:
        return (2 * pp - rank - 1, rank + 1)
    if schedule == "dualpipe-v" and m >= 2 * pp:
        return (2 * pp - rank, rank + 1)
    return None


@functools.lru_cache(maxsize=4096)
def in_flight_chunks(schedule: str, pp: int, vpp: int, m: int) -> tuple[tuple[int, ...], ...]:
    """Per rank, per local chunk: the micro-batches held at the rank's peak (``_held_at_peak``;
    with ``SEQUENTIAL_PAIRS`` a paired step peaks after its forward).
    GPipe and Looped BFS run every forward first, so they hold all ``m``; the others peak in
    their warm-up, so past ``EXTRAPOLATE_ABOVE*pp`` micro-batches the peak no longer grows
    (``tests/test_schedule_slots.py``)."""
    if schedule in ("gpipe", "looped-bfs") or not orderable(schedule, pp, vpp, m):
        return ((m,) * vpp,) * pp
    closed = [_closed_in_flight(schedule, pp, vpp, m, rank) for rank in range(pp)]
    if all(c is not None for c in closed):
        return tuple(closed)
    m = min(m, EXTRAPOLATE_ABOVE * pp)
    graph = _schedule_graph(schedule, pp, vpp, m)
    sequential = schedule in SEQUENTIAL_PAIRS
    chunks = local_chunks(schedule, vpp)
    return tuple(
        _held_at_peak(arrays, chunks, sequential_pairs=sequential) for arrays in graph.steps
    )
