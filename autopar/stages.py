"""Per-stage pipeline plans: how many layers each pipeline chunk holds and what each stage
recomputes, with the schedule arithmetic that prices them.

A plan for ``pp`` stages of ``vpp`` chunks lists the layers of every chunk in Megatron's virtual
stage order (chunk ``c = j*pp + i`` is chunk ``j`` of stage ``i``; chunks hold consecutive layers
in model order, ``--pipeline-model-parallel-layout``, Megatron
``pipeline_parallel_layer_layout.py``). The input embedding sits on the first chunk, the output
layer, the loss and the MTP modules on the last. Each stage recomputes nothing, the attention
core of every layer (``selective``), or the first ``k`` layers of each of its chunks in full
(``full:k``: ``--recompute-granularity full --recompute-method block --recompute-num-layers k``,
Megatron ``transformer_config.py`` ``recompute_method``).

Schedule (``m`` micro-batches, stage ``i`` of ``p``, ``v`` chunks per stage; ``t_i`` = one
micro-batch's forward + backward on stage ``i``):

- step time, 1F1B: ``(m - 1) * max_i t_i + sum_i t_i``: the slowest stage runs ``m`` micro-batches
  back to back; the first micro-batch's forward and the last one's backward cross every other
  stage once (warm-up and drain). With equal stages this is Narayanan et al. 2021 §2.2
  ``(m + p - 1) * t``. Interleaved: ``(m - 1/v) * max_i t_i + sum_i t_i / v``, which is
  ``(m + (p-1)/v) * t`` with equal stages (the bubble shrinks ``v`` times; Narayanan §2.2.2).
  ``autopar.schedule`` simulates the schedule itself; ``tests/test_stages.py`` measures the
  formula against it.
- activations in flight, 1F1B: stage ``i`` holds ``min(p - i, m)`` micro-batches (Megatron
  ``schedules.py`` ``forward_backward_pipelining_without_interleaving``: ``p - i - 1`` warm-up
  forwards, then one more before the first backward). Interleaved: ``2*(p - i - 1) + (v-1)*p``
  warm-up forwards plus one, at most ``m*v``, taken in the order of ``get_schedule_table``
  (groups of ``p`` micro-batches per chunk): the counts per chunk weigh that chunk's
  activations (for equal chunks this is Korthikanti et al. 2022 §4.2.3's
  ``p * (1 + (p-1)/(p*v))``, ``theoretical_memory_usage.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar.errors import InputError
from autopar.schedule import schedule_chunks, simulate_step_s
from autopar.stage_costs import StageCosts

RECOMPUTE_CODES: dict[str, int] = {"none": 0, "selective": 1, "full": 2}
FORWARD_SHARE = 1.0 / 3.0
"""Forward's share of a micro-batch's forward + backward without recompute: the backward
computes gradients of inputs and of weights, twice the forward's FLOPs (Narayanan et al. 2021
§3.5, ``96 B s l h^2`` of which the forward is a third); recompute adds to the backward."""
PIPELINE_PLANS: tuple[str, ...] = ("uniform", "per-stage")


@dataclass(frozen=True, slots=True)
class StageRecompute:
    """What one stage recomputes: ``none``, ``selective`` (attention core of every layer) or
    ``full`` for the first ``num_layers`` layers of each of its chunks."""

    mode: str = "none"
    num_layers: int = 0

    def text(self) -> str:
        return f"full:{self.num_layers}" if self.mode == "full" else self.mode

    @classmethod
    def parse(cls, text: str, *, source: str) -> StageRecompute:
        word, _, count = str(text).strip().partition(":")
        if word in ("none", "selective") and not count:
            return cls(word, 0)
        if word == "full" and count.isdigit() and int(count) >= 0:
            return cls("full", int(count)) if int(count) else cls("none", 0)
        raise InputError(
            f"each entry must be none, selective or full:K (K layers per chunk), got {text!r}",
            source=source,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StagePlan:
    """Layers of every chunk (virtual stage order) and each stage's recompute."""

    pp: int
    vpp: int
    chunk_layers: tuple[int, ...]
    recompute: tuple[StageRecompute, ...]

    def chunks_of(self, stage: int) -> tuple[int, ...]:
        """Chunk indices of ``stage`` in its own order (chunk ``j`` is ``j*pp + stage``)."""
        return tuple(j * self.pp + stage for j in range(self.vpp))

    def bounds(self) -> list[tuple[int, int]]:
        """``[start, end)`` layers of each chunk."""
        out, start = [], 0
        for n in self.chunk_layers:
            out.append((start, start + n))
            start += n
        return out

    def stage_layers(self, stage: int) -> int:
        return sum(self.chunk_layers[c] for c in self.chunks_of(stage))

    def recomputed_layers(self, chunk: int) -> int:
        rec = self.recompute[chunk % self.pp]
        return min(rec.num_layers, self.chunk_layers[chunk]) if rec.mode == "full" else 0

    def is_even(self) -> bool:
        return len(set(self.chunk_layers)) == 1 and len(set(self.recompute)) == 1

    def text(self) -> str:
        layers = ",".join(map(str, self.chunk_layers))
        return f"layers {layers}; recompute {','.join(r.text() for r in self.recompute)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "pp": self.pp,
            "vpp": self.vpp,
            "chunk_layers": list(self.chunk_layers),
            "recompute": [r.text() for r in self.recompute],
        }


