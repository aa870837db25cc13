"""CP-SAT solves that Ctrl-C and SIGTERM can stop (issue 15).

CP-SAT catches SIGINT itself (``catch_sigint_signal``, on by default): it stops the search and
returns as if the time limit had run out, so a sweep carried on and exited 0, and it leaves
SIGINT at the default disposition afterwards. Here CP-SAT leaves signals alone and runs in a
worker thread (it releases the GIL), while the main thread waits on it, where Python's signal
handlers run at once: the interrupt (``KeyboardInterrupt``, or the CLI's SIGTERM exception)
stops the search (``stop_search``), waits for the worker, and propagates. Off the main thread
(embedded use) the solve runs in place.
"""

from __future__ import annotations

import threading
from typing import Any

from ortools.sat.python import cp_model


def solve(
    solver: cp_model.CpSolver,
    model: cp_model.CpModel,
    callback: cp_model.CpSolverSolutionCallback | None = None,
) -> Any:
    """``solver.solve(model, callback)``, interruptible by signals; returns the status."""
    solver.parameters.catch_sigint_signal = False
    if threading.current_thread() is not threading.main_thread():
        return solver.solve(model, callback)
    outcome: dict[str, Any] = {}
    finished = threading.Event()

    def work() -> None:
        try:
            outcome["status"] = solver.solve(model, callback)
        except BaseException as err:  # re-raised in the caller's thread
            outcome["error"] = err
        finally:
            finished.set()

    worker = threading.Thread(target=work, name="cp-sat", daemon=True)
    try:
        worker.start()
        finished.wait()  # interruptible: signal handlers run while the main thread waits here
    except BaseException:
        # Stop the search and wait until CP-SAT has returned (a C++ solve left running when
        # the interpreter exits aborts the process). The search may not have started when the
        # signal came, so ask again until it ends.
        while worker.ident is not None and not finished.wait(0.05):
            solver.stop_search()
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["status"]
