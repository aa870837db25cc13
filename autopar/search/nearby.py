"""Nearby problems an explanation can offer (issue 21: infeasibility that helps): each change a
user can make, as the flag that makes it and the changed problem. ``autopar.search.explain``
checks each by scoring it.

- Lifting a restriction in force (``lifts``): only those actually in force, named by the autopar
  flag that lifts them (never one that is already the default).
- GPU counts (``nearby_gpu_counts``): the counts a layout can split, nearest first, below before
  above at the same distance (a user with 1,000 GPUs can use 992 of them). A count is a product
  of a TP, CP, PP and DP size that each pass their own rules (the heads, the sequence, the
  layers, the batch), so only counts with a chance are tried; when memory binds, the power-of-
  two multiples that spread the nearest miss thin enough.
- Batches (``nearby_batches``): half the batch, and the nearest multiple of the GPU count.
- Sequences (``nearby_sequences``): half the sequence length, when it halves evenly.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autopar.base.axes import RECOMPUTE_MODES, ZERO_STAGES
from autopar.inputs.specs import Problem
from autopar.layout.results import NearestMiss
from autopar.layout.rules import layout_rules

Change = tuple[str, Problem]
MAX_COUNT_CANDIDATES = 12


def _options(problem: Problem, **changes) -> Problem:
    return dataclasses.replace(problem, options=dataclasses.replace(problem.options, **changes))


def _training(problem: Problem, **changes) -> Problem:
    return dataclasses.replace(problem, training=dataclasses.replace(problem.training, **changes))


def lifts(problem: Problem) -> list[Change]:
    """Each restriction in force, lifted alone (module docstring)."""
    o = problem.options
    out: list[Change] = []
    if set(o.zero_stages) != set(ZERO_STAGES):
        stages = ",".join(map(str, o.zero_stages))
        out.append((f"--zero any (ZeRO {stages} now)", _options(problem, zero_stages=ZERO_STAGES)))
    if set(o.recompute) != set(RECOMPUTE_MODES):
        modes = ",".join(o.recompute)
        out.append((f"--recompute any ({modes} now)", _options(problem, recompute=RECOMPUTE_MODES)))
    if not o.uneven_pipeline:
        out.append(("--uneven-pipeline", _options(problem, uneven_pipeline=True)))
    for allowed, flag, field in (
        (o.allow_cp, "--context-parallel", "allow_cp"),
        (o.allow_ep, "--expert-parallel", "allow_ep"),
        (o.allow_interleaving, "--interleaving", "allow_interleaving"),
    ):
        if not allowed:
            out.append((flag, _options(problem, **{field: True})))
    for dim, value in o.pins:
        rest = tuple(p for p in o.pins if p[0] != dim)
        out.append((f"drop --{dim.replace('_', '-')} {value}", _options(problem, pins=rest)))
    for dim, value in o.maxima:
        rest = tuple(m for m in o.maxima if m[0] != dim)
        flag = f"--max-{dim.replace('_', '-')} {value}"
        out.append((f"drop {flag}", _options(problem, maxima=rest)))
    if o.tp_within_node:
        node = problem.cluster.gpus_per_node
        out.append(
            (
                f"--no-tp-within-node (TP beyond the {node} GPUs of an NVLink domain)",
                _options(problem, tp_within_node=False),
            )
        )
    return out


def _allowed(problem: Problem, axis: str, values: np.ndarray) -> np.ndarray:
    """The values of ``axis`` every single-axis rule of the problem allows."""
    keep = np.ones(len(values), dtype=bool)
    for rule in layout_rules(problem):
        if rule.axes == (axis,) and rule.family != "pins and limits":
            keep &= np.asarray(rule.check({axis: values}), dtype=bool)
    return values[keep]


def _divisors(n: int) -> np.ndarray:
    small = np.arange(1, int(n**0.5) + 1)
    small = small[n % small == 0]
    return np.unique(np.concatenate([small, n // small]))


def splittable_counts(problem: Problem, most: int) -> np.ndarray:
    """GPU counts up to ``most`` that some TP x CP x PP x DP size can split, each size allowed by
    its own rules (heads and FFN for TP, the sequence for CP, the layers for PP, a DP that
    divides the batch)."""
    node = problem.cluster.gpus_per_node
    tp = _allowed(problem, "tp", np.arange(1, max(node, problem.model.num_attention_heads) + 1))
    cp = _allowed(problem, "cp", np.arange(1, max(1, problem.training.seq_len // 2) + 1))
    pp = np.arange(1, problem.model.num_layers + 1)
    dp = _divisors(problem.training.global_batch_sequences)
    counts = np.array([1], dtype=np.int64)
    for sizes in (tp, cp, pp, dp):
        counts = np.unique(np.outer(counts, sizes).ravel())
        counts = counts[counts <= most]
    return counts


def nearby_gpu_counts(problem: Problem, miss: NearestMiss | None = None) -> list[Change]:
    """GPU counts to try, nearest first (module docstring)."""
    num_gpus = problem.training.num_gpus
    if miss is not None:  # memory binds: enough GPUs to spread the nearest miss thin enough
        ratio = miss.min_memory_bytes / miss.capacity_bytes
        first = int(np.ceil(np.log2(max(ratio, 1.0))))
        picked = [num_gpus * 2**k for k in range(max(first, 1), first + 3)]
    else:
        counts = splittable_counts(problem, 2 * num_gpus)
        counts = counts[counts != num_gpus]
        nearest = np.lexsort((counts > num_gpus, np.abs(counts - num_gpus)))
        picked = [int(c) for c in counts[nearest][:MAX_COUNT_CANDIDATES]]
    return [(f"use {n} GPUs (--gpus {n})", _training(problem, num_gpus=n)) for n in picked]


def nearby_batches(problem: Problem) -> list[Change]:
    """Half the batch, and the nearest multiple of the GPU count (every DP size divides it)."""
    t = problem.training
    rounded = max(t.num_gpus, round(t.global_batch_sequences / t.num_gpus) * t.num_gpus)
    batches = {t.global_batch_sequences // 2, rounded} - {0, t.global_batch_sequences}
    return [
        (
            f"use a global batch of {b} sequences (--global-batch {b})",
            _training(problem, global_batch_sequences=b),
        )
        for b in sorted(batches)
    ]


def nearby_sequences(problem: Problem) -> list[Change]:
    """Half the sequence length, when it halves evenly."""
    seq_len = problem.training.seq_len
    if seq_len % 2:
        return []
    half = seq_len // 2
    return [
        (
            f"train with sequences of {half} tokens (--seq-len {half})",
            _training(problem, seq_len=half),
        )
    ]