def plan_recompute_mode(plan: StagePlan) -> str:
    """The layout's ``recompute`` for a plan: full if any stage recomputes layers fully, else
    selective if any stage does, else none."""
    modes = {r.mode for r in plan.recompute if r.mode != "full" or r.num_layers}
    return "full" if "full" in modes else "selective" if "selective" in modes else "none"


def check_plan(plan: StagePlan, *, num_layers: int, recompute_modes: Sequence[str]) -> None:
    """Raise ``InputError`` naming the rule an explicit plan breaks."""
    chunks = plan.pp * plan.vpp
    if len(plan.chunk_layers) != chunks:
        raise InputError(
            f"has {len(plan.chunk_layers)} entries; pp*vpp = {plan.pp}*{plan.vpp} = {chunks} "
            "chunks need one each",
            source="--stage-layers",
            field="entries == pp*vpp",
        )
    if any(n < 0 for n in plan.chunk_layers):
        raise InputError("layer counts must be >= 0", source="--stage-layers", field="counts")
    if sum(plan.chunk_layers) != num_layers:
        raise InputError(
            f"sums to {sum(plan.chunk_layers)}, the model has {num_layers} layers",
            source="--stage-layers",
            field="sum == num_layers",
        )
    # A chunk may hold no decoder layer: Megatron's --pipeline-model-parallel-layout checks
    # only the embedding first, the loss last and the layer counts
    # (pipeline_parallel_layer_layout.py validate_layer_layout), and DeepSeek-V3's published
    # layout "Et*3|(tt|)*29,m|L" gives its last two chunks the MTP module and the loss alone.
    if len(plan.recompute) != plan.pp:
        raise InputError(
            f"has {len(plan.recompute)} entries for {plan.pp} stages (one, or one per stage)",
            source="--stage-recompute",
            field="entries == pp",
        )
    for rec in plan.recompute:
        if rec.mode not in recompute_modes:
            raise InputError(
                f"{rec.text()} is not among the allowed modes ({', '.join(recompute_modes)})",
                source="--stage-recompute",
                field="recompute modes",
            )


def parse_plan(
    *, pp: int, vpp: int, stage_layers: str | Sequence[int], stage_recompute: str | None
) -> StagePlan:
    """A plan from ``--stage-layers 15,16,...`` and ``--stage-recompute full:2,none,...`` (one
    entry applies to every stage)."""
    items = stage_layers.split(",") if isinstance(stage_layers, str) else list(stage_layers)
    try:
        layers = tuple(int(str(x).strip()) for x in items)
    except ValueError:
        raise InputError(
            f"must be comma-separated layer counts, got {stage_layers!r}", source="--stage-layers"
        ) from None
    texts = (stage_recompute or "none").split(",")
    recompute = tuple(StageRecompute.parse(t, source="--stage-recompute") for t in texts)
    if len(recompute) == 1:
        recompute = recompute * pp
    return StagePlan(pp=pp, vpp=vpp, chunk_layers=layers, recompute=recompute)


def even_plan(num_layers: int, pp: int, vpp: int, recompute: StageRecompute) -> StagePlan:
    """Layers spread as evenly as the count allows, the extra ones on the middle chunks (the
    first and last chunks also hold the embedding and the loss; Megatron's
    ``--account-for-embedding/loss-in-pipeline-split`` idea)."""
    chunks = pp * vpp
    base, extra = divmod(num_layers, chunks)
    order = list(range(1, chunks - 1)) + [0, chunks - 1] if chunks > 2 else list(range(chunks))
    layers = [base] * chunks
    for c in order[:extra]:
        layers[c] += 1
    return StagePlan(pp=pp, vpp=vpp, chunk_layers=tuple(layers), recompute=(recompute,) * pp)


