"""Predict the step time of every published run in ``benchmarks/data/published/runs.csv``.

    python benchmarks/validate_published.py [--csv PATH] [--format table|markdown]

For each row with a measurement the measured step time is derived from the source's *own*
throughput definition (they differ, see ``published/README.md``):

- Narayanan et al. 2021 (``nar21_*``) and the 2021 Megatron README GPT-3 example: TFLOP/s per GPU
  counted with Eq. 3, ``96*B*s*l*h^2*(1 + s/6h + V/16lh)``, which includes the recompute forward:
  ``step = Eq3 / (tflops * num_gpus)``;
- Korthikanti et al. 2022 (``kor22_*``): iteration times in seconds (Table 5, §6.3); the one row
  with only an MFU uses Eq. 7 model FLOPs: ``step = Eq7 / (mfu * peak * num_gpus)``;
- Megatron-LM README 2024 (``mlm_readme2024_*``): model TFLOP/s from Megatron's
  ``num_floating_point_operations`` (= Eq. 7 for these GPT models), or the MFU for the
  strong-scaling rows;
- NeMo 24.07 (``nemo2407_*``) and Megatron-Bridge (``mbridge_*``, NeMo 25.09-26.06 containers,
  dense rows): tokens/s/GPU: ``step = gbs * seq_len / (tokens_per_s_gpu * n)``.

Each row is evaluated with the training stack it ran on (``STACKS``, presets in
``autopar/presets/stacks/``): the 2021-2022 Megatron-LM runs with ``megatron-2021``, the 2024
README runs with ``megatron-core-0.8``, NeMo 24.07 with ``nemo-24.07``, Megatron-Bridge with
``megatron-bridge-25.09``.

What a row leaves out is filled by per-source assumptions (``ASSUMPTIONS`` below, printed with the
output); rows that cannot be modelled are listed with the reason. The predictions come from
``cost_models.default_cost_model`` with ``autopar.costs.comm.DatasheetCollectives``; nothing is
fitted per row. Errors are reported per precision (BF16: the A100 and 2024 H100 rows; FP8: NeMo
and Megatron-Bridge).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from autopar.base.files import write_atomic
from autopar.costs.comm import DatasheetCollectives
from autopar.costs.estimate import estimate
from autopar.costs.stage_estimate import estimate_plan
from autopar.costs.terms import TermContext
from autopar.inputs.loading import load_gpu, load_model, load_stack
from autopar.inputs.specs import GIB, ClusterSpec, GpuSpec, ModelSpec, SearchOptions, TrainingSpec
from autopar.inputs.stack import StackSpec
from autopar.layout.plan import Layout
from autopar.layout.stages import parse_plan
from cost_models import default_cost_model
from cost_models.flops import model_flop_per_sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling module, also when imported
from published_blackwell import build_blackwell, is_blackwell_row, row_layout  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CSV = Path(__file__).resolve().parent / "data" / "published" / "runs.csv"

ASSUMPTIONS = """\
Assumptions per source (what the rows do not state):
- nar21 / mlm_readme2021 (A100, 2021 Megatron): GPT with GELU, ffn 4h, LayerNorm, biases,
  learned positions, tied embeddings, V 51200; full recompute (Eq. 3 assumes it; the GPT-3
  script sets --checkpoint-activations); no SP, no distributed optimizer, no flash attention, no
  TP/DP overlap. Table 1: mbs, interleaving and DDP as the authors' script sets them
  (Megatron-LM examples/academic_paper_scripts/sc21/run_table_1.sh: mbs 16/16/16/8/4/2/2/1/1/1,
  2-5 layers per virtual stage from 76B to 530B, PyTorch DDP with overlapped reduction up to
  18B). Table 2: mbs 1; v not stated: v = 3 where (layers/pp) is divisible by 3 (Korthikanti
  used v = 3 on the same codebase), else 2 where divisible, else 1. Table 2 PTD-P 175B rows
  (model-parallel 96, split not stated): TP 8 x PP 12 (TP is one node throughout the paper).
  The 2021 GPT-3 script: v = 1.
- kor22 (A100, 2022): as above but recompute / SP as in the row; v = 3 for 175B and 530B (paper),
  1 otherwise; the 2240-GPU full-recompute row reuses gbs 2240 and v = 3 of its selective twin.
- mlm_readme2024 (H100, Megatron-Core r0.8): BF16 (MFU is quoted against 989 TFLOP/s), GPT with
  GELU, ffn 4h, MHA, LayerNorm, biases, RoPE, tied embeddings; mbs 1; no recompute; SP on;
  distributed optimizer; flash attention; TP, DP and PP overlap on (the README lists them);
  interleaved, since Megatron overlaps pipeline communication only with virtual stages: v not
  stated, the one autopar predicts fastest. Strong-scaling rows: TP 8 x PP 6 as the 177B
  weak-scaling row.
