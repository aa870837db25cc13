"""A sweep's points on a Dask cluster (``executor="dask"``, ``pip install 'autopar[dask]'``):
a local cluster of ``jobs`` worker processes, or the scheduler at ``--scheduler``.

The scheduler is checked first, within ``SCHEDULER_TIMEOUT_S`` (issue 24, finding 7: a bad
address was an internal error, a closed port an ``OSError`` after 31 s, an HTTP server a hang of
minutes, a peer sending junk "out of memory"): the address must parse
(``distributed.comm.addressing``), a TCP connection must open, and the peer must answer Dask's
``identity`` call as a scheduler (``distributed.core.rpc``), each bounded. ``Client(address,
timeout=...)`` bounds the connection only, not the reply; the probe runs in a thread of its
own, so it works where an event loop is already running (Jupyter).

A point whose task fails (``KilledWorker`` once Dask's retries are spent,
``distributed.scheduler.allowed-failures``) is a ``Lost`` with the reason and the other points
go on; Ctrl-C or SIGTERM cancels what is queued and propagates with the finished points kept
by the caller. A local cluster logs only critical messages (``silence_logs``): its warnings
about cancelled tasks used to follow every interrupt.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from autopar.base.errors import InputError, shorten
from autopar.sweeps.workers import Lost

SCHEDULER_TIMEOUT_S = 10.0
"""How long each step of reaching a scheduler may take (connect; answer)."""
CLOSE_TIMEOUT_S = 2.0
"""How long closing the client and a local cluster may take (after an interrupt too)."""
EXTRA_HINT = "pip install 'autopar[dask]'"


def _scheduler_error(address: str, rule: str) -> InputError:
    return InputError(rule, source=f"--scheduler {shorten(address, 120)}")


def _identity(address: str, timeout_s: float) -> dict[str, Any]:
    """The peer's answer to Dask's ``identity`` call, in a thread with its own event loop."""
    import asyncio

    from distributed.core import rpc

    async def ask() -> Any:
        async with rpc(address, timeout=timeout_s) as peer:
            return await peer.identity()

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["answer"] = asyncio.run(asyncio.wait_for(ask(), timeout_s))
        except BaseException as err:  # re-raised in the caller's thread (MemoryError included)
            outcome["error"] = err

    thread = threading.Thread(target=run, name="dask-probe", daemon=True)
    thread.start()
    thread.join(timeout_s + 1.0)
    if thread.is_alive():
        raise TimeoutError()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["answer"]


def check_scheduler(address: str, *, timeout_s: float | None = None) -> None:
    """Raise ``InputError`` naming ``--scheduler`` unless a Dask scheduler answers at
    ``address`` within ``timeout_s`` per step (default ``SCHEDULER_TIMEOUT_S``; module
    docstring)."""
    from distributed.comm.addressing import get_address_host_port, parse_address

    timeout_s = SCHEDULER_TIMEOUT_S if timeout_s is None else timeout_s
    if not isinstance(address, str) or not address.strip():
        raise _scheduler_error(str(address), "must be a scheduler address such as tcp://HOST:8786")
    try:
        scheme, _ = parse_address(address)
        host, port = get_address_host_port(address) if scheme in ("tcp", "tls") else (None, 0)
    except ValueError as err:
        rule = f"not a scheduler address ({shorten(err, 80)}); give tcp://HOST:PORT"
        raise _scheduler_error(address, rule) from None
    if host is not None:
        try:
            socket.create_connection((host or "127.0.0.1", port), timeout=timeout_s).close()
        except TimeoutError:
            rule = f"no connection within {timeout_s:g} s"
            raise _scheduler_error(address, rule) from None
        except OSError as err:
            reason = (err.strerror or type(err).__name__).lower()
            raise _scheduler_error(address, f"cannot connect ({reason})") from None
    try:
        answer = _identity(address, timeout_s)
    except TimeoutError:
        rule = f"no Dask scheduler answered within {timeout_s:g} s (something else listens there?)"
        raise _scheduler_error(address, rule) from None
    except (Exception, MemoryError) as err:
        rule = f"the peer is not a Dask scheduler ({type(err).__name__}: {shorten(err, 80)})"
        raise _scheduler_error(address, rule) from None
    kind = answer.get("type") if isinstance(answer, dict) else None
    if kind != "Scheduler":
        raise _scheduler_error(address, f"the peer is not a Dask scheduler (it is {kind!r})")


def _lost(err: BaseException) -> Lost:
    text = f"{type(err).__name__}: {shorten(err, 160)}"
    if type(err).__name__ == "KilledWorker":
        return Lost(f"its Dask worker died each time it ran it ({text})")
    return Lost(text)


def _stop_local(cluster: Any, spawned: Callable[[], list[Any]]) -> None:
    """Close a local cluster at once: its close is started (the nannies then stop restarting
    workers that die), the worker processes it started (``spawned()``) are killed (a worker in
    the middle of a solve kept ``close`` waiting past its timeout, and then distributed's own
    atexit ``close_clusters`` waited again: 13 s after a Ctrl-C), and the close is waited for,
    bounded."""
    closer = threading.Thread(
        target=lambda: _quietly(cluster.close, timeout=CLOSE_TIMEOUT_S), daemon=True
    )
    closer.start()
    deadline = time.monotonic() + CLOSE_TIMEOUT_S
    while time.monotonic() < deadline and any(
        nanny.status.name not in CLOSING for nanny in list(cluster.workers.values())
    ):
        time.sleep(0.02)
    for process in spawned():
        with contextlib.suppress(OSError, ValueError):
            process.kill()
            process.join(CLOSE_TIMEOUT_S)
    closer.join(CLOSE_TIMEOUT_S)


CLOSING = ("closing", "closed", "closing_gracefully", "failed")
"""A nanny in these states no longer restarts a worker that dies (distributed/nanny.py,
``Nanny._on_worker_exit``)."""


def _quietly(close: Callable[..., Any], **options: Any) -> None:
    with contextlib.suppress(Exception):
        close(**options)


def _close(client: Any, cluster: Any, spawned: Callable[[], list[Any]]) -> None:
    """Close the client, then the local cluster (``_stop_local``), each bounded; an interrupt
    meanwhile is held until all is closed, then propagates."""
    held: BaseException | None = None
    for step in (client, cluster):
        try:
            if step is cluster and cluster is not None:
                _stop_local(cluster, spawned)
            elif step is not None:
                _quietly(step.close, timeout=CLOSE_TIMEOUT_S)
        except KeyboardInterrupt as err:
            held = err
    if held is not None:
        raise held


def run_dask(
    jobs: Sequence[Any],
    work: Callable[[Any], Any],
    *,
    workers: int,
    scheduler: str | None,
    done: Callable[[int, Any], None],
) -> None:
    """``work(job)`` for every job on the cluster; ``done(index, value)`` as each finishes,
    ``value`` a ``Lost`` when its task failed."""
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise InputError(f"needs Dask: {EXTRA_HINT}", source="--executor dask") from None
    if scheduler is not None:
        check_scheduler(scheduler)
    before = {process.pid for process in multiprocessing.active_children()}

    def spawned() -> list[Any]:  # the local cluster's worker processes, none of the caller's
        return [p for p in multiprocessing.active_children() if p.pid not in before]

    cluster = client = futures = None
    try:
        if scheduler is None:
            cluster = LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.CRITICAL,
            )
        client = Client(cluster if cluster is not None else scheduler, timeout=SCHEDULER_TIMEOUT_S)
        futures = client.map(work, list(jobs), pure=False)
        index = {future.key: i for i, future in enumerate(futures)}
        for future in as_completed(futures):
            try:
                value = future.result()
            except Exception as err:  # KilledWorker, or the task raised
                value = _lost(err)
            done(index[future.key], value)
    except KeyboardInterrupt:
        if client is not None and futures:
            with contextlib.suppress(Exception):
                client.cancel(futures)
        raise
    finally:
        _close(client, cluster, spawned if cluster is not None else list)
