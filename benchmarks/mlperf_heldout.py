"""Held-out Blackwell runs: the MLPerf Training v5.1 Llama 3.1 8B / 405B submissions made with
NVIDIA's NeMo 25.09 code: NVIDIA's own on GB200 / GB300 NVL72, and Oracle's, the University of
Florida's (8B on 1 to 32 nodes, 405B on 32 and 56, its 405B configs without TP overlap),
Dell's (8B on one and two B200 nodes, one B300 node) and Verda's on DGX B200 / HGX B300 (x86
hosts, InfiniBand / RoCE between 8-GPU nodes).

Not calibration (issue 20): no constant is fitted on these rows. They stand in for the check on
Blackwell runs from other sources and containers. ``data/published/mlperf_v51_heldout.csv``
holds, per run, the layout and recipe of its config file and the median ``train_step_time``
over every ``result_*.txt`` of the submission (mlcommons/training_results_v5.1; the per-step
wall time ``custom_callbacks.py`` ``DeltaTimingCallback`` takes between two
``on_train_batch_end``; the 8B logs it every 32 steps, the 405B every step; the MLLOG
``global_batch_size`` and ``gradient_accumulation_steps`` of each file agree with the row).
The config of an NVIDIA run is the one its submission's ``README-<system>.md`` names
(``benchmarks/llama31_*/implementations/<system>/``: "Launch configuration ... are in the
``config_*.sh`` script"): each 405B directory also holds an FP8 twin of that config (the same
name without ``_fp4``), which did not run; all four NVIDIA 405B submissions name the
``_cg_fp4.sh`` one (NVIDIA: the only v5.1 submitter to train in FP4). The B200 / B300 rows are
those whose submitter's directory holds exactly one config of their layout (FP8: no DGX-B200
405B config sources config_common_fp4.sh; Dell's 8-GPU B200 config, named after its system,
is NVFP4 with FP8 attention). Left out: Oracle's 8-GPU run (its directory holds an FP8 and an
NVFP4 config of that layout) and Lenovo's (its log names a B200 platform, its results
directory and system file a B300). Each run is evaluated on the
``megatron-bridge-25.09`` stack with what its config sets: FP8 current scaling
(``FP8_RECIPE=tensorwise``, config_common.sh), NVFP4 (config_common_fp4.sh: ``FP4=True``,
``FP8=False``, every linear layer in NVFP4, ``FP8_PARAM_GATHER=False``, TP overlap off, FP8
attention only where config_common_fp8attn.sh is sourced, ``FP8_DPA=True``; the 512-GPU 405B
configs also set ``NVTE_DPA_FP8_RECIPE=F16``), full-iteration CUDA graphs
(config_common_cg.sh ``FULL_CUDA_GRAPH=1``; the 8B NVFP4 configs set 0 and keep
``MCORE_CUDA_GRAPH=1``, per-layer graphs), ``TP_COMM_OVERLAP``; Llama 3.1 405B's 126 layers
with the embedding and the loss counted as pipeline layers (``ASYM_PP_EMBED`` /
``ASYM_PP_LOSS``), which the uniform split expresses at PP 8 x VP 8; no recompute
(``ACT_CKPT_*`` unset), the distributed optimizer (``USE_DIST_OPTIMIZER=True``).

    python benchmarks/mlperf_heldout.py            # the table benchmarks/README.md prints
    python benchmarks/mlperf_heldout.py --terms    # every time term of each prediction
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from heldout import read_cases, residual_table, summary_lines  # noqa: E402
from validate_published import Case, predict, printed_layout  # noqa: E402

from autopar.inputs.loading import load_gpu, load_model, load_stack  # noqa: E402
from autopar.inputs.specs import TrainingSpec  # noqa: E402

HELDOUT_CSV = Path(__file__).resolve().parent / "data" / "published" / "mlperf_v51_heldout.csv"


def heldout_case(row: dict[str, str]) -> Case:
    """One held-out run as a ``validate_published.Case`` (module docstring)."""
    n, gbs, mbs = int(row["num_gpus"]), int(row["gbs_sequences"]), int(row["mbs"])
    tp, pp, cp = int(row["tp"]), int(row["pp"]), int(row["cp"])
    stack = dataclasses.replace(
        load_stack("megatron-bridge-25.09"),
        fp8_recipe="current",
        fp8_gemms=tuple(row["fp8_gemms"].split(",")),
        cuda_graphs=row["cuda_graphs"],
        tp_comm_overlap=row["tp_comm_overlap"] == "true",
    )
    training = TrainingSpec(
        num_gpus=n,
        global_batch_sequences=gbs,
        seq_len=int(row["seq_len"]),
        precision=row["precision"],
        grad_precision=stack.grad_reduce_dtype,
        stack=stack,
    )
    layout = printed_layout(n, gbs, tp=tp, pp=pp, cp=cp, vpp=int(row["vpp"]), mbs=mbs, zero=1)
    return Case(
        row_id=row["id"],
        source="mlperf_v51",
        model=load_model(row["model"]),
        gpu=load_gpu(row["gpu"]),
        training=training,
        layout=layout,
        measured_step_s=float(row["measured_step_s"]),
    )


def heldout_cases(path: Path = HELDOUT_CSV) -> list[Case]:
    return read_cases(path, heldout_case)


def heldout_table(path: Path = HELDOUT_CSV) -> list[dict[str, object]]:
    """Per run: measured and predicted step time, the error and the largest time terms."""
    return residual_table(heldout_cases(path))


def terms_table(path: Path = HELDOUT_CSV) -> list[dict[str, object]]:
    """Per run: measured and predicted step time and every time term of the prediction
    (``validate_published.predict``'s ``*_s``: compute, bubble, TP / PP / DP / CP / EP
    communication, optimizer, ...), for checking each against FLOPs / peak and bytes /
    bandwidth."""
    rows = []
    for case in heldout_cases(path):
        pred = predict(case)
        terms = {k: v for k, v in pred.items() if k.endswith("_s") and k != "predicted_s" and v}
        rows.append({"id": case.row_id, "measured_s": case.measured_step_s, **pred, "terms": terms})
    return rows


def main() -> None:
    if "--terms" in sys.argv[1:]:
        for r in terms_table():
            terms = ", ".join(f"{k} {v:.4g}" for k, v in r["terms"].items())
            print(
                f"{r['id']}: measured {r['measured_s']:.4g} s, predicted {r['predicted_s']:.4g} s"
            )
            print(f"    {terms}")
        return
    rows = heldout_table()
    print("| run | measured s | predicted s | error | compute s | cp comm s | dp comm s | fits |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['id']} | {r['measured_s']:.4g} | {r['predicted_s']:.4g} | "
            f"{r['error_pct']:+.0f}% | {r['compute_s']:.4g} | {r['cp_comm_s']:.3g} | "
            f"{r['dp_comm_s']:.3g} | {r['fits']} |"
        )
    for line in summary_lines(rows):
        print(line)


if __name__ == "__main__":
    main()