- nemo2407 (H100, FP8): mbs / vp / cp as printed; no recompute; SP on; distributed optimizer
  with BF16 gradients (``grad_sync_dtype=bf16`` in NeMo's H100 perf configs);
  flash attention (BF16 attention core); TP and DP overlap on; model dims from NeMo's configs
  where the table has none (MODEL_DIMS).
- mbridge (H100, NeMo 25.09-26.06, dense Llama rows): FP8 with current scaling (the 25.11
  table says FP8-CS; 25.09 does not say, 26.x says FP8); mbs / vp / cp as printed; no
  recompute; SP on; distributed optimizer (DDP rows) or FSDP = ZeRO-3 ("FSDP column=8");
  Llama 3.1 405B's 126 layers at PP 8 x VP 8 with the embedding and the loss counted as
  pipeline layers (Megatron-Bridge's Llama 3.1 405B recipe sets
  account_for_embedding/loss_in_pipeline_split).
"""

MODEL_DIMS: dict[str, dict[str, object]] = {
    # NeMo nemo/collections/llm/gpt/model/{gpt,llama,nemotron}.py configs (NeMo 2.0).
    "GPT3-5B": dict(
        layers=24, hidden=4096, heads=32, kv_heads=32, ffn=16384, vocab=50304, mlp="gelu", gpt=True
    ),
    "GPT3-20B": dict(
        layers=44, hidden=6144, heads=48, kv_heads=48, ffn=24576, vocab=50304, mlp="gelu", gpt=True
    ),
    "GPT3-175B": dict(vocab=50304, mlp="gelu", gpt=True),
    "LLAMA2-7B": dict(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000),
    "LLAMA2-13B": dict(layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824, vocab=32000),
    "LLAMA2-70B": dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000),
    "Nemotron-8B": dict(
        layers=32, hidden=4096, heads=32, kv_heads=32, ffn=16384, vocab=256000, mlp="squared_relu"
    ),
    "Nemotron-22B": dict(
        layers=40, hidden=6144, heads=48, kv_heads=48, ffn=24576, vocab=256000, mlp="squared_relu"
    ),
    "Nemotron-340B": dict(mlp="squared_relu"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One modelled row: the specs, the layout, the stack switches and the measured step time."""

    row_id: str
    source: str
    model: ModelSpec
    gpu: GpuSpec
    training: TrainingSpec
    layout: Layout
    measured_step_s: float
    cost_switches: dict = field(default_factory=dict)
    """``default_cost_model`` switches the stack does not hold (MoE dispatcher, capacity)."""
    stage_layers: tuple[int, ...] | None = None
    """Layers per pipeline chunk (virtual-stage order) when the run used a pipeline layout
    that is not the uniform split (Megatron-Bridge's DeepSeek-V3 recipes): evaluated through
    the per-stage plan (``autopar.costs.stage_estimate.estimate_plan``)."""

    @property
    def precision(self) -> str:
        return self.training.precision


def _int(value: object, default: int | None = None) -> int | None:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return default
    return int(float(value))


def source_of(row_id: str) -> str:
    for prefix in (
        "nar21_t1",
        "nar21_t2",
        "nar21_gpt3",
        "mlm_readme2021",
        "kor22",
        "mlm_readme2024",
        "nemo2407",
        "mbridge",
    ):
        if row_id.startswith(prefix):
            return prefix
    return "unknown"


def gpt_model(
    name: str,
    *,
    layers: int,
    hidden: int,
    heads: int,
    vocab: int,
    seq_len: int,
    learned_positions: bool,
    kv_heads: int | None = None,
    ffn: int | None = None,
    mlp: str = "gelu",
    gpt: bool = True,
) -> ModelSpec:
    """A GPT-family (``gpt=True``: LayerNorm, biases, tied embeddings) or Llama-family model."""
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads or heads,
        ffn_hidden_size=ffn or 4 * hidden,
        vocab_size=vocab,
        mlp_kind=mlp,
        tied_embeddings=gpt,
        layernorm=gpt or mlp == "squared_relu",
        linear_bias=gpt,
        learned_position_embeddings=gpt and learned_positions,
        max_position_embeddings=seq_len,
    )


