"""autopar: the provably fastest parallel layout for training a transformer on a GPU cluster.

Public API (keyword arguments mirror the CLI flags)::

    import autopar
    result = autopar.solve(model="llama-70b", gpus=1024, gpu="h100", seq_len=8192)
    result.best.layout, result.best.step_time_s, result.status
    autopar.evaluate(model="llama-70b", gpus=1024, tp=8, pp=4, vpp=5, seq_len=8192)
    autopar.sweep(model="llama-70b", gpus=[256, 512, 1024]).to_frame()

The package is built in floors, each a sub-package that imports only the floors below it
(``docs/DESIGN.md``, "Floors"; ``tests/test_architecture.py`` keeps it so):
``cli`` -> ``sweeps`` -> ``api`` -> ``pipeline`` -> ``search``, ``outputs``, ``calibration`` ->
``costs`` -> ``layout`` -> ``inputs`` -> ``base``.

The names below are loaded on first use (PEP 562), so ``import autopar.base.axes`` or one cost
term loads neither OR-Tools nor pandas.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "evaluate": "autopar.api",
    "evaluate_problem": "autopar.api",
    "layout_of": "autopar.api",
    "make_problem": "autopar.api",
    "optimum_of": "autopar.api",
    "plan_of": "autopar.api",
    "solve": "autopar.api",
    "solve_problem": "autopar.api",
    "sweep": "autopar.sweeps.run",
    "SweepResult": "autopar.sweeps.run",
    "fallbacks": "autopar.sweeps.fallbacks",
    "fallbacks_problem": "autopar.sweeps.fallbacks",
    "FallbackResult": "autopar.sweeps.fallbacks",
    "InfeasibleError": "autopar.base.errors",
    "InputError": "autopar.base.errors",
    "load_cluster": "autopar.inputs.loading",
    "load_gpu": "autopar.inputs.loading",
    "load_model": "autopar.inputs.loading",
    "ClusterSpec": "autopar.inputs.specs",
    "GpuSpec": "autopar.inputs.specs",
    "ModelSpec": "autopar.inputs.specs",
    "Problem": "autopar.inputs.specs",
    "SearchOptions": "autopar.inputs.specs",
    "TrainingSpec": "autopar.inputs.specs",
    "Estimate": "autopar.layout.plan",
    "Layout": "autopar.layout.plan",
    "PerStage": "autopar.layout.stages",
    "StagePlan": "autopar.layout.stages",
    "StageRecompute": "autopar.layout.stages",
    "CostModel": "autopar.costs.terms",
    "CostTerm": "autopar.costs.terms",
    "ResourceTerm": "autopar.costs.terms",
    "TermContext": "autopar.costs.terms",
    "load_cost_model": "autopar.costs.plugin",
    "SolveResult": "autopar.layout.results",
    "Alternatives": "autopar.layout.alternatives",
    "Optimum": "autopar.layout.alternatives",
}
"""Public name -> the module that defines it."""

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use (PEP 562) and keep it."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autopar' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
