"""A per-stage pipeline plan as Megatron-LM flags (``Flag`` pairs that ``autopar.outputs.emit.
megatron`` writes in place of the uniform split and recompute); other launchers refuse it.

Megatron-LM (commit d98e8a6, ``NVIDIA/Megatron-LM``):

- layers: ``--pipeline-model-parallel-layout``, one ``|``-separated entry per virtual stage in
  virtual-stage order, ``E`` the embedding, ``t`` a decoder layer, ``m`` an MTP layer, ``L`` the
  loss, ``t*n`` for ``n`` layers (``megatron/core/transformer/pipeline_parallel_layer_layout.py``
  L283-330 ``parse_str_to_list``, L48-55: entry ``vpp_rank*pp + pp_rank``); it sets the virtual
  stage count itself and excludes ``--num-layers-per-virtual-pipeline-stage``,
  ``--num-virtual-stages-per-pipeline-rank`` (``megatron/training/arguments.py`` L927-952) and
  the first/last-stage layer counts, so the layout flag replaces the uniform split's flags.
- recompute: ``--recompute-granularity selective``, or ``--recompute-granularity full
  --recompute-method block --recompute-num-layers K``: ``K`` layers of every chunk of every stage
  (``megatron/core/transformer/transformer_config.py`` L543-555: one ``recompute_num_layers``).
  Stock Megatron takes one granularity and one ``K`` for the whole pipeline, so a plan whose
  stages differ is written with the largest ``K`` (more recompute never needs more memory) and a
  comment line saying what the plan wanted and what the stock flags cost.
"""

from __future__ import annotations

from autopar.layout.stages import StagePlan

Flag = tuple[str, str | None]


def pipeline_flags(plan: StagePlan, *, num_mtp_layers: int = 0) -> list[Flag]:
    """The pipeline size and the plan's ``--pipeline-model-parallel-layout``."""
    return [
        ("--pipeline-model-parallel-size", str(plan.pp)),
        ("--pipeline-model-parallel-layout", layout_string(plan, num_mtp_layers=num_mtp_layers)),
    ]


def layout_string(plan: StagePlan, *, num_mtp_layers: int = 0) -> str:
    """The ``--pipeline-model-parallel-layout`` value of ``plan``."""
    chunks = plan.pp * plan.vpp
    parts = []
    for c, n in enumerate(plan.chunk_layers):
        text = "E" if c == 0 else ""
        text += "" if n == 0 else "t" if n == 1 else f"t*{n}"
        if c == chunks - 1:
            text += (
                ("m" if num_mtp_layers == 1 else f"m*{num_mtp_layers}") if num_mtp_layers else ""
            )
            text += "L"
        parts.append(text)
    if len(parts) < 3:
        return "|".join(parts)
    # runs of equal middle entries as "(x|)*n" (parse_str_to_list unrolls them)
    out, middle, i = parts[0] + "|", parts[1:-1], 0
    while i < len(middle):
        j = i
        while j < len(middle) and middle[j] == middle[i]:
            j += 1
        out += f"({middle[i]}|)*{j - i}" if j - i > 1 else f"{middle[i]}|"
        i = j
    return out + parts[-1]


def recompute_flags(
    plan: StagePlan, *, modules: list[str] | None = None
) -> tuple[list[Flag], str | None]:
    """Megatron's recompute flags for ``plan`` and, when stock flags cannot say what the plan
    says, a note (a ``#`` line). ``modules``: what selective recompute re-runs
    (``autopar.outputs.emit.common.selective_modules``; ``None``: Megatron's default)."""
    modes = {r.mode for r in plan.recompute if r.mode != "full" or r.num_layers}
    counts = {r.num_layers for r in plan.recompute if r.mode == "full" and r.num_layers}
    wanted = ",".join(r.text() for r in plan.recompute)
    if "full" not in modes:
        if "selective" not in modes:
            return [], None
        # Some stages selective, others none: selective everywhere (safe on memory).
        note = None if modes == {"selective"} else _one_for_all_note(wanted, "selectively")
        if modules is not None and not modules:  # nothing of the stack's modules applies
            return [], None
        flags: list[Flag] = [("--recompute-granularity", "selective")]
        if modules:
            flags.append(("--recompute-modules", " ".join(modules)))
        return flags, note
    # One K for every stage: the largest planned count, and every layer of a selective stage
    # (block recompute of fewer layers would keep more than selective keeps).
    selective = [
        plan.chunk_layers[c]
        for i, r in enumerate(plan.recompute)
        if r.mode == "selective"
        for c in plan.chunks_of(i)
    ]
    k = max([*counts, *selective])
    flags = [
        ("--recompute-granularity", "full"),
        ("--recompute-method", "block"),
        ("--recompute-num-layers", str(k)),
    ]
    exact = modes == {"full"} and all(
        r.mode == "full" and (r.num_layers == k or _covers(plan, i, r.num_layers, k))
        for i, r in enumerate(plan.recompute)
    )
    return flags, None if exact else _one_for_all_note(wanted, f"{k} layers per chunk in full")


def _one_for_all_note(wanted: str, done: str) -> str:
    return (
        f"# autopar: the plan recomputes per stage ({wanted}); Megatron-LM takes one "
        f"--recompute-granularity and one --recompute-num-layers for every stage "
        f"(transformer_config.py), so every stage recomputes {done} here: safe on memory, "
        "slower than planned"
    )


def _covers(plan: StagePlan, stage: int, planned: int, k: int) -> bool:
    """``K`` recomputes the same layers as ``planned`` on ``stage`` (every chunk is already
    fully recomputed)."""
    return all(plan.chunk_layers[c] <= planned for c in plan.chunks_of(stage)) and planned <= k
