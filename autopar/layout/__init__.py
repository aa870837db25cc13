"""Floor 3: what a layout is and which layouts a problem allows.

``plan`` (``Layout`` and ``Estimate``), ``rules`` (the frameworks' layout rules, each with its
source), ``space`` (the candidate space of a problem), ``stages`` (per-stage pipeline plans).
"""
