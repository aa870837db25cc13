"""``autopar calibrate`` (nccl-tests logs -> profile.yaml, or a profile vs logs) and
``autopar bench comm|gemm``. Thin: parse options, call ``autopar.calibration`` / ``autopar.bench``,
render. Bad input is an ``InputError``: one line on stderr, exit code 2."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import typer

from autopar.base.errors import InputError, excerpt, shorten
from autopar.cli.errors import guarded
from autopar.cli.help import EXAMPLES, GroupedCommand
from autopar.cli.output import emit
from autopar.inputs.limits import MAX_GPUS, check_int

if TYPE_CHECKING:  # the calibration floor loads pandas: imported by the commands that use it
    from autopar.calibration.compare import LogComparison
    from autopar.calibration.profile import CommProfile, SourceLog

MAX_BENCH_PROCS = 256
MAX_BENCH_BYTES = 1 << 34
"""``bench comm --max-bytes``: 16 GiB per buffer."""
MAX_BENCH_ITERS = 100_000
MAX_BENCH_GEMM_ELEMENTS = 1 << 32
"""``bench gemm``: operands and product of one shape, in elements (8 GiB in FP16)."""

Logs = Annotated[list[Path] | None, typer.Argument(help="nccl-tests output files.")]
Format = Annotated[str, typer.Option("--format", "-f", help="table or json.")]


def _check_format(fmt: str) -> None:
    if fmt not in ("table", "json"):
        raise InputError(f"expected table or json, got {excerpt(fmt)}", source="--format")


def _parse_all(logs: Sequence[Path], *, gpu: str | None, gpus_per_node: int | None) -> list:
    from autopar.calibration.nccl import parse_nccl_log

    if not logs:
        raise InputError("give at least one nccl-tests log", source="LOG")
    if gpus_per_node is not None:
        check_int(gpus_per_node, source="--gpus-per-node", maximum=MAX_GPUS)
    if gpu is not None and not gpu.strip():
        raise InputError("must name a GPU, got an empty string", source="--gpu")
    return [parse_nccl_log(p, gpu=gpu, gpus_per_node=gpus_per_node) for p in logs]


def _sources(frames: Sequence, logs: Sequence[Path]) -> tuple[SourceLog, ...]:
    """Each log's provenance: its name as printed (``source``) and the digest of the file read
    (``logs``, in the order parsed: a name that is not UTF-8 prints otherwise than it opens)."""
    from autopar.calibration.profile import SourceLog
    from autopar.calibration.profile_io import file_sha256

    return tuple(
        SourceLog(
            path=str(f["source"].iat[0]),
            sha256=file_sha256(log),
            collective=",".join(dict.fromkeys(f["collective"])),
            num_ranks=int(f["num_ranks"].iat[0]),
            num_nodes=int(f["num_nodes"].iat[0]),
            gpu=None if f["gpu"].iat[0] is None else str(f["gpu"].iat[0]),
            notes=tuple(f.attrs.get("notes", ())),
        )
        for f, log in zip(frames, logs, strict=True)
    )


def _error_text(value: float) -> str:
    return "n/a (no size >= 1 MiB)" if math.isnan(value) else f"{value:.1f}%"


def _comparison_table(records: Sequence[LogComparison], *, per_size: bool) -> str:
    lines = []
    for record in records:
        lines.append(
            f"{record.file}: {record.collective} {record.ranks} ranks / {record.nodes} nodes, "
            f"median |error| (>= 1 MiB) {_error_text(record.median_abs_pct_error)}"
        )
        if per_size:
            table = record.to_frame().to_string(index=False, float_format=lambda v: f"{v:.2f}")
            lines += ["  " + line for line in table.splitlines()]
    return "\n".join(lines)


def _fit_table(profile: CommProfile) -> str:
    lines = ["fits (collective, span): peak busbw, latency per step, saturated, notes"]
    for fit in profile.fits:
        last = fit.regimes[-1]
        peak = last.busbw_peak_bytes_per_s
        peak_text = "unbounded" if math.isinf(peak) else f"{peak / 1e9:.1f} GB/s"
        lines.append(
            f"  {fit.collective} {fit.span}: {peak_text}, "
            f"{fit.regimes[0].latency_per_step_s * 1e6:.2f} us/step, "
            f"{'yes' if fit.saturated else 'no (bandwidth is a lower bound)'}, "
            f"{len(fit.regimes)} regime(s), ranks {list(fit.rank_counts)}"
        )
        lines += [f"    note: {note}" for note in fit.notes]
    return "\n".join(lines)


def _render(records: Sequence[LogComparison], fmt: str, *, per_size: bool) -> str:
    if fmt == "json":
        return json.dumps([r.to_dict() for r in records], indent=2)
    return _comparison_table(records, per_size=per_size)


def _run_fit(
    logs: Sequence[Path],
    *,
    output: Path | None,
    gpu: str | None,
    gpus_per_node: int | None,
    fmt: str,
) -> str:
    from autopar.calibration.compare import compare_log, fitted_only
    from autopar.calibration.profile import fit_profile
    from autopar.calibration.profile_io import save_profile

    if output is None:
        raise InputError("required to write the fitted profile", source="--output")
    frames = _parse_all(logs, gpu=gpu, gpus_per_node=gpus_per_node)
    import pandas as pd

    try:
        profile = fit_profile(pd.concat(frames, ignore_index=True), sources=_sources(frames, logs))
    except (np.linalg.LinAlgError, FloatingPointError, ValueError, ZeroDivisionError) as err:
        if isinstance(err, InputError):
            raise
        raise InputError(
            f"the measurements cannot be fitted ({type(err).__name__}); check the logs' "
            "time and size columns",
            source="LOG",
        ) from None
    save_profile(profile, output)
    fitted = fitted_only(profile)
    records = [r for frame in frames for r in compare_log(fitted, frame)]
    if fmt == "json":
        return _render(records, fmt, per_size=False)
    summary = _comparison_table(records, per_size=False)
    return (
        f"wrote {output}\nfit error per log (fitted model, no curves):\n{summary}\n"
        + _fit_table(profile)
    )


def _run_compare(
    logs: Sequence[Path],
    *,
    profile_path: Path | None,
    gpu: str | None,
    gpus_per_node: int | None,
    fmt: str,
) -> str:
    from autopar.calibration.compare import compare_log
    from autopar.calibration.profile_io import load_profile

    if profile_path is None:
        raise InputError("--compare needs --profile PROFILE.yaml", source="--profile")
    profile = load_profile(profile_path)
    frames = _parse_all(logs, gpu=gpu, gpus_per_node=gpus_per_node)
    records = [r for frame in frames for r in compare_log(profile, frame)]
    return _render(records, fmt, per_size=True)


def calibrate(
    logs: Logs = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="profile.yaml to write.")
    ] = None,
    profile: Annotated[
        Path | None, typer.Option("--profile", help="Profile for --compare.")
    ] = None,
    compare: Annotated[bool, typer.Option("--compare", help="Profile vs LOGs.")] = False,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="GPU name for logs without Rank lines.")
    ] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option("--gpus-per-node", help="For logs without Rank lines.")
    ] = None,
    fmt: Format = "table",
) -> None:
    """Fit a communication profile from nccl-tests logs, or compare a profile with logs."""

    def run() -> str:
        _check_format(fmt)
        if compare:
            return _run_compare(
                logs or [], profile_path=profile, gpu=gpu, gpus_per_node=gpus_per_node, fmt=fmt
            )
        return _run_fit(logs or [], output=output, gpu=gpu, gpus_per_node=gpus_per_node, fmt=fmt)

    text = run()
    if sys.stdout is not None:  # closed with --output given: the profile is the result
        emit(text, None)


bench_app = typer.Typer(help="Benchmarks that produce calibration data (needs autopar[bench]).")


@bench_app.command("comm", cls=GroupedCommand, epilog=EXAMPLES["bench comm"])
@guarded
def bench_comm(
    output: Annotated[Path, typer.Option("--output", "-o", help="nccl-tests-format log.")],
    nproc: Annotated[int, typer.Option("--nproc", help="Local processes (gloo on CPU).")] = 1,
    min_bytes: Annotated[int, typer.Option("--min-bytes")] = 1024,
    max_bytes: Annotated[int, typer.Option("--max-bytes")] = 1 << 24,
    factor: Annotated[int, typer.Option("--factor")] = 2,
    iters: Annotated[int, typer.Option("--iters")] = 20,
    warmup: Annotated[int, typer.Option("--warmup")] = 5,
    backend: Annotated[str | None, typer.Option("--backend", help="gloo or nccl.")] = None,
) -> None:
    """Time the collectives on NPROC local processes; across nodes, use the torchrun command."""
    from autopar.calibration import comm_bench as comm

    def run() -> str:
        check_int(nproc, source="--nproc", maximum=MAX_BENCH_PROCS)
        check_int(max_bytes, source="--max-bytes", maximum=MAX_BENCH_BYTES)
        check_int(min_bytes, source="--min-bytes", maximum=max_bytes)
        check_int(factor, source="--factor", minimum=2, maximum=1 << 20)
        check_int(iters, source="--iters", maximum=MAX_BENCH_ITERS)
        check_int(warmup, source="--warmup", minimum=0, maximum=MAX_BENCH_ITERS)
        options = comm.CommBenchOptions(
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            factor=factor,
            iters=iters,
            warmup=warmup,
            backend=backend,
        )
        comm.spawn_local(nproc, options, output)
        hint = comm.torchrun_command(nnodes=2, nproc_per_node=8, output=str(output))
        return f"wrote {output} ({nproc} local processes)\nacross nodes: {hint}"

    emit(run(), None)


@bench_app.command("gemm", cls=GroupedCommand, epilog=EXAMPLES["bench gemm"])
@guarded
def bench_gemm(
    shape: Annotated[list[str] | None, typer.Option("--shape", help="m,n,k (repeatable).")] = None,
    hidden: Annotated[int | None, typer.Option("--hidden")] = None,
    ffn: Annotated[int | None, typer.Option("--ffn")] = None,
    heads: Annotated[int | None, typer.Option("--heads")] = None,
    kv_heads: Annotated[int | None, typer.Option("--kv-heads")] = None,
    vocab: Annotated[int | None, typer.Option("--vocab")] = None,
    tp: Annotated[int, typer.Option("--tp")] = 1,
    tokens: Annotated[int, typer.Option("--tokens", help="mbs * seq.")] = 4096,
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16, fp32 or fp8.")] = "bf16",
    iters: Annotated[int, typer.Option("--iters")] = 10,
    profile: Annotated[Path | None, typer.Option("--profile", help="Merge into this YAML.")] = None,
) -> None:
    """Achieved TFLOP/s of torch.matmul per GEMM shape; optionally merged into a profile."""
    from autopar.calibration import gemm_bench as gemm

    def run() -> str:
        check_int(iters, source="--iters", maximum=MAX_BENCH_ITERS)
        if dtype not in gemm.DTYPES:
            raise InputError(
                f"must be one of {', '.join(gemm.DTYPES)}, got {excerpt(dtype)}", source="--dtype"
            )
        try:
            shapes = _gemm_shapes(shape, hidden, ffn, heads, kv_heads, vocab, tp, tokens)
        except ValueError as err:
            if isinstance(err, InputError):
                raise
            raise InputError(shorten(err, 200), source="--shape") from None
        for s in shapes:
            if s.m * s.k + s.k * s.n + s.m * s.n > MAX_BENCH_GEMM_ELEMENTS:
                raise InputError(
                    f"GEMM {s.name} needs more than {MAX_BENCH_GEMM_ELEMENTS:,} elements",
                    source="--shape",
                )
        points = gemm.run_gemm_bench(shapes, dtype=dtype, iters=iters)
        lines = [
            f"{s.name:>12} m={p.m} n={p.n} k={p.k} {dtype}: {p.flop_per_s / 1e12:.3f} TFLOP/s"
            for s, p in zip(shapes, points, strict=True)
        ]
        if profile is not None:
            gemm.merge_into_file(profile, points)
            lines.append(f"merged into {profile}")
        return "\n".join(lines)

    emit(run(), None)


def _gemm_shapes(
    shape: list[str] | None,
    hidden: int | None,
    ffn: int | None,
    heads: int | None,
    kv_heads: int | None,
    vocab: int | None,
    tp: int,
    tokens: int,
) -> tuple:
    from autopar.calibration import gemm_bench as gemm

    if shape:
        return tuple(gemm.parse_shape(s) for s in shape)
    if hidden is None or ffn is None or heads is None or vocab is None:
        raise InputError("give --shape m,n,k or all of --hidden --ffn --heads --vocab")
    for flag, value in (
        ("--hidden", hidden),
        ("--ffn", ffn),
        ("--heads", heads),
        ("--kv-heads", kv_heads or heads),
        ("--vocab", vocab),
        ("--tp", tp),
        ("--tokens", tokens),
    ):
        check_int(value, source=flag, maximum=1 << 24)
    return gemm.model_gemm_shapes(
        hidden=hidden,
        ffn=ffn,
        num_heads=heads,
        num_kv_heads=kv_heads or heads,
        vocab=vocab,
        tp=tp,
        tokens=tokens,
    )


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` and the ``bench`` sub-app to the autopar CLI."""
    app.command("calibrate", cls=GroupedCommand, epilog=EXAMPLES["calibrate"])(guarded(calibrate))
    app.add_typer(bench_app, name="bench")
