"""Floor 6: per-stage pipeline plans, chosen by CP-SAT together with the outer layout (issue 13).

``candidates`` (the outer rows with their bounds and heuristic plans; ``lower_bound`` the bounds
before any table), ``encoding`` (the ``StageEncoding`` protocol, the rows' ``Bounds``, the link to
the layout model), its three implementations ``tables`` (one layer kind), ``windows`` (several
kinds, no interleaving) and ``boundary`` (the rest), ``search`` (the search loop, once for all
three, shared by the runners-up) and ``result`` (the answer as a ``SolveResult``).
"""
