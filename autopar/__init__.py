"""autopar: the provably fastest parallel layout for training a transformer on a GPU cluster.

Public API (keyword arguments mirror the CLI flags)::

    import autopar
    result = autopar.solve(model="llama-70b", gpus=1024, gpu="h100", seq_len=8192)
    result.best.layout, result.best.step_time_s, result.status
    autopar.evaluate(model="llama-70b", gpus=1024, tp=8, pp=4, vpp=5, seq_len=8192)
    autopar.sweep(model="llama-70b", gpus=[256, 512, 1024]).to_frame()
"""

from __future__ import annotations

import autopar.startup  # noqa: F401  (first: quiet Ctrl-C / SIGTERM while the CLI starts)
from autopar.api import (
    evaluate,
    evaluate_problem,
    layout_of,
    make_problem,
    plan_of,
    solve,
    solve_problem,
)
from autopar.errors import InfeasibleError, InputError
from autopar.loading import load_cluster, load_gpu, load_model
from autopar.plan import Estimate, Layout
from autopar.plugin import load_cost_model
from autopar.solver import SolveResult
from autopar.specs import (
    ClusterSpec,
    GpuSpec,
    ModelSpec,
    Problem,
    SearchOptions,
    TrainingSpec,
)
from autopar.stages import StagePlan, StageRecompute
from autopar.sweep import SweepResult, sweep
from autopar.terms import CostModel, CostTerm, ResourceTerm, TermContext

__version__ = "0.1.0"

__all__ = [
    "ClusterSpec",
    "CostModel",
    "CostTerm",
    "Estimate",
    "GpuSpec",
    "InfeasibleError",
    "InputError",
    "Layout",
    "ModelSpec",
    "Problem",
    "ResourceTerm",
    "SearchOptions",
    "SolveResult",
    "StagePlan",
    "StageRecompute",
    "SweepResult",
    "TermContext",
    "TrainingSpec",
    "__version__",
    "evaluate",
    "evaluate_problem",
    "layout_of",
    "load_cost_model",
    "load_cluster",
    "load_gpu",
    "load_model",
    "make_problem",
    "plan_of",
    "solve",
    "solve_problem",
    "sweep",
]
