"""Held-out Blackwell runs: the NeMo performance summaries of containers 25.02 (DGX-B200), 25.04
and 25.07 (DGX-GB200), FP8 pre-training.

Not calibration (issue 20): no constant is fitted on these rows, and none of them is in
``validate_published.py``. With ``mlperf_heldout.py`` they stand in for the check on Blackwell
runs from other sources and containers. ``data/published/nemo_blackwell_heldout.csv`` holds
each row as its table prints it (docs.nvidia.com, NeMo Framework user guide, "Performance
Summary for Large Language Models": the 25.02 page for DGX-B200, the 25.04 archive page and
the 25.07 page for DGX-GB200; listed in ``benchmarks/README.md``), with the step time
``gbs * seq_len / (tokens_per_s_gpu * num_gpus)``. Left out: the 25.07 figures in parentheses
(the page does not say which configuration they belong to) and the 25.02 Mixtral 8x22B row
(its GBS and MBS columns contradict its GA).

What the tables do not print comes from NeMo's own performance recipes, per row (``config``:
``scripts/performance/recommended_model_configs/model_configs_{b200,gb200}.csv`` at tag v2.3.0
for 25.02 and 25.04, and v2.4.0 for 25.07; the 25.02 table's layouts are v2.3.0's, not those
of v2.2.0's ``scripts/llm/performance/`` configs, which run GPT-3 on 128 GPUs and Llama 3.1
405B on 144): ``cuda_graphs`` (``enable_cuda_graph``, Megatron's per-layer graphs:
``scripts/performance/helpers.py`` ``set_cuda_graph_configs``) and ``cpu_offload_layers``
(``activation_offload_layers``: ``cpu_offloading_num_layers``, activations only); the layout is
the table's where the config differs (two rows); and ``fp8_recipe``. The 25.04 and 25.07 pages
say "per-tensor FP8 quantization, leveraging scaling factors computed in the current step"
(``current``); the 25.02 page says only "FP8 precision", and the recipes of that time scale
with delayed scaling (``delayed``): v2.2.0's ``pretrain_*.py`` set ``bf16_with_fp8_mixed()``
(``pretrain_nemotron4_15b.py`` L71), which has no ``fp8_recipe`` (Transformer Engine's default
``DelayedScaling``, amax history 1024: ``recipes/precision/mixed_precision.py`` L46-54 at
v2.2.0), and v2.3.0's ``--fp8_recipe`` defaults to ``ds`` (``argument_parser.py`` L80-91,
``utils.py`` L340-344: ``fp8_recipe = "delayed"``). The MLP activation: NeMo 2.0 runs the
Nemotron models' squared ReLU eagerly (``NEMO2_EAGER_ACTIVATIONS``). The rest is what the pages
say of all their rows and otherwise the ``megatron-bridge-25.09`` stack's defaults, the same
for every row: no recompute (every pre-training row's ``recompute_layers`` is 0), SP with TP,
the distributed optimizer (FSDP = 1: ZeRO-3, Megatron-FSDP), and for MoE rows NeMo's default
``moe_token_dispatcher_type="alltoall"`` (``nemo/collections/llm/gpt/model/mixtral.py``,
``llama4.py``).

    python benchmarks/nemo_heldout.py            # the table benchmarks/README.md prints
"""

from __future__ import annotations

import csv
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from heldout import residual_table, summary  # noqa: E402
from validate_published import Case  # noqa: E402

from autopar.inputs.loading import load_gpu, load_model, load_stack  # noqa: E402
from autopar.inputs.specs import TrainingSpec  # noqa: E402
from autopar.layout.plan import Layout  # noqa: E402

HELDOUT_CSV = Path(__file__).resolve().parent / "data" / "published" / "nemo_blackwell_heldout.csv"
MOE_SWITCHES = {"moe_dispatcher": "alltoall"}
"""NeMo 2.0's MoE configs keep Megatron's all-to-all token dispatcher (module docstring)."""


NEMO2_EAGER_ACTIVATIONS = ("relu2",)
"""NeMo 2.0's Nemotron models run their squared ReLU as eager PyTorch ops
(``StackSpec.eager_activations``: ``nemotron.py`` L22 / L45, ``fn/activation.py`` L34-37 at
NeMo v2.3.0 and v2.4.0); the other rows' activations are fused (GELU, SwiGLU:
``bias_activation_fusion``)."""


def measured_step_s(row: dict[str, str]) -> float:
    """The step a row's tokens/s/GPU implies: ``gbs * seq_len / (tokens_per_s_gpu * n)``."""
    tokens = int(row["gbs_sequences"]) * int(row["seq_len"])
    return tokens / (float(row["tokens_per_s_gpu"]) * int(row["num_gpus"]))


def heldout_case(row: dict[str, str]) -> Case:
    """One held-out row as a ``validate_published.Case`` (module docstring)."""
    n, gbs, mbs = int(row["num_gpus"]), int(row["gbs_sequences"]), int(row["mbs"])
    tp, pp, cp = int(row["tp"]), int(row["pp"]), int(row["cp"])
    dp = n // (tp * pp * cp)
    assert gbs == mbs * dp * int(row["ga"]), row["id"]  # the printed GA agrees
    stack = dataclasses.replace(
        load_stack("megatron-bridge-25.09"),
        fp8_recipe=row["fp8_recipe"],
        cuda_graphs=row["cuda_graphs"],
        cpu_offload_layers=int(row["cpu_offload_layers"]),
        eager_activations=NEMO2_EAGER_ACTIVATIONS,
    )
    training = TrainingSpec(
        num_gpus=n,
        global_batch_sequences=gbs,
        seq_len=int(row["seq_len"]),
        precision="fp8",
        grad_precision=stack.grad_reduce_dtype,
        stack=stack,
    )
    layout = Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=int(row["ep"]),
        vpp=int(row["vpp"]),
        mbs=mbs,
        grad_accum=int(row["ga"]),
        recompute="none",
        zero=3 if row["fsdp"] == "1" else 1,
        sequence_parallel=tp > 1,
    )
    model = load_model(row["model"])
    return Case(
        row_id=row["id"],
        source=f"nemo{row['container']}",
        model=model,
        gpu=load_gpu(row["gpu"]),
        training=training,
        layout=layout,
        measured_step_s=measured_step_s(row),
        cost_switches=dict(MOE_SWITCHES) if model.is_moe else {},
    )


def heldout_cases(path: Path = HELDOUT_CSV) -> list[Case]:
    with path.open(newline="") as handle:
        return [heldout_case(row) for row in csv.DictReader(handle)]


def heldout_table(path: Path = HELDOUT_CSV) -> list[dict[str, object]]:
    """Per row: measured and predicted step time, the error and whether the layout fits."""
    return residual_table(heldout_cases(path))


def main() -> None:
    rows = heldout_table()
    print("| run | measured s | predicted s | error | fits |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['id']} | {r['measured_s']:.4g} | {r['predicted_s']:.4g} | "
            f"{r['error_pct']:+.1f}% | {r['fits']} |"
        )
    print(summary("held out", [r["error_pct"] for r in rows]))
    for gpu in sorted({r["gpu"] for r in rows}):
        print(summary(f"  {gpu}", [r["error_pct"] for r in rows if r["gpu"] == gpu]))


if __name__ == "__main__":
    main()
