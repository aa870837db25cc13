"""Find a cost model: by the name an installed package registers, or by ``module:attr``.

Cost models plug in from outside the core. A package registers each of its models under the
``autopar.cost_models`` entry-point group (``pyproject.toml``; autopar's own ``cost_models``
package registers ``default`` and ``megatron-compatible``), and ``--cost-model`` also takes
``module:attr`` naming a ``CostModel`` or a function that returns one. The core imports no cost
model: the default is just the entry point named ``default``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from importlib.metadata import EntryPoint, entry_points

from autopar.base.errors import InputError, excerpt, shorten
from autopar.costs.terms import CostModel

ENTRY_POINT_GROUP = "autopar.cost_models"
DEFAULT_COST_MODEL = "default"
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@functools.cache
def _registered() -> tuple[EntryPoint, ...]:
    """The group's entry points, read once a process: reading them scans the metadata of every
    installed distribution (10-30 ms, for every solve of a sweep or a program before); a
    package installed while a process runs is seen by the next one."""
    return tuple(entry_points(group=ENTRY_POINT_GROUP))


def cost_model_names() -> tuple[str, ...]:
    """The names installed packages register (``--cost-model NAME``)."""
    return tuple(sorted(ep.name for ep in _registered()))


def _target(spec: str) -> object:
    """The object ``spec`` names: a registered name, or ``module:attr``."""
    if ":" not in spec:
        found = [ep for ep in _registered() if ep.name == spec]
        if not found:
            known = ", ".join(cost_model_names()) or "none installed (pip install -e .)"
            raise InputError(
                f"no cost model named {excerpt(spec)} (registered: {known}; or give module:attr)",
                source="--cost-model",
            )
        try:
            return next(iter(found)).load()
        except (Exception, SystemExit) as err:  # a broken installed plug-in
            raise InputError(
                f"cost model {excerpt(spec)} failed to load ({type(err).__name__})",
                source="--cost-model",
            ) from None
    module_name, _, attr = spec.partition(":")
    if not (_DOTTED.match(module_name) and attr.isidentifier()):
        raise InputError(
            f"{excerpt(spec)} must be module:attr or a registered name", source="--cost-model"
        )
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as err:  # ImportError, or anything the module raises
        raise InputError(
            f"cannot import {excerpt(module_name)} ({type(err).__name__}: {shorten(err, 80)})",
            source="--cost-model",
        ) from None
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise InputError(f"{module_name!r} has no {attr!r}", source="--cost-model") from None
    if isinstance(target, CostModel) or _is_factory(target, module.__name__):
        return target
    raise InputError(
        f"{excerpt(spec)} is neither a CostModel nor a function of {module_name} that takes no "
        "arguments",
        source="--cost-model",
    )


def _is_factory(target: object, module_name: str) -> bool:
    """A plain function or class defined in the named module, callable without arguments:
    ``--cost-model`` never calls a builtin or a function imported from elsewhere
    (``os:abort``, ``json:loads``)."""
    if getattr(target, "__module__", None) != module_name:
        return False
    if not (inspect.isfunction(target) or inspect.isclass(target)):
        return False
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters
    )


def load_cost_model(spec: str | CostModel | None = None) -> CostModel:
    """The cost model ``spec`` names (module docstring); ``None`` is ``default``."""
    if isinstance(spec, CostModel):
        return spec
    spec = DEFAULT_COST_MODEL if spec is None else str(spec).strip()
    target = _target(spec)
    if callable(target) and not isinstance(target, CostModel):
        try:
            target = target()
        except InputError as err:
            raise err.with_source("--cost-model") from None
        except (Exception, SystemExit) as err:  # the plug-in's factory failed
            raise InputError(
                f"{excerpt(spec)} failed ({type(err).__name__}: {shorten(err, 80)}); it "
                "must take no arguments and return a CostModel",
                source="--cost-model",
            ) from None
    if not isinstance(target, CostModel):
        raise InputError(
            f"{excerpt(spec)} is a {type(target).__name__}, not an autopar.costs.terms.CostModel",
            source="--cost-model",
        )
    return target
