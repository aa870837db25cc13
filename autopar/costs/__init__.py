"""Floor 4: the cost-model seam and the physics every cost model shares.

``terms`` (the term protocols, ``CostModel`` and ``TermContext``), ``comm`` (collective times
from the datasheet), ``context`` (the context of a problem), ``plugin`` (cost models by name),
``estimate`` (score layouts in float), ``schedule`` (Megatron's pipeline schedule simulated),
``stage_costs`` / ``stage_estimate`` (per-layer costs and scores of per-stage plans). The cost
models themselves (``cost_models/``) import this floor and ``autopar.inputs`` only.
"""
