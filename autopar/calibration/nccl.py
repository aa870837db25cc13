"""nccl-tests output -> one pandas row per measured message size.

Columns and units follow nccl-tests (``doc/PERFORMANCE.md`` and ``src/common.cu`` of
https://github.com/NVIDIA/nccl-tests): ``size`` in bytes, ``time`` in microseconds, ``algbw`` and
``busbw`` in GB/s (1e9 bytes/s), each printed out-of-place then in-place. The variants handled
(``data/nccl-tests/SOURCES.md``, DESIGN section 5):

- pre-2.13 per-collective headers without ``root`` and with an ``error`` column (all_gather has no
  ``redop`` column; alltoall prints ``redop`` in the header but leaves the field empty in rows);
- the common 2.13+ header ``size count type redop root time algbw busbw #wrong ...``;
- ``Rank N [Group G] Pid P on HOST device D [BUS] NAME`` lines, from which ranks, hosts and the GPU
  name are read;
- ``# nccl-tests version`` and ``# Collective test starting: <prog>`` lines;
- launcher prefixes (``[1,0]<stdout>:`` from mpirun --tag-output, `` 0: `` from srun -l);
- interleaved ``NCCL INFO``/``NCCL WARN`` lines, ``NCCL version`` lines, Open MPI help lines;
- ``N/A`` in measured columns (read as NaN).

The collective is never guessed: it comes from the caller, the ``Collective test starting`` line or
the file name (``a100_2n8g_all_reduce_<source>.log``), and the printed busbw/algbw ratio must agree
with the bus-bandwidth factor of that collective at the log's rank count.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from autopar.base.errors import InputError, excerpt
from autopar.base.files import printable
from autopar.costs.comm import COLLECTIVES, bus_bandwidth_factor
from autopar.inputs.safe_yaml import read_text

COLUMNS: tuple[str, ...] = (
    "collective",
    "num_ranks",
    "num_nodes",
    "gpu",
    "size_bytes",
    "count",
    "dtype",
    "redop",
    "time_us_out",
    "algbw_gb_per_s_out",
    "busbw_gb_per_s_out",
    "time_us_in",
    "algbw_gb_per_s_in",
    "busbw_gb_per_s_in",
    "source",
)

# nccl-tests program / file-name spellings -> autopar collective names (autopar/costs/comm.py).
COLLECTIVE_ALIASES: dict[str, str] = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "all_gather": "all_gather",
    "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reducescatter": "reduce_scatter",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "sendrecv": "send_recv",
    "send_recv": "send_recv",
}
# nccl-tests programs autopar has no use for: named so the error says "unsupported", not "unknown".
UNSUPPORTED_COLLECTIVES: tuple[str, ...] = (
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "hypercube",
)

_PREFIX_RE = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\s{0,4}\d+: ?)")
_RANK_RE = re.compile(
    r"^#\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(?P<host>\S+)\s+"
    r"device\s+\d+\s+\[[^\]]*\]\s+(?P<gpu>.+?)\s*$"
)
_STARTING_RE = re.compile(r"^#\s*Collective test starting:\s*(?P<prog>\S+)")
_NAME_RE = re.compile(r"(?P<nodes>\d+)n(?P<gpus>\d+)g")
_NOISE_RE = re.compile(r"NCCL (?:INFO|WARN)|^NCCL version|^\[[^\]\s]+:\d+\]")
_FOOTER_RE = re.compile(r"^#\s*(?:Avg bus bandwidth|Out of bounds values)")
_MEASURED = ("time", "algbw", "busbw", "wrong")
_MIN_ALGBW_FOR_RATIO_GB_PER_S = (
    1.0  # algbw is printed with 2 decimals: below 1 GB/s the ratio is noise
)
_RATIO_TOLERANCE = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class _Header:
    keys: tuple[str, ...]
    """Leading columns before the first ``time``: size, count, type, [redop], [root]."""
    text: str
    """The header as printed, for error messages."""

    @property
    def num_columns(self) -> int:
        return len(self.keys) + 2 * len(_MEASURED)


def canonical_collective(name: str, *, source: str | None = None) -> str:
    """Map ``all_reduce_perf``, ``alltoall``, ``sendrecv`` ... to an autopar collective name."""
    key = name.strip().lower().removesuffix("_perf").removesuffix("_mpi")
    if key in COLLECTIVE_ALIASES:
        return COLLECTIVE_ALIASES[key]
    if key in UNSUPPORTED_COLLECTIVES:
        raise InputError(
            f"collective {name!r} is not supported; supported: {', '.join(COLLECTIVES)}",
            source=source,
        )
    raise InputError(
        f"unknown collective {name!r}; expected one of {', '.join(COLLECTIVES)}", source=source
    )


def collective_from_file_name(name: str) -> str | None:
    """The collective named in a file name such as ``a100_2n8g_all_reduce_abci.log``, or None."""
    stem = Path(name).name.lower()
    found = {
        c for alias, c in COLLECTIVE_ALIASES.items() if re.search(rf"(^|_){alias}(_|\.|$)", stem)
    }
    if len(found) > 1:
        raise InputError(f"file name names several collectives: {sorted(found)}", source=name)
    if found:
        return found.pop()
    for other in UNSUPPORTED_COLLECTIVES:
        if re.search(rf"(^|_){other}(_|\.|$)", stem):
            canonical_collective(other, source=name)
    return None


def ranks_from_file_name(name: str) -> tuple[int, int] | None:
    """``(num_nodes, gpus_per_node)`` from the ``<N>n<G>g`` token of a file name, or None."""
    match = _NAME_RE.search(Path(name).name.lower())
    return (int(match["nodes"]), int(match["gpus"])) if match else None


def gpu_from_file_name(name: str) -> str | None:
    """The GPU token that starts a file name (``a100_...`` -> ``A100``), or None."""
    match = re.match(r"^([a-z]\d{2,4}[a-z]*)_", Path(name).name.lower())
    return match.group(1).upper() if match else None


def _strip(line: str) -> str:
    return _PREFIX_RE.sub("", line.rstrip("\r\n"), count=1)


def _parse_header(body: str) -> _Header | None:
    tokens = body.lstrip("#").split()
    if not tokens or tokens[0] != "size" or "time" not in tokens:
        return None
    keys = tuple(tokens[: tokens.index("time")])
    if keys[:3] != ("size", "count", "type") or len(tokens) != len(keys) + 8:
        return None
    return _Header(keys=keys, text=" ".join(tokens))


MAX_LOG_BYTES = 64 << 20
"""An nccl-tests log is a few KB to a few MB; 64 MiB bounds what is read."""
MAX_LOG_ROWS = 20_000
"""Table rows per log (a doubling sweep from 8 B to 16 GiB is 32 rows per collective)."""
MAX_SIZE_BYTES = float(1 << 50)
"""Message sizes and counts above 1 PiB are not a measurement."""
MAX_RANKS = 1 << 20
"""Same bound as ``--gpus``."""


def _number(token: str, *, column: str, where: str) -> float:
    """A measured value: finite and non-negative, or NaN for ``N/A``."""
    if token == "N/A":
        return math.nan
    try:
        value = float(token)
    except ValueError:
        raise InputError(
            f"column {column!r}: expected a number, got {excerpt(token)}", source=where
        ) from None
    if not (math.isfinite(value) and value >= 0):
        raise InputError(
            f"column {column!r}: expected a finite non-negative number, got {excerpt(token)}",
            source=where,
        )
    return value


def _size(token: str, *, column: str, where: str) -> int:
    """``size`` / ``count``: a whole number of bytes or elements, at most ``MAX_SIZE_BYTES``."""
    value = _number(token, column=column, where=where)
    if math.isnan(value) or not value.is_integer() or value > MAX_SIZE_BYTES:
        raise InputError(
            f"column {column!r}: expected a whole number <= 2**50, got {excerpt(token)}",
            source=where,
        )
    return int(value)


def _parse_row(tokens: list[str], header: _Header, *, where: str) -> dict[str, object]:
    """One table row. alltoall before 2.13 prints ``redop`` in the header but not in rows."""
    prefix = tokens[: len(tokens) - 8]
    keys = header.keys
    if len(tokens) == header.num_columns - 1 and "redop" in keys and len(prefix) == len(keys) - 1:
        prefix.insert(keys.index("redop"), "")
    if len(tokens) < 8 or len(prefix) != len(keys):
        raise InputError(
            f"expected {header.num_columns} columns ({header.text}), got {len(tokens)}",
            source=where,
        )
    lead = dict(zip(keys, prefix, strict=True))
    row: dict[str, object] = {
        "size_bytes": _size(lead["size"], column="size", where=where),
        "count": _size(lead["count"], column="count", where=where),
        "dtype": lead["type"],
        "redop": lead.get("redop") or None,
    }
    for half, values in (("out", tokens[-8:-4]), ("in", tokens[-4:])):
        for name, token in zip(_MEASURED[:3], values[:3], strict=True):
            unit = "time_us" if name == "time" else f"{name}_gb_per_s"
            row[f"{unit}_{half}"] = _number(token, column=f"{name} ({half}-of-place)", where=where)
    return row


@dataclass(frozen=True, slots=True, kw_only=True)
class _Scan:
    rows: tuple[dict[str, object], ...]
    hosts_by_rank: dict[int, str]
    gpu_names: tuple[str, ...]
    programs: tuple[str | None, ...]
    """Per row: the program of the last ``# Collective test starting`` line before it."""


