"""Worker processes that solve a sweep's points (issue 24): stopped at once by Ctrl-C or SIGTERM,
dying with their parent, and a dead worker costs only the point it was solving.

``concurrent.futures.ProcessPoolExecutor`` did none of it: leaving its context calls
``shutdown(wait=True)``, which (CPython 3.11 ``concurrent/futures/process.py``) resets the
``cancel_futures`` an interrupt had asked for and waits for every queued point (39-109 s after a
SIGTERM); a second signal raised inside its atexit join (a traceback, then a hang); its workers
outlived a parent killed by SIGKILL; and one killed worker broke the pool (``BrokenProcessPool``
for every point, the finished ones thrown away).

Here each worker is a ``multiprocessing`` process with one pipe. The parent hands out one job at
a time and waits on the pipes and the process sentinels (``multiprocessing.connection.wait``),
so it sees both an answer and a death. A worker:

- ignores SIGINT (a terminal's Ctrl-C reaches the whole process group; the parent decides) and
  dies quietly on SIGTERM (the default action);
- is killed by the kernel when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``,
  ``linux/prctl.h``); elsewhere a thread watches the parent's pid;
- starts with SIGINT and SIGTERM blocked (the parent blocks them around ``start()`` and the child
  inherits the mask), so no signal lands before its handlers are set.

A job whose worker dies is tried once more in a fresh worker (``ATTEMPTS``, as Dask retries a
task whose worker died); a second death makes it a ``Lost`` with the reason. On an interrupt the
workers are killed at once (the points they were solving are given up), a second signal meanwhile
is held until they are gone, and the interrupt propagates.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

ATTEMPTS = 2
"""Tries per job: a job whose worker died is run once more in a fresh worker."""
PR_SET_PDEATHSIG = 1
"""``linux/prctl.h``: the signal the kernel sends a process when its parent exits."""
PARENT_POLL_S = 0.5
"""Off Linux, how often a worker checks that its parent is alive."""
_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@dataclass(frozen=True, slots=True)
class Lost:
    """A job without a result: ``reason`` says why (its worker died, or it raised)."""

    reason: str


def _die_with_parent() -> None:
    """This process ends when its parent does (module docstring)."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)
            return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _send(conn: Connection, item: Any) -> None:
    """``item`` down the pipe as plain bytes. Not ``Connection.send``: it pickles into a
    ``BytesIO`` and sends a ``memoryview`` of it (``multiprocessing/reduction.py``
    ``ForkingPickler.dumps``, ``recv`` likewise loads from ``getbuffer()``), and a SIGTERM
    raised meanwhile leaves both in the traceback's frames; CPython 3.12's garbage collector then
    frees the ``BytesIO`` before its export at exit ("SystemError: deallocated BytesIO object has
    exported buffers", then a segfault instead of exit 143: cpython issues 111211, 111331)."""
    conn.send_bytes(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection) -> Any:
    """One item from the pipe (``_send`` says why not ``Connection.recv``)."""
    return pickle.loads(conn.recv_bytes())


def _serve(conn: Connection, work: Callable[[Any], Any]) -> None:
    """A worker's life: its signal dispositions, then ``work`` on each job the parent sends,
    until the pipe closes or it sends None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    _die_with_parent()
    while True:
        try:
            item = _recv(conn)
        except (EOFError, OSError):
            return
        if item is None:
            return
        index, job = item
        try:
            value = work(job)
        except Exception as err:  # a bug in one job: its result says so, the others go on
            text = " ".join(str(err).split())[:200]
            value = Lost(f"internal error (please report): {type(err).__name__}: {text}")
        _send(conn, (index, value))


@dataclass(slots=True)
class _Worker:
    process: Any
    conn: Connection
    index: int | None = None
    """The job it is solving."""


def _spawn(context: Any, work: Callable[[Any], Any]) -> _Worker:
    """A new worker; the caller blocks SIGINT and SIGTERM around it (module docstring)."""
    parent_end, child_end = context.Pipe()
    process = context.Process(target=_serve, args=(child_end, work), daemon=True)
    process.start()
    child_end.close()
    return _Worker(process, parent_end)


def _stop(workers: Sequence[_Worker]) -> None:
    """Kill and reap every worker; a Ctrl-C or SIGTERM meanwhile waits until they are gone (a
    few milliseconds), then propagates."""
    held: BaseException | None = None
    for worker in workers:
        while True:
            try:
                with contextlib.suppress(OSError, ValueError):
                    worker.process.kill()
                worker.process.join()
                worker.conn.close()
                break
            except KeyboardInterrupt as err:
                held = err
    if held is not None:
        raise held


def _death(worker: _Worker) -> str:
    worker.process.join(1.0)
    code = worker.process.exitcode
    if code is not None and code < 0:
        return f"its worker process died (signal {-code}, {signal.Signals(-code).name})"
    return f"its worker process died (exit code {code})"


class _Pool:
    """The workers and the jobs not yet answered."""

    def __init__(self, jobs: Sequence[Any], work: Callable[[Any], Any]) -> None:
        self.jobs, self.work = jobs, work
        self.context = multiprocessing.get_context()
        self.queue = deque(range(len(jobs)))
        self.tries = [0] * len(jobs)
        self.workers: list[_Worker] = []

    def start(self, position: int | None = None) -> None:
        """A new worker, appended or in place of the one at ``position``. A signal that comes
        meanwhile is delivered once the worker is recorded (so it is stopped with the rest)."""
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            worker = _spawn(self.context, self.work)
            if position is None:
                self.workers.append(worker)
            else:
                self.workers[position] = worker
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def busy(self) -> list[_Worker]:
        return [w for w in self.workers if w.index is not None]

    def hand_out(self) -> None:
        for position, worker in enumerate(self.workers):
            if worker.index is not None or not self.queue:
                continue
            index = self.queue.popleft()
            try:
                _send(worker.conn, (index, self.jobs[index]))
            except OSError:  # it died idle: a fresh worker takes the job
                self.queue.appendleft(index)
                self.replace(position)
                continue
            worker.index = index
            self.tries[index] += 1

    def replace(self, position: int) -> None:
        _stop([self.workers[position]])
        self.start(position)

    def collect(self, done: Callable[[int, Any], None], attempts: int) -> None:
        """Wait for an answer or a death, and take every one that is there."""
        busy = self.busy()
        ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy]))
        for position, worker in enumerate(self.workers):
            if worker.index is None or not {worker.conn, worker.process.sentinel} & ready:
                continue
            index, worker.index = worker.index, None
            with contextlib.suppress(EOFError, OSError):
                if worker.conn.poll():
                    done(index, _recv(worker.conn)[1])
                    continue
            reason = _death(worker)  # no answer: the process died on this job
            self.replace(position)
            if self.tries[index] < attempts:
                self.queue.appendleft(index)
            else:
                done(index, Lost(reason))


def run_pool(
    jobs: Sequence[Any],
    work: Callable[[Any], Any],
    *,
    workers: int,
    done: Callable[[int, Any], None],
    attempts: int = ATTEMPTS,
) -> None:
    """``work(job)`` for every job, in at most ``workers`` processes; ``done(index, value)`` as
    each finishes, ``value`` a ``Lost`` when its worker died ``attempts`` times (or ``work``
    raised). Ctrl-C or SIGTERM (a ``KeyboardInterrupt``) kills the workers and propagates."""
    pool = _Pool(jobs, work)
    try:
        for _ in range(max(1, min(workers, len(jobs)))):
            pool.start()
        while pool.queue or pool.busy():
            pool.hand_out()
            pool.collect(done, attempts)
    finally:
        _stop(pool.workers)
