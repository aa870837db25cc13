"""autopar's default cost model: pure numpy terms (DESIGN §4, STYLE §2.3).

``default_cost_model()`` returns the ``autopar.terms.CostModel``; ``DatasheetCollectives`` is the
datasheet alpha-beta ``CollectiveModel`` used when no measured communication profile is given.
"""

from __future__ import annotations

from cost_models.communication import DatasheetCollectives
from cost_models.default import DEFAULT, default_cost_model
from cost_models.flops import TransformerFlops

__all__ = ["DEFAULT", "DatasheetCollectives", "TransformerFlops", "default_cost_model"]