def eq3_flop(*, batch: int, seq_len: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021 Eq. 3 (includes the recompute forward)."""
    s, h, v, n = seq_len, hidden, vocab, layers
    return 96.0 * batch * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))


SC21_TABLE1: dict[int, tuple[int, int | None, str]] = {
    24: (16, None, "torch"),  # 1.7B
    30: (16, None, "torch"),  # 3.6B
    36: (16, None, "torch"),  # 7.5B
    40: (8, None, "torch"),  # 18B
    48: (4, None, "local"),  # 39B
    60: (2, 5, "local"),  # 76B
    80: (2, 5, "local"),  # 145B
    96: (1, 3, "local"),  # 310B
    105: (1, 1, "local"),  # 530B
    128: (1, None, "local"),  # 1T
}
"""Narayanan Table 1 as the authors ran it, keyed by layer count: (micro-batch size, layers per
virtual pipeline stage or None for no interleaving, ``--DDP-impl``). From their script
``examples/academic_paper_scripts/sc21/run_table_1.sh`` in NVIDIA/Megatron-LM (MBS,
``--num-layers-per-virtual-pipeline-stage``, DDP per model size; every size also sets
``--activations-checkpoint-method uniform``, i.e. full recompute, and CONFIG.sh ``--fp16
--seq-length 2048``)."""


def narayanan_vpp(layers: int, pp: int) -> int:
    per_stage = layers // pp
    if pp == 1:
        return 1
    return 3 if per_stage % 3 == 0 else 2 if per_stage % 2 == 0 else 1


STACKS: dict[str, str] = {
    "nar21_t1": "megatron-2021",
    "nar21_t2": "megatron-2021",
    "nar21_gpt3": "megatron-2021",
    "mlm_readme2021": "megatron-2021",
    "kor22": "megatron-2021",
    "mlm_readme2024": "megatron-core-0.8",
    "nemo2407": "nemo-24.07",
    "mbridge": "megatron-bridge-25.09",
}
"""The training stack each source ran on (``autopar/presets/stacks/``)."""


def stack_of(source: str) -> StackSpec:
    return load_stack(STACKS[source])


def training_spec(source: str, **fields) -> TrainingSpec:
    """A ``TrainingSpec`` on the source's stack, its gradient dtype from the stack."""
    stack = stack_of(source)
    return TrainingSpec(stack=stack, grad_precision=stack.grad_reduce_dtype, **fields)


def build_2021(row: pd.Series, source: str) -> Case | str:
    """Narayanan Tables 1-2 and the 2021 GPT-3 script (module docstring, ASSUMPTIONS)."""
    if source == "nar21_gpt3":
        return "TP/PP not stated for this text estimate"
    if "ZeRO-3" in str(row["dist_optimizer"]):
        return "ZeRO-3 (DeepSpeed) baseline without TP/PP: different software stack"
    tp, pp = _int(row["tp"]), _int(row["pp"])
    if tp is None and "model-parallel size (TP*PP) 96" in str(row["notes"]):
        tp, pp = 8, 12
    layers, hidden, heads = _int(row["layers"]), _int(row["hidden"]), _int(row["heads"])
    vocab, s, n = _int(row["vocab"], 51200), _int(row["seq_len"]), _int(row["num_gpus"])
    gbs = _int(row["gbs_sequences"])
    mbs = _int(row["mbs"], 1 if pp > 1 else 4)
    dp = n // (tp * pp)
    vpp = 1 if source == "mlm_readme2021" else narayanan_vpp(layers, pp)
    stack = stack_of(source)
    if source == "nar21_t1":
        mbs, layers_per_chunk, ddp = SC21_TABLE1[layers]
        vpp = layers // pp // layers_per_chunk if layers_per_chunk else 1
        # PyTorch DDP reduces gradient buckets during the backward; Megatron's "local" DDP after.
        stack = dataclasses.replace(stack, overlap_grad_reduce=ddp == "torch")
    model = gpt_model(
        row["model"],
        layers=layers,
        hidden=hidden,
        heads=heads,
        vocab=vocab,
        seq_len=s,
        learned_positions=True,
    )
    measured = eq3_flop(batch=gbs, seq_len=s, layers=layers, hidden=hidden, vocab=vocab) / (
        float(row["tflops_per_gpu"]) * 1e12 * n
    )
    layout = Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        vpp=vpp,
        mbs=mbs,
        grad_accum=gbs // (dp * mbs),
        recompute="full",
        zero=0,
        sequence_parallel=False,
    )
    return Case(
        row_id=row["id"],
        source=source,
        model=model,
        gpu=load_gpu("a100-80gb"),
        training=TrainingSpec(
            stack=stack,
            grad_precision=stack.grad_reduce_dtype,
            num_gpus=n,
            global_batch_sequences=gbs,
            seq_len=s,
        ),
        layout=layout,
        measured_step_s=measured,
    )


