"""Per-stage tables for models whose layers are all of one kind: for every outer row and every
layer count ``n`` a stage may hold, the least time of one micro-batch on that stage over the
ways to spread ``n`` layers over its chunks and to recompute them, among those that fit its
memory (``inf`` when none fits).

Stages are independent given their layer counts: a stage's time and memory depend only on its
own chunks and recompute (``autopar.layout.stages``). So, with one layer kind, the best plan for
given stage layer counts takes each stage's entry of these tables, and the plan search reduces to
the layer counts per stage (``autopar.pipeline.search``). A stage's chunks differ by at most one
layer (the first chunk of the first stage and the last chunk of the last stage, which also hold the
embedding and the loss, may hold fewer), as the CP-SAT model requires for the interleaved
formula.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.costs.stage_costs import StageCosts
from autopar.costs.stage_figures import in_flight
from autopar.layout.stages import StageRecompute


@dataclass(frozen=True, slots=True)
class StageTable:
    """One stage over ``rows`` outer rows and ``0..L`` layers."""

    time_s: np.ndarray
    """``(rows, L+1)``: least time, ``inf`` where nothing fits."""
    option: np.ndarray
    """``(rows, L+1)``: 0 none, 1 selective, ``1 + k`` full for ``k`` layers per chunk."""
    spread: np.ndarray
    """``(rows, L+1)``: index into ``spreads[n]``."""
    spreads: list[list[tuple[int, ...]]]
    """Per ``n``: the chunk layer counts considered (chunk order of the stage)."""

    def recompute(self, row: int, n: int) -> StageRecompute:
        code = int(self.option[row, n])
        if code == 1:
            return StageRecompute("selective", 0)
        return StageRecompute("full", code - 1) if code > 1 else StageRecompute()

    def chunks(self, row: int, n: int) -> tuple[int, ...]:
        return self.spreads[n][int(self.spread[row, n])]


def least_layers(p: int, v: int, stage: int, num_layers: int) -> int:
    """Fewest layers the stage may hold (every chunk but the pipeline's first and last holds
    one)."""
    if p == 1:
        return num_layers
    ends = (stage == 0) + (stage == p - 1)
    return v - min(ends, 1) if v > 1 else (0 if ends else 1)


def _spreads(n: int, p: int, v: int, stage: int, weights: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Chunk layer counts of ``n`` layers on ``stage``: middle chunks within one layer of each
    other (the extra ones where fewer micro-batches are in flight), the end chunk (first chunk
    of stage 0, last of stage ``p-1``) anywhere from 0 to one above them."""
    if v == 1:
        return [(n,)]
    end = 0 if stage == 0 else (v - 1 if stage == p - 1 else None)
    others = [j for j in range(v) if j != end]
    order = sorted(others, key=lambda j: (weights[j], -j))
    out = []
    end_values = range(0, n + 1) if end is not None else [None]
    for e in end_values:
        rest = n - (e or 0)
        q, extra = divmod(rest, len(others))
        if q < 1 or (e is not None and e > q + 1):
            continue
        chunks = [0] * v
        for rank, j in enumerate(order):
            chunks[j] = q + (1 if rank < extra else 0)
        if end is not None:
            chunks[end] = e
        out.append(tuple(chunks))
    return out


def stage_table(
    costs: StageCosts,
    *,
    p: int,
    v: int,
    stage: int,
    num_microbatches: np.ndarray,
    modes: tuple[str, ...],
    capacity_bytes: float,
) -> StageTable:
    """The table of ``stage`` over the rows of ``costs`` (one layer kind)."""
    kind = costs.layer_kinds[0]
    t, a, s = costs.time_s[kind], costs.activation_bytes[kind], costs.static_bytes[kind]
    num_layers = len(costs.layer_kinds)
    rows = len(num_microbatches)
    fixed_t = costs.every_time_s.copy()
    static = costs.every_static_bytes.copy()
    extra = np.zeros((rows, v))
    extra[:, 0] += costs.every_activation_bytes
    if stage == 0:
        fixed_t = fixed_t + costs.first_time_s
        static = static + costs.first_static_bytes
        extra[:, 0] += costs.first_activation_bytes
    if stage == p - 1:
        fixed_t = fixed_t + costs.last_time_s
        static = static + costs.last_static_bytes
        extra[:, v - 1] += costs.last_activation_bytes
    distinct = np.unique(num_microbatches)
    table = np.array([in_flight(p, v, int(m), stage) for m in distinct], dtype=np.float64)
    w = table[np.searchsorted(distinct, num_microbatches)]  # rows x v
    weights = tuple(int(x) for x in table[0])
    fixed_act = (w * extra).sum(axis=1)
    best_t = np.full((rows, num_layers + 1), np.inf)
    option = np.zeros((rows, num_layers + 1), dtype=np.int64)
    spread_index = np.zeros((rows, num_layers + 1), dtype=np.int64)
    spreads: list[list[tuple[int, ...]]] = []
    least = least_layers(p, v, stage, num_layers)
    for n in range(num_layers + 1):
        options = _spreads(n, p, v, stage, weights) if n >= least else []
        spreads.append(options)
        for d_index, d in enumerate(options):
            d_arr = np.array(d, dtype=np.float64)
            weighted = w @ d_arr  # rows
            base_static = static + n * s
            none_mem = base_static + fixed_act + weighted * a[:, 0]
            candidates = []
            if "none" in modes:
                candidates.append((n * t[:, 0] + fixed_t, none_mem, 0))
            if "selective" in modes:
                mem = base_static + costs.selective_workspace_bytes + fixed_act + weighted * a[:, 1]
                candidates.append((n * t[:, 1] + fixed_t, mem, 1))
            for time_s, mem, code in candidates:
                take = (mem <= capacity_bytes) & (time_s < best_t[:, n])
                best_t[:, n] = np.where(take, time_s, best_t[:, n])
                option[:, n] = np.where(take, code, option[:, n])
                spread_index[:, n] = np.where(take, d_index, spread_index[:, n])
            if "full" in modes and n > 0:
                top = int(max(d))
                ks = np.arange(1, top + 1) if "none" in modes else np.array([top])
                mins = np.minimum(ks[:, None], d_arr[None, :])  # K x v
                recomputed = mins.sum(axis=1)  # K
                saved = w @ mins.T  # rows x K
                time_k = (n * t[:, 0] + fixed_t)[:, None] + recomputed[None, :] * (
                    t[:, 2] - t[:, 0]
                )[:, None]
                mem_k = (none_mem + costs.full_workspace_bytes)[:, None] - saved * (
                    a[:, 0] - a[:, 2]
                )[:, None]
                time_k = np.where(mem_k <= capacity_bytes, time_k, np.inf)
                pick = np.argmin(time_k, axis=1)
                chosen = time_k[np.arange(rows), pick]
                take = chosen < best_t[:, n]
                best_t[:, n] = np.where(take, chosen, best_t[:, n])
                option[:, n] = np.where(take, 1 + ks[pick], option[:, n])
                spread_index[:, n] = np.where(take, d_index, spread_index[:, n])
    return StageTable(best_t, option, spread_index, spreads)