@functools.cache
def in_flight(pp: int, vpp: int, num_microbatches: int, stage: int) -> tuple[int, ...]:
    """Micro-batches whose activations each chunk of ``stage`` holds at the stage's peak
    (module docstring)."""
    m = num_microbatches
    if vpp == 1:
        return (min(pp - stage, m),)
    total = m * vpp
    warmup = min(2 * (pp - stage - 1) + (vpp - 1) * pp, total)
    units = min(warmup + 1, total)
    order = schedule_chunks(m, vpp, pp)[:units]
    return tuple(order.count(j) for j in range(vpp))


def pipeline_time_s(stage_times_s: np.ndarray, num_microbatches, vpp: int) -> np.ndarray:
    """Step time of the schedule from per-stage micro-batch times ``(rows, pp)`` (module
    docstring)."""
    m = np.asarray(num_microbatches, dtype=np.float64)
    slowest = stage_times_s.max(axis=1)
    return (m - 1.0 / vpp) * slowest + stage_times_s.sum(axis=1) / vpp


@dataclass(frozen=True, slots=True, kw_only=True)
class StageFigures:
    """Per-stage figures of a plan over the rows of a ``StageCosts``."""

    time_s: np.ndarray
    """``(rows, pp)``: one micro-batch, forward + backward (+ recompute)."""
    memory_bytes: np.ndarray
    """``(rows, pp)``: peak bytes of each stage."""
    static_bytes: np.ndarray
    activation_bytes: np.ndarray
    """``(rows, pp)``: activations in flight at the peak."""
    num_microbatches: np.ndarray
    step_time_s: np.ndarray
    """Step terms plus the schedule formula (``pipeline_time_s``), what the search ranks by."""
    chunk_forward_s: np.ndarray
    """``(rows, pp, vpp)``: one micro-batch's forward on chunk ``j`` of stage ``i``."""
    chunk_backward_s: np.ndarray
    """``(rows, pp, vpp)``: its backward, with the recompute."""


def _chunk_kinds(plan: StagePlan, kinds: Sequence[str]) -> list[tuple[dict, dict]]:
    """Per chunk: (kind counts of all its layers, kind counts of its fully recomputed ones)."""
    out = []
    for c, (start, end) in enumerate(plan.bounds()):
        full = plan.recomputed_layers(c)
        counts: dict[str, int] = {}
        recomputed: dict[str, int] = {}
        for index in range(start, end):
            counts[kinds[index]] = counts.get(kinds[index], 0) + 1
            if index < start + full:
                recomputed[kinds[index]] = recomputed.get(kinds[index], 0) + 1
        out.append((counts, recomputed))
    return out


def stage_figures(plan: StagePlan, costs: StageCosts, num_microbatches: np.ndarray) -> StageFigures:
    """Time and memory of every stage of ``plan`` on each row of ``costs``."""
    m_rows = np.asarray(num_microbatches, dtype=np.int64)
    rows = len(m_rows)
    pp, chunks = plan.pp, plan.pp * plan.vpp
    chunk_time = np.zeros((rows, chunks))
    chunk_fwd = np.zeros((rows, chunks))
    chunk_act = np.zeros((rows, chunks))
    chunk_static = np.zeros((rows, chunks))
    for c, (counts, recomputed) in enumerate(_chunk_kinds(plan, costs.layer_kinds)):
        mode = plan.recompute[c % pp].mode
        base = RECOMPUTE_CODES["selective"] if mode == "selective" else 0
        for kind, n in counts.items():
            full = recomputed.get(kind, 0)
            time, act = costs.time_s[kind], costs.activation_bytes[kind]
            chunk_time[:, c] += (n - full) * time[:, base] + full * time[:, 2]
            chunk_fwd[:, c] += n * FORWARD_SHARE * time[:, 0]
            chunk_act[:, c] += (n - full) * act[:, base] + full * act[:, 2]
            chunk_static[:, c] += n * costs.static_bytes[kind]
    chunk_act[:, 0] += costs.first_activation_bytes
    chunk_act[:, chunks - 1] += costs.last_activation_bytes
    times = np.zeros((rows, pp))
    static = np.zeros((rows, pp))
    acts = np.zeros((rows, pp))
    distinct_m = np.unique(m_rows)
    for i in range(pp):
        mine = list(plan.chunks_of(i))
        times[:, i] = chunk_time[:, mine].sum(axis=1) + costs.every_time_s
        static[:, i] = chunk_static[:, mine].sum(axis=1) + costs.every_static_bytes
        if i == 0:
            times[:, i] += costs.first_time_s
            static[:, i] += costs.first_static_bytes
        if i == pp - 1:
            times[:, i] += costs.last_time_s
            static[:, i] += costs.last_static_bytes
        rec = plan.recompute[i]
        if rec.mode == "full" and any(plan.recomputed_layers(c) for c in mine):
            static[:, i] += costs.full_workspace_bytes
        if rec.mode == "selective":
            static[:, i] += costs.selective_workspace_bytes
        held = chunk_act[:, mine]
        held[:, 0] += costs.every_activation_bytes
        # in-flight counts per row and chunk: one lookup per distinct micro-batch count
        table = np.array([in_flight(pp, plan.vpp, int(m), i) for m in distinct_m], dtype=np.float64)
        weights = table[np.searchsorted(distinct_m, m_rows)]
        acts[:, i] = (weights * held).sum(axis=1)
    step = costs.step_time_s + pipeline_time_s(times, m_rows, plan.vpp)
    # Per chunk (stage-major): the stage's own terms spread over its chunks, the embedding on
    # its first chunk, the output layer and loss on the last.
    order = [c for i in range(pp) for c in plan.chunks_of(i)]
    total = (
        chunk_time[:, order].reshape(rows, pp, plan.vpp)
        + (costs.every_time_s / plan.vpp)[:, None, None]
    )
    total[:, 0, 0] += costs.first_time_s
    total[:, pp - 1, plan.vpp - 1] += costs.last_time_s
    forward = chunk_fwd[:, order].reshape(rows, pp, plan.vpp) + FORWARD_SHARE * (
        total - chunk_time[:, order].reshape(rows, pp, plan.vpp)
    )
    return StageFigures(
        time_s=times,
        memory_bytes=static + acts,
        static_bytes=static,
        activation_bytes=acts,
        num_microbatches=m_rows,
        step_time_s=step,
        chunk_forward_s=forward,
        chunk_backward_s=total - forward,
    )