def build_kor22(row: pd.Series, source: str) -> Case | str:
    """Korthikanti et al. 2022 (iteration times; one MFU-only row)."""
    layers, hidden, heads = _int(row["layers"]), _int(row["hidden"]), _int(row["heads"])
    vocab, s, n = _int(row["vocab"]), _int(row["seq_len"]), _int(row["num_gpus"])
    tp, pp, dp = _int(row["tp"]), _int(row["pp"]), _int(row["dp"])
    gbs = _int(row["gbs_sequences"], n)
    mbs = _int(row["mbs"], 1)
    vpp = 3 if layers in (96, 105) else 1
    selective = str(row["recompute"]).startswith("selective")
    model = gpt_model(
        row["model"],
        layers=layers,
        hidden=hidden,
        heads=heads,
        vocab=vocab,
        seq_len=s,
        learned_positions=True,
    )
    training = training_spec(source, num_gpus=n, global_batch_sequences=gbs, seq_len=s)
    match = re.search(r"iteration ([\d.]+) s|to ([\d.]+) seconds", str(row["notes"]))
    if match:
        measured = float(match.group(1) or match.group(2))
    else:
        flop = model_flop_per_sequence(model, s) * gbs
        measured = flop / (float(row["mfu_pct"]) / 100 * 312e12 * n)
    layout = Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        vpp=vpp,
        mbs=mbs,
        grad_accum=gbs // (dp * mbs),
        recompute="selective" if selective else "full",
        zero=0,
        sequence_parallel=selective,
    )
    return Case(
        row_id=row["id"],
        source=source,
        model=model,
        gpu=load_gpu("a100-80gb"),
        training=training,
        layout=layout,
        measured_step_s=measured,
    )


def build_mlm2024(row: pd.Series, source: str) -> Case | str:
    """Megatron-LM README H100 weak- and strong-scaling rows."""
    strong = "strong" in row["id"]
    layers, hidden, heads = (
        (96, 12288, 96)
        if strong
        else (_int(row["layers"]), _int(row["hidden"]), _int(row["heads"]))
    )
    tp, pp = (8, 6) if strong else (_int(row["tp"]), _int(row["pp"]))
    vocab, s, n = _int(row["vocab"]), _int(row["seq_len"]), _int(row["num_gpus"])
    gbs, dp = _int(row["gbs_sequences"]), n // (tp * pp)
    model = gpt_model(
        row["model"],
        layers=layers,
        hidden=hidden,
        heads=heads,
        vocab=vocab,
        seq_len=s,
        learned_positions=False,
    )
    flop = model_flop_per_sequence(model, s) * gbs
    if strong:
        measured = flop / (float(row["mfu_pct"]) / 100 * 989e12 * n)
    else:
        measured = flop / (float(row["tflops_per_gpu"]) * 1e12 * n)
    layout = Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        vpp=1,
        mbs=1,
        grad_accum=gbs // dp,
        recompute="none",
        zero=1,
        sequence_parallel=tp > 1,
    )
    case = Case(
        row_id=row["id"],
        source=source,
        model=model,
        gpu=load_gpu("h100-sxm"),
        training=training_spec(source, num_gpus=n, global_batch_sequences=gbs, seq_len=s),
        layout=layout,
        measured_step_s=measured,
    )
    return fastest_interleaving(case) if pp > 1 else case


def fastest_interleaving(case: Case) -> Case:
    """``case`` with the virtual-stage count autopar predicts fastest among those Megatron-Core
    r0.8 accepts (layers per stage divisible by layers per virtual stage). The 2024 README runs
    overlapped pipeline communication, which Megatron allows only with the interleaved schedule
    (``megatron/training/arguments.py`` L1000-1016 turns ``overlap_p2p_comm`` off without virtual
    stages; ``schedules.py`` L2180 raises), so they interleaved; v is not stated. NeMo 24.07's
    H100 configs of the same months use one or two layers per virtual stage."""
    per_stage = case.model.num_layers // case.layout.pp
    options = [
        dataclasses.replace(case, layout=dataclasses.replace(case.layout, vpp=v))
        for v in range(1, per_stage + 1)
        if per_stage % v == 0
    ]
    return min(options, key=lambda option: predict(option)["predicted_s"])


