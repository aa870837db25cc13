"""Stack switches as the cost terms read them: a term's own setting when it has one (a cost model
built with ``default_cost_model(flash_attention=False)``), else the job's stack
(``ctx.training.stack``, ``autopar.inputs.stack.StackSpec``)."""

from __future__ import annotations

from typing import Any

from autopar.costs.terms import TermContext


def switch(value: Any, ctx: TermContext, name: str) -> Any:
    """``value`` unless it is ``None``, else the stack's ``name``."""
    return getattr(ctx.training.stack, name) if value is None else value
