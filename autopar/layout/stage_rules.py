"""What each framework's launcher can express of a per-stage plan (``autopar.layout.stages``),
one table of rules, each with its source: the per-stage search only considers plans that hold
them (``autopar.pipeline.expressible``), and the framework's output refuses any other plan
given to it (``autopar.outputs.emit.torchtitan``), naming the rule.

Megatron's ``--pipeline-model-parallel-layout`` and its recompute flags take every plan, so
only torchtitan has rules. torchtitan 0.3 splits the model by
``pipeline_parallel_layers_per_stage`` ``n`` with ``first/last_stage_less_layers`` ``a, b``:
``num_virtual_stages = ceil((L + a + b) / n)`` (``distributed/pipeline_parallel.py`` L223), then
every stage gets ``(L + a + b) // stages`` effective layers (L407), the first ``a`` and the last
``b`` fewer, each weight at most that count (L421-427); so the middle stages hold ``n`` layers
each and the first and last ``0..n``. It applies one activation checkpoint mode to every
transformer block (``distributed/activation_checkpoint.py`` L156, ``apply_ac``'s loop).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from autopar.layout.stages import StagePlan, StageRecompute


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRule:
    """One rule a framework's output sets on per-stage plans."""

    framework: str
    text: str
    """The rule as a user reads it."""
    check: Callable[[StagePlan], bool]
    """True where the plan holds it."""
    source: str


def equal_middle_sizes(sizes: Sequence[int]) -> bool:
    """Every chunk of ``sizes`` but the first and the last holds the most layers (torchtitan's
    split; its emitter checks the uniform plan's split with it too)."""
    return len(sizes) <= 2 or set(sizes[1:-1]) == {max(sizes)}


def equal_middle_chunks(plan: StagePlan) -> bool:
    """``equal_middle_sizes`` of the plan's chunks."""
    return equal_middle_sizes(plan.chunk_layers)


def one_recompute_mode(plan: StagePlan) -> bool:
    """One recompute mode on every stage, ``full`` covering every layer of every chunk."""
    modes = {r.mode for r in plan.recompute}
    partial = "full" in modes and any(
        plan.recomputed_layers(c) < n for c, n in enumerate(plan.chunk_layers)
    )
    return len(modes) == 1 and not partial


PLAN_RULES: tuple[PlanRule, ...] = (
    PlanRule(
        framework="torchtitan",
        text="every virtual stage but the first and the last holds the same number of layers, "
        "the first and the last at most that (pipeline_parallel_layers_per_stage with "
        "first/last_stage_less_layers)",
        check=equal_middle_chunks,
        source="torchtitan 0.3 distributed/pipeline_parallel.py L223 (num_virtual_stages), L407 "
        "(layers per stage), L421-427 (first/last weights at most that)",
    ),
    PlanRule(
        framework="torchtitan",
        text="one activation checkpoint mode on every layer of every stage (full covers every "
        "layer)",
        check=one_recompute_mode,
        source="torchtitan 0.3 distributed/activation_checkpoint.py L156 (apply_ac wraps every "
        "transformer block alike)",
    ),
)


def plan_rules(framework: str) -> tuple[PlanRule, ...]:
    return tuple(r for r in PLAN_RULES if r.framework == framework)


def broken_plan_rule(plan: StagePlan, framework: str) -> PlanRule | None:
    """The first rule of ``framework`` that ``plan`` breaks (``None``: it can be written)."""
    return next((r for r in plan_rules(framework) if not r.check(plan)), None)


def restricts_plans(framework: str) -> bool:
    return bool(plan_rules(framework))


def _chunk_splits(num_layers: int, chunks: int) -> Iterator[tuple[int, ...]]:
    """Every split of ``num_layers`` over ``chunks`` chunks whose middle chunks hold ``n`` layers
    each and the first and last ``0..n`` (``equal_middle_chunks``)."""
    if chunks == 1:
        yield (num_layers,)
        return
    if chunks == 2:
        yield from ((f, num_layers - f) for f in range(num_layers + 1))
        return
    middles = chunks - 2
    for n in range(1, num_layers // middles + 1):
        ends = num_layers - middles * n
        for first in range(max(0, ends - n), min(n, ends) + 1):
            yield (first, *([n] * middles), ends - first)


def expressible_plans(
    framework: str,
    num_layers: int,
    pp: int,
    vpp: int,
    modes: Sequence[str],
    placement: str = "loop",
) -> list[StagePlan]:
    """Every plan of ``pp`` stages of ``vpp`` chunks that ``framework``'s rules allow, with one
    recompute of ``modes`` on every stage (``full`` covering each chunk); the table's checks
    hold on each (``tests/test_stage_torchtitan.py``). The rules read the chunks in model
    order, which is torchtitan's split whatever the placement (``generate_llm_fqn_per_model_part``
    splits the layers over the virtual stages before ``pipeline_module_split`` places them in a
    loop or a V), so a V's plans are the same splits, V-placed."""
    out = []
    for sizes in _chunk_splits(num_layers, pp * vpp):
        options = [StageRecompute(m) for m in ("none", "selective") if m in modes]
        if "full" in modes and max(sizes):
            options.append(StageRecompute("full", max(sizes)))
        for rec in options:
            plan = StagePlan(
                pp=pp, vpp=vpp, chunk_layers=sizes, recompute=(rec,) * pp, placement=placement
            )
            if broken_plan_rule(plan, framework) is None:
                out.append(plan)
    return out
