"""Floor 6: per-stage pipeline plans, chosen by CP-SAT together with the outer layout (issue 13).

``search`` (the per-stage solve), ``tables`` and ``windows`` (the stage tables it links).
"""
