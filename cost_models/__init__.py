"""autopar's default cost model: pure numpy terms (DESIGN §4, STYLE §2.3).

``default_cost_model()`` returns the ``autopar.costs.terms.CostModel``. This package depends on the
core (``autopar.costs.terms``, ``autopar.costs.comm``, ``autopar.inputs.specs``); the core never
imports it: it finds the default model through the ``autopar.cost_models`` entry point
(``pyproject.toml``).
"""

from __future__ import annotations

from cost_models.default import default_cost_model
from cost_models.flops import TransformerFlops

__all__ = ["TransformerFlops", "default_cost_model"]
