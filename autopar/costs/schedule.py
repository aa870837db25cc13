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
