"""Find a cost model: by the name an installed package registers, or by ``module:attr``.

Cost models plug in from outside the core. A package registers each of its models under the
``autopar.cost_models`` entry-point group (``pyproject.toml``; autopar's own ``cost_models``
package registers ``default`` and ``megatron-compatible``), and ``--cost-model`` also takes
``module:attr`` naming a ``CostModel`` or a function that returns one. The core imports no cost
model: the default is just the entry point named ``default``.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from autopar.errors import InputError
from autopar.terms import CostModel

ENTRY_POINT_GROUP = "autopar.cost_models"
DEFAULT_COST_MODEL = "default"


def cost_model_names() -> tuple[str, ...]:
    """The names installed packages register (``--cost-model NAME``)."""
    return tuple(sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)))


def _target(spec: str) -> object:
    """The object ``spec`` names: a registered name, or ``module:attr``."""
    if ":" not in spec:
        found = entry_points(group=ENTRY_POINT_GROUP, name=spec)
        if not found:
            known = ", ".join(cost_model_names()) or "none installed (pip install -e .)"
            raise InputError(
                f"no cost model named {spec!r} (registered: {known}; or give module:attr)",
                source="--cost-model",
            )
        return next(iter(found)).load()
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InputError(
            f"{spec!r} must be module:attr or a registered name", source="--cost-model"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise InputError(f"cannot import {module_name!r} ({err})", source="--cost-model") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise InputError(f"{module_name!r} has no {attr!r}", source="--cost-model") from None


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
        except TypeError as err:
            raise InputError(
                f"{spec!r} must take no arguments and return a CostModel ({err})",
                source="--cost-model",
            ) from None
    if not isinstance(target, CostModel):
        raise InputError(
            f"{spec!r} is a {type(target).__name__}, not an autopar.terms.CostModel",
            source="--cost-model",
        )
    return target