def nemo_model(row: pd.Series) -> ModelSpec:
    dims = MODEL_DIMS.get(row["model"], {})
    gpt = bool(dims.get("gpt", False))
    return gpt_model(
        row["model"],
        layers=dims.get("layers") or _int(row["layers"]),
        hidden=dims.get("hidden") or _int(row["hidden"]),
        heads=dims.get("heads") or _int(row["heads"]),
        kv_heads=dims.get("kv_heads") or _int(row["kv_heads"]),
        ffn=dims.get("ffn") or _int(row["ffn"]),
        vocab=dims.get("vocab") or _int(row["vocab"]),
        seq_len=_int(row["seq_len"]),
        learned_positions=gpt,
        mlp=dims.get("mlp", "swiglu"),
        gpt=gpt,
    )


def build_nemo(row: pd.Series, source: str) -> Case | str:
    """NeMo 24.07 performance summary (FP8, tokens/s/GPU). NeMo's H100 perf configs sync
    gradients in BF16 (NeMo-Framework-Launcher examples/training/*/h100/*.sh:
    ``+training.model.optim.grad_sync_dtype=bf16``): the stack holds it."""
    return build_tokens_row(row, source, zero=1)


def build_mbridge(row: pd.Series, source: str) -> Case | str:
    """Megatron-Bridge performance summary archive, dense H100 pre-training rows (§18)."""
    if _int(row["ep"], 1) > 1 or not _int(row["layers"]):
        return "MoE row (issue 12's model families)"
    fsdp = "FSDP column=" in str(row["dist_optimizer"])
    return build_tokens_row(row, source, zero=3 if fsdp else 1)


def printed_layout(n: int, gbs: int, *, tp: int, pp: int, cp: int, vpp: int, mbs: int, zero: int):
    """The layout a table prints (TP / PP / CP / VP / MBS on ``n`` GPUs, global batch ``gbs``
    sequences): DP and the micro-batches follow, no recompute, SP with TP."""
    dp = n // (tp * pp * cp)
    return Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        vpp=vpp,
        mbs=mbs,
        grad_accum=gbs // (dp * mbs),
        recompute="none",
        zero=zero,
        sequence_parallel=tp > 1,
    )


def build_tokens_row(row: pd.Series, source: str, *, zero: int) -> Case | str:
    """A dense FP8 H100 row that prints tokens/s/GPU, with its printed TP / PP / CP / VP / MBS,
    no recompute and SP with TP: ``step = gbs * seq_len / (tokens_per_s_gpu * n)``."""
    match = re.search(r"Tokens/sec/GPU (\d+)", str(row["notes"]))
    if not match:
        return "no tokens/s/GPU"
    s, n, gbs = _int(row["seq_len"]), _int(row["num_gpus"]), _int(row["gbs_sequences"])
    tp, pp, cp, mbs = _int(row["tp"]), _int(row["pp"]), _int(row["cp"], 1), _int(row["mbs"])
    layout = printed_layout(
        n, gbs, tp=tp, pp=pp, cp=cp, vpp=_int(row["vpp"], 1), mbs=mbs, zero=zero
    )
    training = training_spec(
        source, num_gpus=n, global_batch_sequences=gbs, seq_len=s, precision="fp8"
    )
    return Case(
        row_id=row["id"],
        source=source,
        model=nemo_model(row),
        gpu=load_gpu("h100-sxm"),
        training=training,
        layout=layout,
        measured_step_s=gbs * s / (float(match.group(1)) * n),
    )


# ---------------------------------------------------------------------------------------------
# Megatron-Bridge MoE rows (issue 12; published/README.md §18)

MBRIDGE_MOE_MODELS: dict[str, str] = {
    # the table's model name (without "(tokendrop)" / "(dropless)") -> autopar preset, whose
    # dimensions are the models' Hugging Face config.json (the table prints none)
    "Qwen3_30B_a3B": "qwen3-30b-a3b",
    "Qwen3_235B_a22B": "qwen3-235b-a22b",
    "GPT OSS 120B": "gpt-oss-120b",
    "DeepSeekV3": "deepseek-v3",
    "Nemotron_3_Nano": "nemotron-3-nano",
}
MBRIDGE_MOE_SWITCHES = dict(moe_dispatcher="flex")
"""Megatron-Bridge ``scripts/performance/configs/{qwen,deepseek,gpt_oss,nemotronh}`` H100
presets: ``moe_token_dispatcher_type="flex"`` (``moe_flex_dispatcher_backend="hybridep"``) and
force-balanced routing (``moe_router_force_load_balancing``: load imbalance 1). The rows are
evaluated on the default ``megatron-lm`` stack (the MoE constants were calibrated on it) with BF16
gradients and BF16 Adam moments (Megatron-Bridge 25.09 changelog, MoE LLM: "Precision-aware
optimizer update to support BF16 states"; ``StackSpec.optimizer_state_dtype``). On the
``megatron-bridge-25.09`` stack they give median 6.2%, max 25.5% without recalibration."""
TOKENDROP_CAPACITY_FACTOR = 1.0
"""Megatron-Bridge's "tokendrop" variants: ``moe_expert_capacity_factor=1.0`` with padding."""


