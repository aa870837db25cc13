"""Published Blackwell runs as ``validate_published.Case``s (issue 20; data README section 19).

A row is a Blackwell row when its ``gpu`` column names a B200, B300, GB200 or GB300 system; it
is evaluated on the GPU preset of that system, with the layout as printed (TP, PP, CP, VP, EP,
MBS, GBS; ETP 1; SP with TP; the distributed optimizer, or ZeRO-3 where the row ran
Megatron-FSDP) and the precision it printed (BF16, FP8 = current scaling, MXFP8, NVFP4). What
the table does not print comes from the recipe that ran it: ``blackwell_recipes.csv`` beside
``runs.csv`` holds, per row, the CUDA-graph scope, the layers offloaded to the host, EP and TP
overlap, the GEMMs in low precision, the recompute (granularity and modules), whether the experts
ran Transformer Engine's fused grouped MLP (``cutedsl_fused_grouped_mlp``), the token dispatcher
where the recipe does not run the flex one, the cross entropy where it is not Transformer
Engine's (``native``: the GPT-OSS recipes before v0.6.0) and, where the container's config
contradicts the table, the EP it set, each with the Megatron-Bridge recipe (release tag and
workload config) it was read from. A row missing from that table (a run from another source)
gets ``DEFAULT_RECIPE``. Every row runs on the ``megatron-bridge-25.09`` stack (BF16 gradients,
TP overlap, fused cross entropy, no dropout); MoE rows add the BF16 Adam moments and the flex
(HybridEP / DeepEP) dispatcher of Megatron-Bridge's MoE recipes, as the H100 MoE rows do
(``validate_published.MBRIDGE_MOE_SWITCHES``), unless ``moe_dispatcher`` names another: a
workload config without ``moe_flex_dispatcher_backend`` keeps the model provider's
``moe_token_dispatcher_type="alltoall"`` (``gpt_oss_provider.py``, ``qwen_provider.py``; v0.2.0's
``apply_flex_dispatcher_backend`` also refuses HybridEP off GB200 / GB300).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from functools import cache
from pathlib import Path

import pandas as pd

from autopar.inputs.loading import load_gpu, load_model, load_stack
from autopar.inputs.specs import TrainingSpec
from autopar.layout.plan import Layout

RECIPES_CSV = Path(__file__).resolve().parent / "data" / "published" / "blackwell_recipes.csv"
SYSTEMS: tuple[tuple[str, str], ...] = (
    ("GB300", "gb300-nvl72"),
    ("GB200", "gb200-nvl72"),
    ("B300", "b300"),
    ("B200", "b200"),
)
"""The ``gpu`` column's system name -> the GPU preset (NVL72 names first: "GB200" holds "B200")."""
DENSE_MODELS: dict[str, str] = {
    "LLAMA3_8B": "llama-3-8b",
    "LLAMA3_70B": "llama-3-70b",
    "LLAMA3.1_405B": "llama-3.1-405b",
}
MOE_MODELS: dict[str, str] = {
    "Qwen3_30B_a3B": "qwen3-30b-a3b",
    "Qwen3_235B_a22B": "qwen3-235b-a22b",
    "GPT OSS 120B": "gpt-oss-120b",
    "DeepSeekV3": "deepseek-v3",
}
"""The table's model names -> presets (their Hugging Face ``config.json`` dimensions)."""
PRECISIONS: dict[str, tuple[str, str]] = {
    # the row's precision -> (autopar precision, FP8 recipe)
    "bf16": ("bf16", "current"),
    "fp8": ("fp8", "current"),
    "mxfp8": ("fp8", "mxfp8"),
    "nvfp4": ("nvfp4", "current"),
}
DEFAULT_RECIPE: dict[str, str] = {
    "cuda_graphs": "none",
    "cpu_offload_layers": "0",
    "ep_comm_overlap": "false",
    "tp_comm_overlap": "true",
    "fp8_gemms": "qkv,proj,fc1,fc2",
    "recompute": "none",
    "recompute_modules": "",
    "moe_fused_mlp": "false",
    "ep": "",
    "moe_dispatcher": "",
    "cross_entropy_impl": "",
}
"""What a row without a ``blackwell_recipes.csv`` entry is assumed to have run."""
MOE_SWITCHES = {"moe_dispatcher": "flex"}
"""The MoE rows' cost switches where ``moe_dispatcher`` is empty."""
_SIXTEEN = (4,) + (4,) * 14 + (1,)
DEEPSEEK_V3_LAYOUTS: dict[tuple[int, int], tuple[int, ...]] = {
    (4, 1): (16, 16, 16, 13),
    (8, 1): (8,) * 7 + (5,),
    (4, 2): (8,) * 7 + (5,),
    (16, 1): _SIXTEEN,
    (8, 2): _SIXTEEN,
    (4, 4): _SIXTEEN,
    (2, 8): _SIXTEEN,
}
"""DeepSeek-V3's 61 layers per pipeline chunk (virtual-stage order) under Megatron-Bridge's
``pipeline_model_parallel_layout`` for (pp, vpp): the embedding on the first chunk, the MTP
module and the loss on the last (recipes/deepseek/deepseek_v3.py L37-45 at v0.4.0, the same in
v0.2.0 and v0.5.0; (2, 8) is the GB300 workload configs' ``Et*4|(t*4|)*14tmL``). The rows are
evaluated through the per-stage plan with these chunks."""