def _scan(lines: Sequence[str], *, source: str) -> _Scan:
    """Walk the log once: Rank lines, the program name, header lines and table rows."""
    rows: list[dict[str, object]] = []
    hosts: dict[int, str] = {}
    gpus: list[str] = []
    program: str | None = None
    programs: list[str | None] = []
    header: _Header | None = None
    last_header_line = 0
    for lineno, raw in enumerate(lines, start=1):
        text = _strip(raw).strip()
        if not text or _NOISE_RE.search(text):
            continue
        if rank := _RANK_RE.match(text):
            hosts[int(rank["rank"])] = rank["host"]
            gpus.append(rank["gpu"].removeprefix("NVIDIA "))
        elif starting := _STARTING_RE.match(text):
            program = starting["prog"]
        elif text.startswith("#"):
            if parsed := _parse_header(text):
                header, last_header_line = parsed, lineno
            elif _FOOTER_RE.match(text):
                header = None
        elif header is not None:
            rows.append(_parse_row(text.split(), header, where=f"{source}: line {lineno}"))
            programs.append(program)
            if len(rows) > MAX_LOG_ROWS:
                raise InputError(f"more than {MAX_LOG_ROWS:,} table rows", source=source)
    if last_header_line == 0:
        raise InputError(
            "no nccl-tests table header ('#  size  count  type ...') found", source=source
        )
    if header is not None:
        raise InputError(
            f"truncated: the table started at line {last_header_line} has no "
            "'# Avg bus bandwidth' footer",
            source=source,
        )
    if not rows:
        raise InputError(f"the table at line {last_header_line} has no rows", source=source)
    return _Scan(
        rows=tuple(rows), hosts_by_rank=hosts, gpu_names=tuple(gpus), programs=tuple(programs)
    )