def moe_model_name(model: str) -> str:
    return re.sub(r"\s*\((tokendrop|dropless)\)\s*$", "", str(model))


def is_mbridge_moe_row(row: pd.Series) -> bool:
    """A Megatron-Bridge H100 MoE row (§18; the Blackwell rows are ``published_blackwell``'s)."""
    return (
        str(row["id"]).startswith("mbridge_")
        and moe_model_name(row["model"]) in MBRIDGE_MOE_MODELS
        and not is_blackwell_row(row)
    )


RELEASE_REGRESSION = 1.4
"""A row this many times slower than the same model and layout in another container release
is that release's regression (the README: "the spread between releases is part of what any
model of these runs has to live with"), not a layout effect: skipped, with the reason."""
LAYOUT_COLUMNS = ("num_gpus", "seq_len", "gbs_sequences", "tp", "pp", "cp", "ep", "vpp", "mbs")


def _tokens_per_s(row: pd.Series) -> float | None:
    match = re.search(r"Tokens/sec/GPU (\d+)", str(row["notes"]))
    return float(match.group(1)) if match else None


def release_regression(row: pd.Series, runs: pd.DataFrame) -> str | None:
    """Why ``row`` is a release regression, or ``None`` (``RELEASE_REGRESSION``)."""
    mine = _tokens_per_s(row)
    twins = runs[
        (runs["model"].map(moe_model_name) == moe_model_name(row["model"]))
        & (runs["id"] != row["id"])
    ]
    for column in LAYOUT_COLUMNS:
        twins = twins[
            twins[column].fillna(-1).astype(str)
            == str(row[column] if pd.notna(row[column]) else -1)
        ]
    for _, twin in twins.iterrows():
        theirs = _tokens_per_s(twin)
        if mine and theirs and theirs > RELEASE_REGRESSION * mine:
            return (
                f"{theirs / mine:.2f}x slower than the same layout in {twin['id']}: a regression "
                "of that container release"
            )
    return None


def printed_ga_mismatch(row: pd.Series, dp: int, mbs: int) -> str | None:
    """The table's GA column (where printed) against ``gbs / (dp * mbs)``."""
    match = re.search(r"GA (\d+)", str(row["notes"]))
    if match and int(match.group(1)) * dp * mbs != _int(row["gbs_sequences"]):
        return (
            f"printed GA {match.group(1)} contradicts gbs {_int(row['gbs_sequences'])} / "
            f"(dp {dp} x mbs {mbs})"
        )
    return None


def build_mbridge_moe(row: pd.Series, runs: pd.DataFrame) -> Case | str:
    """A Megatron-Bridge MoE row with its published layout: TP, PP, VP, CP, EP, MBS, GBS as
    printed (EP carved out of DP, ETP 1 as in the presets), the distributed optimizer with BF16
    gradients, SP with TP, FP8 unless the row says BF16; no recompute, but DeepSeek-V3's preset
    recomputes ``mla_up_proj`` (autopar's selective recompute of an MLA layer) and the three
    dense MLPs (not modelled)."""
    match = re.search(r"Tokens/sec/GPU (\d+)", str(row["notes"]))
    if not match:
        return "no tokens/s/GPU"
    model = load_model(MBRIDGE_MOE_MODELS[moe_model_name(row["model"])])
    s, n, gbs = _int(row["seq_len"]), _int(row["num_gpus"]), _int(row["gbs_sequences"])
    tp, pp, cp = _int(row["tp"]), _int(row["pp"]), _int(row["cp"], 1)
    mbs, dp = _int(row["mbs"]), n // (tp * pp * cp)
    reason = printed_ga_mismatch(row, dp, mbs) or release_regression(row, runs)
    if reason:
        return reason
    layout = row_layout(row, recompute="selective" if model.is_mla else "none", zero=1)
    precision = "bf16" if "precision BF16" in str(row["notes"]) else "fp8"
    training = TrainingSpec(
        num_gpus=n,
        global_batch_sequences=gbs,
        seq_len=s,
        precision=precision,
        grad_precision="bf16",
        stack=dataclasses.replace(load_stack(None), optimizer_state_dtype="bf16"),
    )
    switches = dict(MBRIDGE_MOE_SWITCHES)
    if "tokendrop" in str(row["model"]):
        switches["moe_capacity_factor"] = TOKENDROP_CAPACITY_FACTOR
    return Case(
        row_id=row["id"],
        source="mbridge_moe",
        model=model,
        gpu=load_gpu("h100-sxm"),
        training=training,
        layout=layout,
        measured_step_s=gbs * s / (float(match.group(1)) * n),
        cost_switches=switches,
    )


