"""A sweep survives its faults (issue 24, findings 1, 2, 4, 5, 7, 8, 9, 17): signals stop the
worker processes at once, workers die with their parent, a dead worker costs only its point,
finished points are written beside the output and marked partial, Dask scheduler errors are one
bounded line. The misbehaving points come from ``tests/fault_cost_model.py``."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

import autopar
from autopar.base.errors import InputError, Interrupted
from tests import fault_cost_model as faults
from tests.fuzz.processes import start, wait_for

SMALL = dict(model="llama-8b", global_batch=256, pp=1, num_workers=1)


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _running(pid: int) -> bool:
    """Alive and not a zombie (a dead child init has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_running(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


SLOW_SWEEP = ["sweep", "--model", "llama-8b", "--global-batch", "256", "--num-workers", "1",
              "--gpus", f"8,{faults.SLOW_GPUS},64,128", "--jobs", "2",
              "--cost-model", "tests.fault_cost_model:sleeping"]  # fmt: skip


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_workers_at_once_and_a_second_is_quiet(tmp_path, sig, code) -> None:
    """Findings 1, 2, 9: the workers solved every remaining point after a SIGTERM (39-109 s),
    a second signal printed a traceback and hung, and the partial output replaced the previous
    complete file with nothing saying it was partial."""
    (tmp_path / "out.json").write_text("previous\n")
    process = start([*SLOW_SWEEP, "-f", "json", "-o", "out.json"], tmp_path, own_group=True)
    seen = wait_for(process, "gpus=8 ")  # 8 GPUs done; a worker sleeps in the 32-GPU point
    workers = _children(process.pid)
    os.killpg(process.pid, sig)  # the whole group, as a terminal's Ctrl-C
    time.sleep(0.1)
    os.killpg(process.pid, sig)
    began = time.monotonic()
    _, stderr = process.communicate(timeout=30)
    assert time.monotonic() - began < 5.0
    # the second signal may come once the first is handled and Python has begun to exit (its
    # default dispositions are back then): killed by it, which a shell shows as the same code
    assert process.returncode in (code, -sig), "".join(seen) + stderr
    assert "Traceback" not in stderr
    assert workers and _gone_within(workers, 3.0)
    assert (tmp_path / "out.json").read_text() == "previous\n"
    partial = json.loads((tmp_path / "out.partial.json").read_text())
    assert partial["partial"] and "interrupted after" in partial["partial_reason"]
    statuses = {row["gpus"]: row["status"] for row in partial["rows"]}
    assert statuses[8] == "optimal" and statuses[faults.SLOW_GPUS] == "interrupted"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "out.partial.json"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_killing_the_main_process_kills_its_workers(tmp_path, sig) -> None:
    """Finding 4: ``kill -9`` (or SIGHUP) of a ``--jobs 2`` sweep left both workers running for
    ever."""
    process = start([*SLOW_SWEEP, "-f", "json"], tmp_path)
    wait_for(process, "gpus=8 ")
    workers = _children(process.pid)
    process.send_signal(sig)
    process.communicate(timeout=30)
    assert workers and _gone_within(workers, 3.0)


def test_a_killed_worker_costs_only_the_point_it_was_solving(tmp_path) -> None:
    """Finding 5: ``kill -9`` of one worker was exit 3 (``BrokenProcessPool``) and every
    finished row was thrown away. The 16-GPU point kills its worker each time it is tried."""
    (tmp_path / "out.json").write_text("previous\n")
    args = ["sweep", "--model", "llama-8b", "--global-batch", "256", "--num-workers", "1", "--gpus",
            f"8,{faults.KILL_GPUS},32", "--jobs", "2", "--cost-model",
            "tests.fault_cost_model:killing", "-f", "csv", "-o", "out.json"]  # fmt: skip
    process = start(args, tmp_path)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 4, stderr
    last = stderr.strip().splitlines()[-1]
    assert "1 of 3 points failed" in last and "signal 9" in last and "out.partial.json" in last
    assert (tmp_path / "out.json").read_text() == "previous\n"
    rows = (tmp_path / "out.partial.json").read_text().splitlines()[1:]
    assert [row.split(",")[:4] for row in rows] == [
        ["8", "h100-sxm", "4096", "optimal"],
        [str(faults.KILL_GPUS), "default", "4096", "failed"],
        ["32", "h100-sxm", "4096", "optimal"],
    ]


def _interrupt_after(count: int):
    """A progress callback that interrupts the sweep once ``count`` points are done."""

    def progress(done: int, total: int, row) -> None:
        if done >= count:
            raise KeyboardInterrupt

    return progress


@pytest.mark.parametrize("jobs", [1, 2])
def test_an_interrupt_keeps_the_finished_points_in_every_format(jobs) -> None:
    from autopar.cli.sweep_cmd import render_sweep

    with pytest.raises(Interrupted) as stop:
        autopar.sweep(**SMALL, gpus=[8, 16, 32], jobs=jobs, progress=_interrupt_after(1))
    partial = stop.value.partial
    assert partial.partial and partial.partial_reason == "interrupted after 1 of 3 points"
    assert sorted(row.status for row in partial.rows) == ["interrupted", "interrupted", "optimal"]
    if jobs > 1:
        return  # the formats read the same result
    assert json.loads(render_sweep(partial, "json"))["partial"] is True
    assert render_sweep(partial, "csv").count(",interrupted,") == 2
    assert "partial: interrupted after 1 of 3" in render_sweep(partial, "table")
    assert "Partial report: interrupted after 1 of 3" in render_sweep(partial, "html")


@pytest.fixture(scope="module")
def threads_cluster():
    from dask.distributed import LocalCluster

    with LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
    ) as cluster:
        yield cluster.scheduler_address


@pytest.mark.xdist_group("dask")  # one worker imports Dask (tests/conftest.py)
def test_dask_keeps_the_finished_points_when_interrupted(threads_cluster) -> None:
    """Finding 8: with ``--executor dask`` an interrupt wrote nothing."""
    with pytest.raises(Interrupted) as stop:
        autopar.sweep(
            **SMALL,
            gpus=[8, 16, 32],
            executor="dask",
            scheduler=threads_cluster,
            progress=_interrupt_after(1),
        )
    rows = stop.value.partial.rows
    assert sorted(row.status for row in rows) == ["interrupted", "interrupted", "optimal"]


@pytest.mark.xdist_group("dask")  # one worker imports Dask (tests/conftest.py)
def test_a_dask_task_whose_workers_died_is_a_failed_row(threads_cluster) -> None:
    """Finding 5 (Dask): ``KilledWorker`` once the retries ran out threw every row away."""
    result = autopar.sweep(
        **SMALL,
        gpus=[8, faults.KILL_GPUS, 32],
        executor="dask",
        scheduler=threads_cluster,
        cost_model="tests.fault_cost_model:dask_killed",
    )
    assert [row.status for row in result.rows] == ["optimal", "failed", "optimal"]
    assert result.partial and "KilledWorker" in result.rows[1].reason
    assert result.failed == (result.rows[1],)


class _Server:
    """A TCP server on a free local port that answers every connection with ``reply`` (or
    stays silent)."""

    def __init__(self, reply: bytes | None) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.held: list[socket.socket] = []
        self.reply = reply
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return
            self.held.append(conn)
            if self.reply is not None:
                conn.sendall(self.reply)

    def close(self) -> None:
        self.socket.close()
        for conn in self.held:
            conn.close()


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as server:
        return server.getsockname()[1]


@pytest.mark.xdist_group("dask")  # one worker imports Dask (tests/conftest.py)
@pytest.mark.parametrize(
    ("peer", "fragment"),
    [
        ("garbage", "not a scheduler address"),
        ("closed", "cannot connect (connection refused)"),
        ("silent", "no Dask scheduler answered within 0.5 s"),
        ("http", "the peer is not a Dask scheduler"),
        ("junk", "the peer is not a Dask scheduler"),
    ],
)
def test_a_bad_scheduler_is_one_line_within_the_timeout(monkeypatch, peer, fragment) -> None:
    """Finding 7: ``garbage`` was an internal error, a closed port ``OSError`` after 31 s, an
    HTTP server a hang of minutes, a peer sending junk "out of memory"."""
    from typer.testing import CliRunner

    from autopar.cli import app
    from autopar.sweeps import dask_run

    monkeypatch.setattr(dask_run, "SCHEDULER_TIMEOUT_S", 0.5)
    replies = {"silent": None, "http": b"HTTP/1.0 400 Bad Request\r\n", "junk": b"\xff" * 64}
    server = _Server(replies[peer]) if peer in replies else None
    address = {
        "garbage": "garbage",
        "closed": f"tcp://127.0.0.1:{_closed_port()}",
    }.get(peer) or f"tcp://127.0.0.1:{server.port}"
    began = time.monotonic()
    try:
        args = ["sweep", "--model", "llama-8b", "--gpus", "8", "--executor", "dask"]
        result = CliRunner().invoke(app, [*args, "--scheduler", address])
    finally:
        if server is not None:
            server.close()
    assert time.monotonic() - began < 5.0
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--scheduler {address}" in lines[0] and fragment in lines[0]


def test_the_sweeps_time_limit_covers_the_whole_sweep() -> None:
    """Finding 17: ``--time-limit`` applied to each point while the README says it covers the
    whole command; ``--point-time-limit`` is now each point's."""
    result = autopar.sweep(**SMALL, gpus=[8, 16, 32, 64], time_limit=0.0)
    assert result.cut_short and [row.status for row in result.rows] == ["unknown"] * 4
    assert all("time-limit" in row.reason for row in result.rows)
    points = autopar.sweep(**SMALL, gpus=[8, 16], time_limit=60.0, point_time_limit=5.0)
    assert not points.cut_short and {row.status for row in points.rows} == {"optimal"}


def test_the_cli_sweep_reports_what_its_time_limit_cut_short(runner) -> None:
    from autopar.cli import app

    result = runner.invoke(
        app, ["sweep", "--model", "llama-8b", "--gpus", "8,16", "--time-limit", "0", "-f", "json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["cut_short"] and not data["partial"]


@pytest.mark.xdist_group("dask")  # one worker imports Dask (tests/conftest.py)
def test_bad_scheduler_addresses_from_the_api_are_input_errors(monkeypatch) -> None:
    from autopar.sweeps import dask_run

    monkeypatch.setattr(dask_run, "SCHEDULER_TIMEOUT_S", 0.5)
    with pytest.raises(InputError, match="--scheduler"):
        autopar.sweep(**SMALL, gpus=[8], executor="dask", scheduler="tcp://[::1]:x")