def _resolve_collective(
    program: str | None, *, source: str, collective: str | None
) -> tuple[str, str]:
    """(collective, where it came from). Sources that disagree are an error, never a guess."""
    named = {
        "caller": canonical_collective(collective, source=source) if collective else None,
        "'# Collective test starting' line": (
            canonical_collective(program, source=source) if program else None
        ),
        "file name": collective_from_file_name(source),
    }
    found = {origin: name for origin, name in named.items() if name}
    if not found:
        raise InputError(
            "cannot determine the collective: no '# Collective test starting' line and the file "
            f"name names none of {', '.join(COLLECTIVE_ALIASES)}; pass it explicitly",
            source=source,
        )
    if len(set(found.values())) > 1:
        raise InputError(f"conflicting collectives: {found}", source=source)
    origin, name = next(iter(found.items()))
    return name, origin


def _ranks_from_ratio(collective: str, ratio: float) -> int | None:
    """Invert busbw/algbw = f(n) (nccl-tests doc/PERFORMANCE.md); None when f carries no n."""
    if collective == "send_recv":
        return None
    scale = 2.0 if collective == "all_reduce" else 1.0
    if ratio >= scale * 0.999:
        return None
    return round(scale / (scale - ratio))


def _printed_ratio(rows: Sequence[dict[str, object]]) -> float | None:
    """Median busbw/algbw over rows whose algbw has enough printed digits."""
    ratios = [
        float(r["busbw_gb_per_s_out"]) / float(r["algbw_gb_per_s_out"])
        for r in rows
        if float(r["algbw_gb_per_s_out"]) >= _MIN_ALGBW_FOR_RATIO_GB_PER_S
    ]
    return float(np.median(ratios)) if ratios else None