def system_preset(row: pd.Series) -> str | None:
    """The GPU preset of a Blackwell row, or ``None`` for another GPU."""
    text = str(row.get("gpu", "")).upper()
    return next((preset for name, preset in SYSTEMS if name in text), None)


def is_blackwell_row(row: pd.Series) -> bool:
    return system_preset(row) is not None


@cache
def recipes() -> dict[str, dict[str, str]]:
    """``blackwell_recipes.csv`` by row id."""
    with RECIPES_CSV.open(newline="") as handle:
        return {r["id"]: r for r in csv.DictReader(handle)}


def _int(value: object, default: int) -> int:
    if value is None or value == "" or isinstance(value, float) and math.isnan(value):
        return default
    return int(float(value))


def row_precision(row: pd.Series) -> str | None:
    """The precision a row printed (``notes`` "precision=P", else a token of its id)."""
    match = re.search(r"precision=(\w+)", str(row.get("notes", "")))
    if match:
        return match.group(1).lower()
    for token in re.split(r"[_\W]", str(row["id"]).lower()):
        label = {"fp8cs": "fp8", "fp8mx": "mxfp8"}.get(token, token)
        if label in PRECISIONS:
            return label
    return None


def measured_step_s(row: pd.Series) -> float | None:
    """``gbs * seq_len / (tokens/s/GPU * GPUs)`` from the notes' tokens per second per GPU."""
    notes = str(row.get("notes", ""))
    match = re.search(r"tokens_per_s_per_gpu=([\d.]+)|Tokens/sec/GPU ([\d.]+)", notes)
    if not match:
        return None
    tokens = float(match.group(1) or match.group(2))
    sequences, seq_len = _int(row["gbs_sequences"], 0), _int(row["seq_len"], 0)
    return sequences * seq_len / (tokens * _int(row["num_gpus"], 1))


def row_model(row: pd.Series):
    """The model preset a row names, or ``None``."""
    name = re.sub(r"\s*\(.*\)\s*$", "", str(row["model"]))
    preset = DENSE_MODELS.get(name) or MOE_MODELS.get(name)
    return load_model(preset) if preset else None


def row_layout(row: pd.Series, *, recompute: str, zero: int) -> Layout:
    """The layout a Megatron-Bridge row prints: TP, PP, CP, EP, VP, MBS, GBS (DP and the
    micro-batches follow), ETP 1, SP with TP."""
    n, gbs = _int(row["num_gpus"], 1), _int(row["gbs_sequences"], 0)
    tp, pp, cp = _int(row["tp"], 1), _int(row["pp"], 1), _int(row["cp"], 1)
    mbs, dp = _int(row["mbs"], 1), n // (tp * pp * cp)
    return Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=_int(row["ep"], 1),
        vpp=_int(row["vpp"], 1),
        mbs=mbs,
        grad_accum=gbs // (dp * mbs),
        recompute=recompute,
        zero=zero,
        sequence_parallel=tp > 1,
    )


def moe_switches(recipe: dict[str, str]) -> dict[str, str]:
    """``MOE_SWITCHES`` with the dispatcher the row's recipe ran, where it names one."""
    return {**MOE_SWITCHES, **({"moe_dispatcher": d} if (d := recipe["moe_dispatcher"]) else {})}


