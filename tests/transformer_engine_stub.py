"""A stand-in for Transformer Engine that only supplies names, for ``tests/bridge_probe.py``.

Why: Megatron-Bridge 0.6.2 imports ``transformer_engine.pytorch`` at module level on the path
that builds a recipe's ``ConfigContainer`` (``training/config.py`` -> ``data`` -> ...
``models/conversion/peft_bridge.py`` -> ``peft/lora_layers.py:20``), and Transformer Engine does
not install or import without CUDA. Building and overriding a config runs no TE code: the names
only have to exist. Every attribute of a stand-in module is a stand-in class whose instances do
nothing; the package reports version 2.20.2 (what ``megatron-bridge[te]`` resolved to when this
was written) so version probes take their current-release branch. Installed only in the probe's
own process, never in the test workers.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

VERSION = "2.20.2"


class _Named(type):
    def __getattr__(cls, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return _named(name)


def _named(name: str) -> type:
    return _Named(name, (), {"__init__": lambda self, *args, **kwargs: None})


class FusedAdam:
    """``transformer_engine.pytorch.optimizers.FusedAdam``'s constructor signature (TE 2.x
    ``pytorch/optimizers/fused_adam.py``): megatron-core's ``OptimizerConfig`` checks it for the
    precision-aware optimizer's arguments (``optimizer_config.py:445-463``)."""

    def __init__(
        self,
        params=None,
        lr=1e-3,
        *,
        master_weight_dtype=None,
        exp_avg_dtype=None,
        exp_avg_sq_dtype=None,
        use_decoupled_grad=False,
        **kwargs,
    ) -> None:
        pass


SIGNATURES = {"transformer_engine.pytorch.optimizers": {"FusedAdam": FusedAdam}}
"""The few names whose signature (not just existence) a config check reads."""


class _Module(types.ModuleType):
    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        known = SIGNATURES.get(self.__name__, {})
        return known.get(name) or _named(name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "transformer_engine" or fullname.startswith("transformer_engine."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        module.__version__ = VERSION
        return module

    def exec_module(self, module) -> None:
        pass


def install() -> None:
    """Put the stand-in first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
