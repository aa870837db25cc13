"""Measure the GEMMs real models produce on this GPU, save them as a profile, and compare them
with the default cost model's roofline (the compute term of ``cost_models/compute.py``).

    python benchmarks/gpu_gemm.py --gpu h200 --output benchmarks/data/h200_gemm_profile.yaml
    python benchmarks/gpu_gemm.py --quick --gpu h100 --output /tmp/p.yaml   # CPU smoke run

Shapes: forward, data-gradient and weight-gradient GEMMs of QKV, attention output, MLP up/down
and logits (``autopar.calibration.gemm_bench.model_gemm_shapes``), per tensor-parallel rank, for
Llama-3 8B and 70B and GPT-3 175B at TP 1-8 and 1k-16k tokens per micro-batch; BF16 and, on GPUs
that have it, FP8. Prints the achieved TFLOP/s and, per dtype, the roofline's median and worst error
against the measurement; ``--summary FILE`` writes the same as JSON. An ``--output`` profile makes
``--comm-profile`` (or a cluster's ``comm_profile``) use the measured rates in the compute term.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np

from autopar.calibration.gemm_bench import (
    GemmShape,
    merge_into_file,
    model_gemm_shapes,
    run_gemm_bench,
)
from autopar.calibration.profile import CommProfile
from autopar.costs.comm import DatasheetCollectives
from autopar.costs.terms import TermContext
from autopar.inputs.loading import load_cluster, load_model
from autopar.inputs.specs import SearchOptions, TrainingSpec
from cost_models.gemm import gemm_time_s

MODELS = ("llama-3-8b", "llama-3-70b", "gpt3-175b")


def training_shapes(model_name: str, *, tps, token_counts) -> list[GemmShape]:
    """Forward, data-gradient and weight-gradient GEMMs of one layer and the logits."""
    m = load_model(model_name)
    out = []
    for tp in tps:
        for tokens in token_counts:
            for s in model_gemm_shapes(
                hidden=m.hidden_size,
                ffn=m.ffn_hidden_size,
                num_heads=m.num_attention_heads,
                num_kv_heads=m.num_kv_heads,
                vocab=m.vocab_size - m.vocab_size % (128 * tp),
                tp=tp,
                tokens=tokens,
                gated_mlp=m.mlp_kind == "swiglu",
            ):
                out += [
                    s,
                    replace(s, name=f"{s.name}.dgrad", n=s.k, k=s.n),
                    replace(s, name=f"{s.name}.wgrad", m=s.k, k=s.m),
                ]
    unique = {(s.m, s.n, s.k): s for s in out}
    return list(unique.values())


def roofline_flop_per_s(shapes: list[GemmShape], *, gpu: str, dtype: str) -> np.ndarray:
    """The default cost model's achieved FLOP/s for each shape (no measured profile)."""
    cluster = load_cluster(gpu=gpu)
    ctx = TermContext(
        model=load_model("llama-3-8b"),
        cluster=cluster,
        training=TrainingSpec(num_gpus=8, global_batch_sequences=8, seq_len=4096),
        options=SearchOptions(),
        comm=DatasheetCollectives(cluster),
    )
    m, n, k = (np.array([getattr(s, a) for s in shapes], dtype=np.float64) for a in "mnk")
    return 2 * m * n * k / gemm_time_s(m, n, k, ctx=ctx, dtype=dtype)


def has_fp8() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", required=True, help="preset the roofline compares against")
    parser.add_argument("--output", required=True, help="profile YAML to write (merged)")
    parser.add_argument("--summary", help="JSON summary to write")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, for a CPU smoke run")
    args = parser.parse_args()
    if args.quick:
        shapes = [GemmShape(name="q", m=64, n=96, k=128), GemmShape(name="r", m=128, n=64, k=64)]
        dtypes, iters, warmup = ["fp32"], 3, 1
    else:
        shapes = [
            s
            for name in MODELS
            for s in training_shapes(name, tps=(1, 2, 4, 8), token_counts=(1024, 4096, 8192, 16384))
        ]
        dtypes, iters, warmup = ["bf16", *(["fp8"] if has_fp8() else [])], 10, 3
    summary = {"gpu": args.gpu, "shapes": len(shapes), "dtypes": {}}
    for dtype in dtypes:
        start = time.perf_counter()
        try:
            measured = run_gemm_bench(shapes, dtype=dtype, iters=iters, warmup=warmup)
        except (RuntimeError, ValueError) as err:  # e.g. no FP8 kernel for a shape
            summary["dtypes"][dtype] = {"error": str(err).splitlines()[0]}
            continue
        profile: CommProfile = merge_into_file(args.output, measured)
        rates = np.array([p.flop_per_s for p in measured])
        model = roofline_flop_per_s(shapes, gpu=args.gpu, dtype="fp8" if dtype == "fp8" else "bf16")
        error = np.abs(model / rates - 1.0) * 100.0
        summary["dtypes"][dtype] = {
            "seconds": time.perf_counter() - start,
            "median_tflop_per_s": float(np.median(rates) / 1e12),
            "max_tflop_per_s": float(rates.max() / 1e12),
            "roofline_median_abs_pct_error": float(np.median(error)),
            "roofline_p90_abs_pct_error": float(np.percentile(error, 90)),
        }
        for shape, rate, predicted in zip(shapes, rates, model, strict=True):
            print(
                f"{dtype:>4} {shape.name:>16} m={shape.m:>6} n={shape.n:>6} k={shape.k:>6} "
                f"{rate / 1e12:8.1f} TFLOP/s  roofline {predicted / 1e12:8.1f}"
            )
        summary["profile_points"] = len(profile.gemm)
    print(json.dumps(summary, indent=2))
    if args.summary:
        with open(args.summary, "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=2)


if __name__ == "__main__":
    main()
