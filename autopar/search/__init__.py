"""Floor 5: the CP-SAT search, the only user of OR-Tools.

``cpsat`` (the model: variables, products, term tables), ``solver`` (the search: optimum, status,
runners-up), ``explain`` (why nothing fits), ``interrupt`` (Ctrl-C inside a solve).
"""
