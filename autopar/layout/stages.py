"""Per-stage pipeline plans: how many layers each pipeline chunk holds and what each stage
recomputes (the figures that price a plan: ``autopar.costs.stage_figures``).

A plan for ``pp`` stages of ``vpp`` chunks lists the layers of every chunk in Megatron's virtual
stage order (chunk ``c = j*pp + i`` is chunk ``j`` of stage ``i``; chunks hold consecutive layers
in model order, ``--pipeline-model-parallel-layout``, Megatron
``pipeline_parallel_layer_layout.py``). The input embedding sits on the first chunk, the output
layer, the loss and the MTP modules on the last. Each stage recomputes nothing, the attention
core of every layer (``selective``), or the first ``k`` layers of each of its chunks in full
(``full:k``: ``--recompute-granularity full --recompute-method block --recompute-num-layers k``,
Megatron ``transformer_config.py`` ``recompute_method``).

Placement: loop-style schedules put chunk ``j*pp + i`` on stage (rank) ``i``; the V schedules
(``V_PLACED``: ZB-V, DualPipeV) put chunks ``i`` and ``2*pp-1-i`` on rank ``i`` (torchtitan
``distributed/pipeline_parallel.py`` ``pipeline_module_split._get_stage_indices``, style ``v``:
``zip(range(pp), range(num_stages - 1, pp - 1, -1))``, pytorch/torchtitan 02ef790), so rank 0
holds the embedding and the loss. The layers are split in model order either way
(``generate_llm_fqn_per_model_part``); only the rank a chunk runs on differs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autopar.base.errors import InputError

RECOMPUTE_CODES: dict[str, int] = {"none": 0, "selective": 1, "full": 2}
PIPELINE_PLANS: tuple[str, ...] = ("uniform", "per-stage")
V_PLACED: frozenset[str] = frozenset({"zb-v", "dualpipe-v"})
"""The schedules that place a rank's two chunks in a V (module docstring; torchtitan picks the
style by ``schedule_class in (ScheduleZBVZeroBubble, ScheduleDualPipeV)``)."""
PLACEMENTS: tuple[str, ...] = ("loop", "v")


def placement_of(schedule: str) -> str:
    """``v`` for the V schedules (``V_PLACED``), else ``loop``."""
    return "v" if schedule in V_PLACED else "loop"


def placed_chunks(pp: int, vpp: int, stage: int, placement: str = "loop") -> tuple[int, ...]:
    """The chunks (virtual stages, model order) rank ``stage`` holds, in its own order: ``j*pp +
    stage`` for its ``j``-th chunk (``loop``), or ``stage`` and ``2*pp-1-stage`` (``v``, two
    chunks per rank)."""
    if placement == "v":
        return (stage, 2 * pp - 1 - stage)
    return tuple(j * pp + stage for j in range(vpp))


def chunk_place(pp: int, chunk: int, placement: str = "loop") -> tuple[int, int]:
    """``(rank, local index)`` of chunk ``chunk`` (model order): ``placed_chunks`` inverted."""
    if placement == "v":
        return (chunk, 0) if chunk < pp else (2 * pp - 1 - chunk, 1)
    return chunk % pp, chunk // pp


def last_stage(pp: int, placement: str = "loop") -> int:
    """The rank that holds the last chunk (the output layer and the loss): ``pp - 1``, or 0
    in a V."""
    return 0 if placement == "v" else pp - 1


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
    placement: str = "loop"
    """``loop`` or ``v`` (module docstring, ``placement_of``)."""

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement {self.placement!r} is not one of {PLACEMENTS}")
        if self.placement == "v" and self.vpp != 2:
            raise InputError(
                f"zb-v and dualpipe-v hold exactly two chunks per rank (vpp == 2), got vpp "
                f"{self.vpp} (torch schedules.py L3505-3509 ZBV, L3691-3695 DualPipeV)",
                source="--vpp",
                field="vpp == 2",
            )

    def chunks_of(self, stage: int) -> tuple[int, ...]:
        """Chunk indices of ``stage`` in its own order (``placed_chunks``)."""
        return placed_chunks(self.pp, self.vpp, stage, self.placement)

    def rank_of(self, chunk: int) -> int:
        """The stage (rank) that holds ``chunk`` (``chunk_place``)."""
        return chunk_place(self.pp, chunk, self.placement)[0]

    @property
    def last_stage(self) -> int:
        return last_stage(self.pp, self.placement)

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
        rec = self.recompute[self.rank_of(chunk)]
        return min(rec.num_layers, self.chunk_layers[chunk]) if rec.mode == "full" else 0

    def is_even(self) -> bool:
        return len(set(self.chunk_layers)) == 1 and len(set(self.recompute)) == 1

    def text(self) -> str:
        layers = ",".join(map(str, self.chunk_layers))
        return f"layers {layers}; recompute {','.join(r.text() for r in self.recompute)}"

    def to_dict(self) -> dict[str, Any]:
        out = {
            "pp": self.pp,
            "vpp": self.vpp,
            "chunk_layers": list(self.chunk_layers),
            "recompute": [r.text() for r in self.recompute],
        }
        return out | ({"placement": self.placement} if self.placement != "loop" else {})


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
    *,
    pp: int,
    vpp: int,
    stage_layers: str | Sequence[int],
    stage_recompute: str | None,
    placement: str = "loop",
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
    return StagePlan(pp=pp, vpp=vpp, chunk_layers=layers, recompute=recompute, placement=placement)


def even_plan(
    num_layers: int, pp: int, vpp: int, recompute: StageRecompute, placement: str = "loop"
) -> StagePlan:
    """Layers spread as evenly as the count allows, the extra ones on the middle chunks (the
    first and last chunks also hold the embedding and the loss; Megatron's
    ``--account-for-embedding/loss-in-pipeline-split`` idea)."""
    chunks = pp * vpp
    base, extra = divmod(num_layers, chunks)
    order = list(range(1, chunks - 1)) + [0, chunks - 1] if chunks > 2 else list(range(chunks))
    layers = [base] * chunks
    for c in order[:extra]:
        layers[c] += 1
    return StagePlan(
        pp=pp,
        vpp=vpp,
        chunk_layers=tuple(layers),
        recompute=(recompute,) * pp,
        placement=placement,
    )


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


PLAN_SOURCES: tuple[str, ...] = ("given", "search", "even split")


@dataclass(frozen=True, slots=True, kw_only=True)
class PerStage:
    """What a per-stage plan adds to an ``Estimate`` (``Estimate.per_stage``): the plan, its
    per-stage table, and the step by the schedule formula beside the estimate's simulated one."""

    plan: StagePlan
    stages: tuple[StageEstimate, ...]
    formula_step_time_s: float
    """The step by the schedule formula (``autopar.costs.stage_figures.pipeline_time_s``), what
    the per-stage search ranks by; the estimate's ``step_time_s`` is the simulated schedule."""
    plan_from: str = "given"
    """``given`` (an explicit plan), ``search`` (the per-stage search's, ranked by the formula)
    or ``even split`` (a uniform plan the simulation found faster)."""

    def schedule_text(self, step_time_s: float) -> str:
        """The simulated step against the formula's, for the report."""
        gap = self.formula_step_time_s / step_time_s - 1.0
        return (
            f"schedule simulated {step_time_s:.3f} s, formula {self.formula_step_time_s:.3f} s "
            f"({gap:+.2%})"
        )

    def to_dict(self, step_time_s: float) -> dict[str, Any]:
        """The JSON keys a per-stage estimate adds (``autopar/schemas/evaluate.schema.json``)."""
        return {
            "pipeline_plan": self.plan.to_dict(),
            "stages": [stage.to_dict() for stage in self.stages],
            "pipeline_schedule": {
                "simulated_step_time_s": step_time_s,
                "formula_step_time_s": self.formula_step_time_s,
                "plan_from": self.plan_from,
            },
        }
