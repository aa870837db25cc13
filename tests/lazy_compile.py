"""``torch.compile`` that compiles a function when it first runs, not when it is decorated: for
the test processes that import the consumers only to build their config classes (the ``torch``
xdist group's worker, ``tests/bridge_probe.py``).

Why: megatron-core 0.19.2 decorates functions with ``torch.compile`` at import
(``megatron/core/jit.py``: ``jit_fuser = torch.compile`` for the fusions of
``fusions/fused_bias_geglu.py``, imported by ``transformer/transformer_config.py``;
``transformer/moe/router.py``), and ``torch.compile`` imports TorchDynamo and TorchInductor
(``torch._dynamo``, ``torch._inductor.compile_fx``) to wrap the function, though no test runs a
compiled function: about 2.4 of the 4.7 s (``python -X importtime``) that importing
``megatron.core.transformer.transformer_config`` costs after torch. With this wrapper a decorated
function is a plain function that calls ``torch.compile`` on itself, with the same arguments,
when first called, and runs the compiled one from then on; anything else (a module, a
``torch.compile()`` call with nothing to compile yet, applied later) goes to ``torch.compile``
as given. Nothing else changes: the config classes, their checks and every value they hold are
megatron-core's own.

``install`` patches ``torch.compile`` as soon as torch is imported (an import hook: it does not
import torch itself, so a process that never imports torch pays nothing).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import inspect
import sys


def lazy(compile_):
    """``compile_`` (``torch.compile``) deferred to the first call of a plain function."""

    @functools.wraps(compile_)
    def compile_lazily(model=None, **kwargs):
        if model is None:  # @torch.compile(...): the decorator, applied to what it decorates
            return lambda function: compile_lazily(function, **kwargs)
        if not inspect.isfunction(model):
            return compile_(model, **kwargs)
        compiled = None

        @functools.wraps(model)
        def run(*args, **kw):
            nonlocal compiled
            if compiled is None:
                compiled = compile_(model, **kwargs)
            return compiled(*args, **kw)

        return run

    compile_lazily.__wrapped_compile__ = compile_
    return compile_lazily


def _patch(torch) -> None:
    if not hasattr(torch.compile, "__wrapped_compile__"):
        torch.compile = lazy(torch.compile)


class _Loader(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self.loader  # torch's own from here on
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # found by the other finders, once: the hook is done
        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Patch ``torch.compile`` now if torch is imported, else when it is (module docstring)."""
    if "torch" in sys.modules:
        _patch(sys.modules["torch"])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