def simulated_pipeline_s(figures: StageFigures, row: int) -> float:
    """The pipeline part of the step (step terms excluded) for one row, by simulating
    Megatron's schedule over the chunk times (``autopar.schedule``). The formula of
    ``pipeline_time_s`` is exact for equal stages only: for unequal ones 1F1B's is an upper
    bound and the interleaved one is off either way (``tests/test_stages.py``)."""
    return simulate_step_s(
        figures.chunk_forward_s[row],
        figures.chunk_backward_s[row],
        int(figures.num_microbatches[row]),
    )


def stage_rows(plan: StagePlan, figures: StageFigures, row: int, kinds: Sequence[str]) -> list:
    """The per-stage table of one row: layers and their kinds, recompute, time, memory, in-flight
    micro-batches (``StageEstimate`` records)."""
    out = []
    bounds = plan.bounds()
    for i in range(plan.pp):
        mine = plan.chunks_of(i)
        kinds_here: dict[str, int] = {}
        for c in mine:
            for index in range(*bounds[c]):
                kinds_here[kinds[index]] = kinds_here.get(kinds[index], 0) + 1
        out.append(
            StageEstimate(
                stage=i,
                chunk_layers=tuple(plan.chunk_layers[c] for c in mine),
                first_layer=bounds[mine[0]][0],
                layer_kinds=kinds_here,
                holds=tuple(
                    part
                    for part, here in (("embedding", i == 0), ("loss", i == plan.pp - 1))
                    if here
                ),
                recompute=plan.recompute[i].text(),
                time_s=float(figures.time_s[row, i]),
                memory_bytes=float(figures.memory_bytes[row, i]),
                activation_bytes=float(figures.activation_bytes[row, i]),
                in_flight=in_flight(plan.pp, plan.vpp, int(figures.num_microbatches[row]), i),
            )
        )
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class StageEstimate:
    """One row of the per-stage table."""

    stage: int
    chunk_layers: tuple[int, ...]
    first_layer: int
    layer_kinds: dict[str, int]
    holds: tuple[str, ...]
    recompute: str
    time_s: float
    """One micro-batch, forward + backward (+ recompute)."""
    memory_bytes: float
    activation_bytes: float
    in_flight: tuple[int, ...]
    """Micro-batches in flight per chunk at the stage's peak."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "layers": sum(self.chunk_layers),
            "chunk_layers": list(self.chunk_layers),
            "first_layer": self.first_layer,
            "layer_kinds": dict(self.layer_kinds),
            "holds": list(self.holds),
            "recompute": self.recompute,
            "time_s": self.time_s,
            "memory_bytes": self.memory_bytes,
            "activation_bytes": self.activation_bytes,
            "in_flight": list(self.in_flight),
        }