def build_blackwell(row: pd.Series, case_type) -> object | str:
    """A ``case_type`` (``validate_published.Case``) for a Blackwell row, or why it cannot be
    modelled."""
    model, precision = row_model(row), row_precision(row)
    step_s = measured_step_s(row)
    if model is None:
        return f"no preset for the model {row['model']!r}"
    if precision not in PRECISIONS:
        return f"no precision in the row ({precision!r})"
    if step_s is None:
        return "no tokens/s/GPU"
    recipe = {**DEFAULT_RECIPE, **recipes().get(str(row["id"]), {})}
    n, s, gbs = _int(row["num_gpus"], 1), _int(row["seq_len"], 0), _int(row["gbs_sequences"], 0)
    tp, pp, cp = _int(row["tp"], 1), _int(row["pp"], 1), _int(row["cp"], 1)
    mbs, dp = _int(row["mbs"], 1), n // (tp * pp * cp)
    if dp * mbs == 0 or gbs % (dp * mbs):
        return f"gbs {gbs} is not a multiple of dp {dp} x mbs {mbs}"
    autopar_precision, fp8_recipe = PRECISIONS[precision]
    stack = dataclasses.replace(
        load_stack("megatron-bridge-25.09"),
        fp8_recipe=fp8_recipe,
        fp8_gemms=tuple(recipe["fp8_gemms"].split(",")),
        cuda_graphs=recipe["cuda_graphs"],
        cpu_offload_layers=int(recipe["cpu_offload_layers"]),
        ep_comm_overlap=recipe["ep_comm_overlap"] == "true",
        tp_comm_overlap=recipe["tp_comm_overlap"] == "true",
        moe_fused_mlp=recipe["moe_fused_mlp"] == "true",
        cross_entropy_impl=recipe["cross_entropy_impl"] or "te",
        optimizer_state_dtype="bf16" if model.is_moe else "fp32",
    )
    if recipe["recompute_modules"]:
        modules = tuple(recipe["recompute_modules"].split(","))
        stack = dataclasses.replace(stack, recompute_modules=modules)
    training = TrainingSpec(
        num_gpus=n,
        global_batch_sequences=gbs,
        seq_len=s,
        precision=autopar_precision,
        grad_precision=stack.grad_reduce_dtype,
        stack=stack,
    )
    fsdp = re.search(r"FSDP column=(\d+)", str(row.get("notes", "")))
    zero = 3 if fsdp and int(fsdp.group(1)) > 0 else 1
    layout = row_layout(row, recompute=recipe["recompute"], zero=zero)
    if recipe["ep"]:
        layout = dataclasses.replace(layout, ep=int(recipe["ep"]))
    per_stage = DEEPSEEK_V3_LAYOUTS.get((pp, layout.vpp)) if model.is_mla else None
    combined = layout.ep > 1 and (layout.pp == 1 or layout.vpp > 1)
    if stack.ep_comm_overlap and combined:
        # the recipe's moe_a2a_overlap runs Megatron's combined 1F1B (the schedule axis)
        layout = dataclasses.replace(layout, pipeline_schedule="combined-1f1b")
    return case_type(
        row_id=str(row["id"]),
        source="mbridge_blackwell",
        model=model,
        gpu=load_gpu(system_preset(row)),
        training=training,
        layout=layout,
        measured_step_s=step_s,
        cost_switches=moe_switches(recipe) if model.is_moe else {},
        stage_layers=per_stage,
    )


def mxfp8_pair(row: pd.Series) -> float | None:
    """The measured step-time ratio MXFP8 / FP8-CS of a row that prints both recipes for one
    layout ("Precision=FP8-CS (FP8-MX)", "Tokens / sec / GPU=A (B)" in its notes), else None."""
    notes = str(row.get("notes", ""))
    if "Precision=FP8-CS (FP8-MX)" not in notes:
        return None
    match = re.search(r"Tokens / sec / GPU=(\d+) \((\d+)\)", notes)
    return float(match.group(1)) / float(match.group(2)) if match else None


def mxfp8_pairs(cases: list, runs: pd.DataFrame, predict) -> list[tuple[str, float, float]]:
    """(row id, measured, predicted) MXFP8 / FP8-CS step-time ratios of the paired rows."""
    rows = runs.set_index("id")
    out = []
    for case in cases:
        measured = mxfp8_pair(rows.loc[case.row_id]) if case.row_id in rows.index else None
        if measured is None:
            continue
        stack = dataclasses.replace(case.training.stack, fp8_recipe="mxfp8")
        mx = dataclasses.replace(case, training=dataclasses.replace(case.training, stack=stack))
        out.append(
            (case.row_id, measured, predict(mx)["predicted_s"] / predict(case)["predicted_s"])
        )
    return out
