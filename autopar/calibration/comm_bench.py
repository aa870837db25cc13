"""Collective benchmark over torch.distributed that writes nccl-tests-format output.

Run under torchrun (one process per GPU; NCCL on GPUs, gloo on CPU)::

    torchrun --nnodes 2 --nproc-per-node 8 -m autopar.calibration.comm_bench --output comm.log

or locally with N gloo processes: ``python -m autopar.calibration.comm_bench --nproc 4 --output
comm.log``. Sizes follow the nccl-tests conventions of ``autopar/costs/comm.py`` (all_gather: total
gathered bytes; reduce_scatter / all_to_all: each rank's whole input; send_recv: bytes one rank
sends to the next), and ``algbw = size / time``, ``busbw = algbw * f(n)`` (nccl-tests
doc/PERFORMANCE.md). Each table is preceded by ``# Collective test starting: <collective>_perf`` and
the Rank lines carry host names, so ``autopar calibrate`` reads collective, ranks and nodes from the
file. Times are the maximum over ranks of the mean per iteration. Only out-of-place is measured
(in-place: N/A). A collective the backend lacks (gloo: reduce_scatter, sometimes all_to_all) is
skipped with a
``# skipped`` note. torch is imported lazily (optional dependency ``autopar[bench]``).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autopar.base.files import write_atomic
from autopar.costs.comm import COLLECTIVES, bus_bandwidth_factor

ELEMENT_BYTES = 4  # float32
PROGRAM_NAMES: dict[str, str] = {
    "all_reduce": "all_reduce_perf",
    "all_gather": "all_gather_perf",
    "reduce_scatter": "reduce_scatter_perf",
    "all_to_all": "alltoall_perf",
    "send_recv": "sendrecv_perf",
}
"""nccl-tests binary names, printed in the ``Collective test starting`` lines."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CommBenchOptions:
    """Size sweep and repetitions (names as nccl-tests' -b -e -f -w -n)."""

    min_bytes: int = 1024
    max_bytes: int = 1 << 20
    factor: int = 2
    iters: int = 20
    warmup: int = 5
    collectives: tuple[str, ...] = COLLECTIVES
    backend: str | None = None
    """None: nccl when CUDA is available, else gloo."""

    def __post_init__(self) -> None:
        if self.min_bytes < 1 or self.max_bytes < self.min_bytes:
            raise ValueError(
                f"need 1 <= min_bytes <= max_bytes, got {self.min_bytes}, {self.max_bytes}"
            )
        if self.factor < 2 or self.iters < 1 or self.warmup < 0:
            raise ValueError("need factor >= 2, iters >= 1, warmup >= 0")
        unknown = set(self.collectives) - set(COLLECTIVES)
        if unknown:
            raise ValueError(f"unknown collectives {sorted(unknown)}; expected {COLLECTIVES}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    size_bytes: int
    count: int
    time_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Table:
    collective: str
    rows: tuple[Row, ...] = ()
    skipped: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RankInfo:
    rank: int
    pid: int
    host: str
    device: int
    device_name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchResult:
    world_size: int
    backend: str
    ranks: tuple[RankInfo, ...]
    tables: tuple[Table, ...] = field(default=())


def sweep_sizes(options: CommBenchOptions, *, world_size: int) -> tuple[int, ...]:
    """min, min*factor, ... <= max, each rounded down to a multiple of world_size elements."""
    sizes, size = [], options.min_bytes
    unit = ELEMENT_BYTES * world_size
    while size <= options.max_bytes:
        sizes.append(max(unit, size // unit * unit))
        size *= options.factor
    return tuple(dict.fromkeys(sizes))


def element_count(collective: str, size_bytes: int, world_size: int) -> int:
    """nccl-tests ``count`` column: per-rank elements for the gather/scatter family."""
    per_rank = collective in ("all_gather", "reduce_scatter", "all_to_all")
    return size_bytes // ELEMENT_BYTES // (world_size if per_rank else 1)


def format_log(result: BenchResult, options: CommBenchOptions) -> str:
    """nccl-tests (>= 2.16.7) text: starting line, params, Rank lines, 13-column table, footer."""
    lines = []
    for table in result.tables:
        lines += _format_table(result, options, table)
    return "\n".join(lines) + "\n"


def _format_table(result: BenchResult, options: CommBenchOptions, table: Table) -> list[str]:
    n = result.world_size
    lines = [
        f"# Collective test starting: {PROGRAM_NAMES[table.collective]}",
        f"# nThread 1 nGpus 1 minBytes {options.min_bytes} maxBytes {options.max_bytes} "
        f"step: {options.factor}(factor) warmup iters: {options.warmup} iters: {options.iters} "
        "agg iters: 1 validation: 0 graph: 0",
        f"# autopar.calibration.comm_bench backend: {result.backend}",
        "#",
        "# Using devices",
    ]
    lines += [
        f"#  Rank {r.rank:2d} Group  0 Pid {r.pid:6d} on {r.host:>10} device {r.device:2d} "
        f"[0000:00:00] {r.device_name}"
        for r in result.ranks
    ]
    if table.skipped:
        return [*lines, f"# skipped {table.collective}: {table.skipped}", "#"]
    lines += [
        "#",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       "
        "     (us)  (GB/s)  (GB/s)",
    ]
    factor = float(bus_bandwidth_factor(table.collective, n))
    busbws = []
    redop = "sum" if table.collective in ("all_reduce", "reduce_scatter") else "none"
    for row in table.rows:
        algbw = row.size_bytes / row.time_s / 1e9
        busbws.append(algbw * factor)
        lines.append(
            f"{row.size_bytes:12d}  {row.count:12d}     float  {redop:>6}      -1 "
            f"{row.time_s * 1e6:8.2f} {algbw:7.3f} {algbw * factor:7.3f}    N/A"
            "      N/A     N/A     N/A    N/A"
        )
    average = sum(busbws) / len(busbws) if busbws else 0.0
    lines += [
        "# Out of bounds values : 0 OK",
        f"# Avg bus bandwidth    : {average:.4f}",
        "#",
        f"# Collective test concluded: {PROGRAM_NAMES[table.collective]}",
    ]
    return lines


def _operation(collective: str, size_bytes: int, *, device: Any) -> Callable[[], None]:
    """A closure running one call of ``collective`` at nccl-tests size ``size_bytes``."""
    import torch
    import torch.distributed as dist

    n, rank = dist.get_world_size(), dist.get_rank()
    numel = size_bytes // ELEMENT_BYTES
    full = torch.ones(numel, dtype=torch.float32, device=device)
    shard = torch.ones(numel // n, dtype=torch.float32, device=device)
    if collective == "all_reduce":
        return lambda: dist.all_reduce(full)
    if collective == "all_gather":
        parts = list(full.chunk(n))
        return lambda: dist.all_gather(parts, shard)
    if collective == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(shard, full)
    if collective == "all_to_all":
        received = torch.empty_like(full)
        return lambda: dist.all_to_all_single(received, full)
    received = torch.empty_like(full)

    def send_recv() -> None:
        ops = [
            dist.P2POp(dist.isend, full, (rank + 1) % n),
            dist.P2POp(dist.irecv, received, (rank - 1) % n),
        ]
        for request in dist.batch_isend_irecv(ops):
            request.wait()

    return send_recv


def _time_call(call: Callable[[], None], options: CommBenchOptions, *, device: Any) -> float:
    """Max over ranks of the mean time per call (after warm-up)."""
    import torch
    import torch.distributed as dist

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(options.warmup):
        call()
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(options.iters):
        call()
    sync()
    elapsed = torch.tensor([(time.perf_counter() - start) / options.iters], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def _bench_collective(collective: str, options: CommBenchOptions, *, device: Any) -> Table:
    import torch.distributed as dist

    n = dist.get_world_size()
    rows = []
    for size in sweep_sizes(options, world_size=n):
        try:
            call = _operation(collective, size, device=device)
            call()
        except (RuntimeError, NotImplementedError, ValueError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            return Table(collective=collective, skipped=f"not supported by this backend ({reason})")
        time_s = _time_call(call, options, device=device)
        rows.append(Row(size_bytes=size, count=element_count(collective, size, n), time_s=time_s))
    return Table(collective=collective, rows=tuple(rows))


def _rank_info(device: Any) -> tuple[RankInfo, ...]:
    import torch
    import torch.distributed as dist

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    mine = RankInfo(
        rank=dist.get_rank(),
        pid=os.getpid(),
        host=socket.gethostname(),
        device=device.index or 0,
        device_name=name,
    )
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return tuple(everyone)


def run_benchmark(options: CommBenchOptions) -> BenchResult:
    """Inside an initialised process group: benchmark every collective in ``options``."""
    import torch
    import torch.distributed as dist

    backend = dist.get_backend()
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    tables = tuple(_bench_collective(c, options, device=device) for c in options.collectives)
    return BenchResult(
        world_size=dist.get_world_size(), backend=backend, ranks=_rank_info(device), tables=tables
    )


def _default_backend(options: CommBenchOptions) -> str:
    import torch

    return options.backend or ("nccl" if torch.cuda.is_available() else "gloo")


def _worker(rank: int, world_size: int, port: int, options: CommBenchOptions, output: str) -> None:
    """One local process (``spawn_local``): join the group, run, rank 0 writes."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    _run_in_group(options, output, rank=rank, world_size=world_size)


def _run_in_group(options: CommBenchOptions, output: str, *, rank: int, world_size: int) -> None:
    import torch.distributed as dist

    warnings.filterwarnings("ignore", message=".*is deprecated", category=FutureWarning)
    dist.init_process_group(_default_backend(options), rank=rank, world_size=world_size)
    try:
        result = run_benchmark(options)
        if rank == 0:
            write_atomic(output, format_log(result, options))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def spawn_local(nproc: int, options: CommBenchOptions, output: str | Path) -> Path:
    """Run the benchmark on ``nproc`` local processes (torch.multiprocessing); returns the log."""
    import torch.multiprocessing as mp

    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    args = (nproc, _free_port(), options, str(output))
    # fork skips re-importing torch in every child (seconds each); safe because this parent
    # never initialises CUDA. Other platforms lack fork.
    method = "fork" if sys.platform == "linux" else "spawn"
    mp.start_processes(_worker, args=args, nprocs=nproc, join=True, start_method=method)
    return Path(output)


def torchrun_command(*, nnodes: int, nproc_per_node: int, output: str) -> str:
    """The command line to run this benchmark across nodes."""
    return (
        f"torchrun --nnodes {nnodes} --nproc-per-node {nproc_per_node} "
        "--rdzv-backend c10d --rdzv-endpoint HOST:29500 -m autopar.calibration.comm_bench "
        f"--output {output}"
    )


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m autopar.calibration.comm_bench", description=__doc__
    )
    parser.add_argument("--output", required=True)
    parser.add_argument("--min-bytes", type=int, default=1024)
    parser.add_argument("--max-bytes", type=int, default=1 << 26)
    parser.add_argument("--factor", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--backend", default=None)
    parser.add_argument("--nproc", type=int, default=1, help="local processes when not torchrun")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: under torchrun (``WORLD_SIZE`` set) join its group, else spawn ``--nproc``."""
    args = _parse_args(argv)
    options = CommBenchOptions(
        min_bytes=args.min_bytes,
        max_bytes=args.max_bytes,
        factor=args.factor,
        iters=args.iters,
        warmup=args.warmup,
        collectives=tuple(c for c in args.collectives.split(",") if c),
        backend=args.backend,
    )
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        _run_in_group(options, args.output, rank=rank, world_size=world)
    else:
        spawn_local(args.nproc, options, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