BUILDERS = {
    "nar21_t1": build_2021,
    "nar21_t2": build_2021,
    "nar21_gpt3": build_2021,
    "mlm_readme2021": build_2021,
    "kor22": build_kor22,
    "mlm_readme2024": build_mlm2024,
    "nemo2407": build_nemo,
    "mbridge": build_mbridge,
}


def build_case(row: pd.Series, runs: pd.DataFrame | None = None) -> Case | str:
    """A ``Case``, or why the row cannot be modelled (``runs``: the whole table, for checks
    across rows)."""
    if row["verified"] == "inconsistent":
        return "published numbers contradict each other"
    if is_blackwell_row(row):
        return build_blackwell(row, Case)
    if is_mbridge_moe_row(row):
        return build_mbridge_moe(row, row.to_frame().T if runs is None else runs)
    source = source_of(row["id"])
    if source not in BUILDERS:
        return "unknown source"
    return BUILDERS[source](row, source)


def predict(case: Case) -> dict[str, float]:
    cluster = ClusterSpec(gpu=case.gpu, gpus_per_node=case.gpu.gpus_per_node)
    ctx = TermContext(
        model=case.model,
        cluster=cluster,
        training=case.training,
        options=SearchOptions(),
        comm=DatasheetCollectives(cluster),
    )
    cost_model = default_cost_model(**case.cost_switches)
    if case.stage_layers is None:
        result = estimate(case.layout, ctx, cost_model)
    else:
        lay = case.layout
        recompute = f"full:{case.model.num_layers}" if lay.recompute == "full" else lay.recompute
        plan = parse_plan(
            pp=lay.pp, vpp=lay.vpp, stage_layers=case.stage_layers, stage_recompute=recompute
        )
        result = estimate_plan(lay, plan, ctx, cost_model)
    return {
        "predicted_s": result.step_time_s,
        "mfu": result.mfu,
        "memory_gib": result.memory_bytes["total"] / GIB,
        "fits": result.fits,
        **{f"{k}_s": v for k, v in result.time_s.items()},
    }


