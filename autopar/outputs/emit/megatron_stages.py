"""A per-stage pipeline plan as Megatron-LM flags; other launchers refuse it.

Megatron-LM (commit d98e8a6, ``NVIDIA/Megatron-LM``):

- layers: ``--pipeline-model-parallel-layout``, one ``|``-separated entry per virtual stage in
  virtual-stage order, ``E`` the embedding, ``t`` a decoder layer, ``m`` an MTP layer, ``L`` the
  loss, ``t*n`` for ``n`` layers (``megatron/core/transformer/pipeline_parallel_layer_layout.py``
  L283-330 ``parse_str_to_list``, L48-55: entry ``vpp_rank*pp + pp_rank``); it sets the virtual
  stage count itself and excludes ``--num-layers-per-virtual-pipeline-stage``,
  ``--num-virtual-stages-per-pipeline-rank`` (``megatron/training/arguments.py`` L927-952) and
  the first/last-stage layer counts.
- recompute: ``--recompute-granularity selective``, or ``--recompute-granularity full
  --recompute-method block --recompute-num-layers K``: ``K`` layers of every chunk of every stage
  (``megatron/core/transformer/transformer_config.py`` L543-555: one ``recompute_num_layers``).
  Stock Megatron takes one granularity and one ``K`` for the whole pipeline, so a plan whose
  stages differ is written with the largest ``K`` (more recompute never needs more memory) and a
  comment line saying what the plan wanted and what the stock flags cost.
"""

from __future__ import annotations

from autopar.base.errors import InputError
from autopar.layout.stages import StagePlan

REPLACED_FLAGS = (
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank",
    "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split",
    "--pipeline-model-parallel-layout",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--recompute-modules",
)


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


def recompute_flags(plan: StagePlan) -> tuple[list[str], str | None]:
    """Megatron's recompute flags for ``plan`` and, when stock flags cannot say what the plan
    says, a note."""
    modes = {r.mode for r in plan.recompute if r.mode != "full" or r.num_layers}
    counts = {r.num_layers for r in plan.recompute if r.mode == "full" and r.num_layers}
    if not modes or modes == {"none"}:
        return [], None
    if modes == {"selective"}:
        return ["--recompute-granularity selective"], None
    if "full" in modes:
        # One K for every stage: the largest planned count, and every layer of a selective
        # stage (block recompute of fewer layers would keep more than selective keeps).
        selective = [
            plan.chunk_layers[c]
            for i, r in enumerate(plan.recompute)
            if r.mode == "selective"
            for c in plan.chunks_of(i)
        ]
        k = max([*counts, *selective])
        flags = [
            f"--recompute-granularity full --recompute-method block --recompute-num-layers {k}"
        ]
        wanted = ",".join(r.text() for r in plan.recompute)
        exact = modes == {"full"} and all(
            r.mode == "full" and (r.num_layers == k or _covers(plan, i, r.num_layers, k))
            for i, r in enumerate(plan.recompute)
        )
        note = None
        if not exact:
            note = (
                f"# autopar: the plan recomputes per stage ({wanted}); Megatron-LM takes one "
                f"--recompute-granularity and one --recompute-num-layers for every stage "
                f"(transformer_config.py), so every stage recomputes {k} layers per chunk in "
                "full here: safe on memory, slower than planned"
            )
        return flags, note
    return [], None  # unreachable: modes is non-empty


def _covers(plan: StagePlan, stage: int, planned: int, k: int) -> bool:
    """``K`` recomputes the same layers as ``planned`` on ``stage`` (every chunk is already
    fully recomputed)."""
    return all(plan.chunk_layers[c] <= planned for c in plan.chunks_of(stage)) and planned <= k


def megatron_plan_args(args: str, plan: StagePlan, *, num_mtp_layers: int = 0) -> str:
    """Megatron-LM arguments ``args`` (one line of ``--flag value`` pairs) with the pipeline
    split and recompute flags replaced by those of ``plan``."""
    kept = []
    for part in ("\n" + args).split(" --")[0:]:
        part = part.strip()
        if not part:
            continue
        flag = part if part.startswith("--") else f"--{part}"
        if flag.split()[0] not in REPLACED_FLAGS:
            kept.append(flag)
    flags, note = recompute_flags(plan)
    layout = layout_string(plan, num_mtp_layers=num_mtp_layers)
    kept += [f'--pipeline-model-parallel-layout "{layout}"', *flags]
    line = " ".join(kept)
    return f"{note}\n{line}" if note else line


def refuse(fmt: str) -> InputError:
    return InputError(
        "cannot express a per-stage pipeline plan (layers per chunk, recompute per stage); "
        "use --format megatron, json or table, or --pipeline-plan uniform",
        source=f"--format {fmt}",
        field="pipeline plan",
    )