def _resolve_ranks(
    scan: _Scan,
    *,
    source: str,
    collective: str,
    num_ranks: int | None,
    num_nodes: int | None,
    gpus_per_node: int | None,
) -> tuple[int, int, str]:
    """(num_ranks, num_nodes, where they came from): Rank lines, caller, file name, busbw ratio."""
    if scan.hosts_by_rank:
        found = (len(scan.hosts_by_rank), len(set(scan.hosts_by_rank.values())))
        if (num_ranks or found[0], num_nodes or found[1]) != found:
            raise InputError(
                f"the Rank lines say {found[0]} ranks on {found[1]} nodes, the caller says "
                f"{num_ranks} ranks on {num_nodes} nodes",
                source=source,
            )
        return found[0], found[1], "Rank lines"
    if num_ranks and num_nodes:
        return num_ranks, num_nodes, "caller"
    if from_name := ranks_from_file_name(source):
        return from_name[0] * from_name[1], from_name[0], "file name (<N>n<G>g), no Rank lines"
    ratio = _printed_ratio(scan.rows)
    inferred = num_ranks or (_ranks_from_ratio(collective, ratio) if ratio else None)
    if inferred and gpus_per_node:
        nodes = num_nodes or -(-inferred // gpus_per_node)
        return inferred, nodes, f"busbw/algbw ratio and --gpus-per-node {gpus_per_node}"
    raise InputError(
        "cannot determine ranks and nodes: the log has no Rank lines and the file name no "
        "<N>n<G>g token; pass num_ranks and num_nodes (or gpus_per_node)",
        source=source,
    )


def _check_ratio(scan: _Scan, *, source: str, collective: str, num_ranks: int) -> None:
    """busbw/algbw must equal f(n) of the collective (nccl-tests doc/PERFORMANCE.md)."""
    ratio = _printed_ratio(scan.rows)
    expected = float(bus_bandwidth_factor(collective, num_ranks))
    if ratio is not None and abs(ratio / expected - 1.0) > _RATIO_TOLERANCE:
        raise InputError(
            f"busbw/algbw = {ratio:.3f} but {collective} on {num_ranks} ranks has f(n) = "
            f"{expected:.3f}: wrong collective or rank count",
            source=source,
        )


def parse_nccl_text(
    text: str,
    *,
    source: str,
    collective: str | None = None,
    num_ranks: int | None = None,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    gpu: str | None = None,
) -> pd.DataFrame:
    """Parse one nccl-tests output. ``source`` is the file name (used for the naming convention
    and in errors). ``df.attrs["notes"]`` says where collective, ranks and GPU came from."""
    if not text.strip():
        raise InputError("empty nccl-tests log", source=source)
    scan = _scan(text.splitlines(), source=source)
    frames, notes = [], []
    for program in dict.fromkeys(scan.programs):
        rows = tuple(r for r, p in zip(scan.rows, scan.programs, strict=True) if p == program)
        section = _Scan(
            rows=rows,
            hosts_by_rank=scan.hosts_by_rank,
            gpu_names=scan.gpu_names,
            programs=(program,) * len(rows),
        )
        frame, section_notes = _section_frame(
            section,
            source=source,
            collective=collective,
            num_ranks=num_ranks,
            num_nodes=num_nodes,
            gpus_per_node=gpus_per_node,
            gpu=gpu,
        )
        frames.append(frame)
        notes.extend(n for n in section_notes if n not in notes)
    combined = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    combined.attrs["notes"] = tuple(notes)
    return combined


def _section_frame(
    scan: _Scan,
    *,
    source: str,
    collective: str | None,
    num_ranks: int | None,
    num_nodes: int | None,
    gpus_per_node: int | None,
    gpu: str | None,
) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """Rows of one ``# Collective test starting`` section (the whole log for older versions)."""
    name, name_origin = _resolve_collective(scan.programs[0], source=source, collective=collective)
    ranks, nodes, rank_origin = _resolve_ranks(
        scan,
        source=source,
        collective=name,
        num_ranks=num_ranks,
        num_nodes=num_nodes,
        gpus_per_node=gpus_per_node,
    )
    if not (2 <= ranks <= MAX_RANKS and 1 <= nodes <= ranks):
        raise InputError(
            f"{ranks} ranks on {nodes} nodes: a collective log needs 2..{MAX_RANKS:,} ranks on "
            "at most as many nodes (one rank measures no communication)",
            source=source,
        )
    _check_ratio(scan, source=source, collective=name, num_ranks=ranks)
    gpu_name, gpu_origin = _resolve_gpu(scan, source=source, gpu=gpu)
    frame = pd.DataFrame(list(scan.rows)).assign(
        collective=name, num_ranks=ranks, num_nodes=nodes, gpu=gpu_name, source=source
    )
    notes = (
        f"{name} from {name_origin}",
        f"{ranks} ranks on {nodes} nodes from {rank_origin}",
        f"gpu from {gpu_origin}",
    )
    return frame[list(COLUMNS)], notes


def _resolve_gpu(scan: _Scan, *, source: str, gpu: str | None) -> tuple[str | None, str]:
    if scan.gpu_names:
        return scan.gpu_names[0], "Rank lines"
    if gpu:
        return gpu, "caller"
    from_name = gpu_from_file_name(source)
    return from_name, "file name" if from_name else "nowhere (unknown)"


def parse_nccl_log(
    path: str | Path,
    *,
    collective: str | None = None,
    num_ranks: int | None = None,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    gpu: str | None = None,
) -> pd.DataFrame:
    """Read and parse one nccl-tests log file (see ``parse_nccl_text``)."""
    path = Path(path)
    text = read_text(path, max_bytes=MAX_LOG_BYTES, errors="replace")
    return parse_nccl_text(
        text,
        source=printable(str(path)),  # a name that is not UTF-8 holds surrogates
        collective=collective,
        num_ranks=num_ranks,
        num_nodes=num_nodes,
        gpus_per_node=gpus_per_node,
        gpu=gpu,
    )


def read_nccl_logs(
    paths: Iterable[str | Path], *, gpus_per_node: int | None = None, gpu: str | None = None
) -> pd.DataFrame:
    """Parse several logs into one frame (columns ``COLUMNS``); notes keyed by source."""
    frames = [parse_nccl_log(p, gpus_per_node=gpus_per_node, gpu=gpu) for p in paths]
    if not frames:
        raise InputError("no nccl-tests logs given")
    combined = pd.concat(frames, ignore_index=True)
    combined.attrs["notes"] = {f["source"].iat[0]: f.attrs["notes"] for f in frames}
    return combined