def validate(csv_path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per modelled run with measured / predicted / error, the skipped rows)."""
    runs = pd.read_csv(csv_path)
    rows, skipped = [], []
    for _, row in runs.iterrows():
        case = build_case(row, runs)
        if isinstance(case, str):
            skipped.append({"id": row["id"], "reason": case})
            continue
        pred = predict(case)
        lay = case.layout
        rows.append(
            {
                "id": case.row_id,
                "source": case.source,
                "precision": case.precision,
                "stack": case.training.stack.name,
                "gpu": case.gpu.name,
                "generation": case.gpu.generation,
                "moe": case.model.is_moe,
                "model": case.model.name,
                "gpus": case.training.num_gpus,
                "layout": f"tp{lay.tp} pp{lay.pp} v{lay.vpp} cp{lay.cp} dp{lay.dp} mbs{lay.mbs} "
                f"ga{lay.grad_accum} {lay.recompute}" + (f" ep{lay.ep}" if lay.ep > 1 else ""),
                "measured_s": case.measured_step_s,
                **pred,
                "error_pct": 100.0 * (pred["predicted_s"] / case.measured_step_s - 1.0),
            }
        )
    return pd.DataFrame(rows), pd.DataFrame(skipped)


def summary(table: pd.DataFrame) -> dict[str, float]:
    errors = table["error_pct"].abs()
    return {
        "rows": float(len(table)),
        "median_abs_error_pct": float(np.median(errors)),
        "max_abs_error_pct": float(errors.max()),
        "median_error_pct": float(np.median(table["error_pct"])),
    }


def summary_by_precision(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """``summary`` of the BF16 rows and of the FP8 rows (issue 11 targets each separately)."""
    return {p: summary(rows) for p, rows in table.groupby("precision")}


KNOWN_MISS = "gpt-oss-120b"
"""The model family the cost model misses on every GPU generation (H100 -6 to -9%, every
Blackwell row 10-54% too fast; benchmarks/README.md "Blackwell", "Known misses"): printed
apart, never left out of the bands."""

BANDS_PATH = REPO / "autopar" / "costs" / "error_bands.json"


def bands_json(table: pd.DataFrame, held_out: list[dict] | tuple = ()) -> str:
    """The residuals ``autopar.costs.error_bands`` draws its bands from: one entry per modelled
    run (class and absolute relative error), as ``--write-bands`` writes them, then the held-out
    runs (``heldout.residual_table``: from other sources, no constant fitted on them), marked
    ``held_out``: a band that knew only the rows the constants were fitted on would promise more
    than the model keeps elsewhere."""
    runs = [
        {
            "id": row.id,
            "generation": row.generation,
            "precision": row.precision,
            "moe": bool(row.moe),
            "abs_error": round(abs(row.error_pct) / 100.0, 4),
        }
        for row in table.sort_values("id").itertuples()
    ]
    runs += [
        {
            "id": row["id"],
            "generation": row["generation"],
            "precision": row["precision"],
            "moe": bool(row["moe"]),
            "abs_error": round(abs(row["error_pct"]) / 100.0, 4),
            "held_out": True,
        }
        for row in sorted(held_out, key=lambda r: r["id"])
    ]
    lines = ",\n".join("  " + json.dumps(run) for run in runs)
    return (
        '{"written_by": "python benchmarks/validate_published.py --write-bands",\n'
        ' "csv": ["benchmarks/data/published/runs.csv",'
        ' "benchmarks/data/published/mlperf_v51_heldout.csv",'
        ' "benchmarks/data/published/nemo_blackwell_heldout.csv"],\n'
        f' "runs": [\n{lines}\n ]}}\n'
    )


def markdown(frame: pd.DataFrame) -> str:
    """A GitHub table (pandas' ``to_markdown`` needs the optional ``tabulate``)."""
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + " --- |" * len(frame.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(False)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--format", choices=("table", "markdown"), default="table")
    parser.add_argument(
        "--write-bands",
        action="store_true",
        help=f"write the residuals to {BANDS_PATH.relative_to(REPO)} (the error bands)",
    )
    args = parser.parse_args()
    table, skipped = validate(args.csv)
    if args.write_bands:
        from heldout import heldout_cases, residual_table  # noqa: PLC0415 (it imports this one)

        write_atomic(BANDS_PATH, bands_json(table, residual_table(heldout_cases())))
    columns = [
        "id",
        "gpus",
        "layout",
        "measured_s",
        "predicted_s",
        "error_pct",
        "mfu",
        "memory_gib",
        "fits",
    ]
    shown = table[columns].round(
        {"measured_s": 3, "predicted_s": 3, "error_pct": 1, "mfu": 3, "memory_gib": 1}
    )
    print(markdown(shown) if args.format == "markdown" else shown.to_string(index=False))
    stats = summary(table)
    print(
        f"\nrows modelled: {int(stats['rows'])}  median |error|: "
        f"{stats['median_abs_error_pct']:.1f}%  max |error|: {stats['max_abs_error_pct']:.1f}%"
    )
    blackwell = table["source"] == "mbridge_blackwell"
    earlier = table[~blackwell]
    dense = earlier["source"] != "mbridge_moe"
    groups = {
        **{f"dense {p}": rows for p, rows in earlier[dense].groupby("precision")},
        "moe (issue 12)": earlier[~dense],
        **{f"all {p}": rows for p, rows in earlier.groupby("precision")},
        **{
            f"{g} {p} {'moe' if m else 'dense'}": rows
            for (g, p, m), rows in table.groupby(["generation", "precision", "moe"])
        },
        **{f"gpu {gpu}": rows for gpu, rows in table[blackwell].groupby("gpu")},
        "blackwell dense": table[blackwell & ~table["moe"]],
        "blackwell moe": table[blackwell & table["moe"]],
        "blackwell (issue 20)": table[blackwell],
        f"blackwell without {KNOWN_MISS} (benchmarks/README.md)": table[
            blackwell & (table["model"] != KNOWN_MISS)
        ],
    }
    for name, rows in groups.items():
        stats = summary(rows)
        print(
            f"{name}: rows {int(stats['rows'])}  median |error| "
            f"{stats['median_abs_error_pct']:.1f}%  max |error| {stats['max_abs_error_pct']:.1f}%  "
            f"signed median {stats['median_error_pct']:+.1f}%"
        )
    by_source = table.groupby("source")["error_pct"].agg(
        lambda e: (
            f"median {np.median(np.abs(e)):.1f}% max {np.max(np.abs(e)):.1f}% "
            f"signed {np.median(e):+.1f}%"
        )
    )
    print(by_source.to_string())
    print(f"\nskipped ({len(skipped)}):")
    for _, row in skipped.iterrows():
        print(f"  {row['id']}: {row['reason']}")
    print("\n" + ASSUMPTIONS)


if __name__ == "__main__":
    main()
