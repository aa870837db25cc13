"""The default cost model plus one term that misbehaves at one GPU count, inside a worker
process only (never in the process running the tests): for the sweep fault tests (issue 24);
and one that stalls a command's own solve, for the signal tests (issue 15).

``--cost-model tests.fault_cost_model:killing``: a point of ``KILL_GPUS`` GPUs kills the worker
solving it (SIGKILL), every time; ``tests.fault_cost_model:sleeping``: a point of ``SLOW_GPUS``
GPUs sleeps ``SLOW_S`` seconds before it is costed, so a signal finds the sweep mid-point;
``tests.fault_cost_model:dask_killed``: a point of ``KILL_GPUS`` GPUs raises Dask's
``KilledWorker``, what a Dask client sees once a task's workers died ``allowed-failures`` times
(here without a process to kill: the cluster may run in threads); ``tests.fault_cost_model:
stalling``: a solve run as a command (``python -m autopar``, not a worker) writes
``STALL_LINE`` on stderr when it costs its first layouts, then sleeps ``SLOW_S`` seconds, so a
signal sent once the line is read finds it mid-solve however loaded the machine is.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass

import numpy as np

from autopar.base.startup import is_command_line
from autopar.costs.terms import CostModel, TermContext
from cost_models.default import default_cost_model

KILL_GPUS = 16
SLOW_GPUS = 32
SLOW_S = 60.0
STALL_LINE = "fault: costing the layouts"


def _in_a_worker() -> bool:
    return multiprocessing.parent_process() is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    name: str = "fault_s"
    category: str = "compute"
    depends_on: tuple[str, ...] = ("tp",)
    action: str = "kill"

    def evaluate(self, grid, ctx: TermContext) -> np.ndarray:
        gpus = ctx.training.num_gpus
        if _in_a_worker() and self.action == "kill" and gpus == KILL_GPUS:
            os.kill(os.getpid(), signal.SIGKILL)
        if _in_a_worker() and self.action == "sleep" and gpus == SLOW_GPUS:
            time.sleep(SLOW_S)
        if self.action == "stall" and not _in_a_worker() and is_command_line():
            sys.stderr.write(STALL_LINE + "\n")
            sys.stderr.flush()
            time.sleep(SLOW_S)
        if self.action == "dask_killed" and gpus == KILL_GPUS:
            from types import SimpleNamespace

            from distributed import KilledWorker

            gone = SimpleNamespace(address="tcp://127.0.0.1:1")  # the worker that died last
            raise KilledWorker(task="point", last_worker=gone, allowed_failures=0)
        return np.zeros(len(grid["tp"]), dtype=np.float64)


def _with(action: str) -> CostModel:
    base = default_cost_model()
    return dataclasses.replace(
        base, name=f"default+{action}", step_terms=(*base.step_terms, Fault(action=action))
    )


def killing() -> CostModel:
    return _with("kill")


def sleeping() -> CostModel:
    return _with("sleep")


def stalling() -> CostModel:
    return _with("stall")


def dask_killed() -> CostModel:
    return _with("dask_killed")
