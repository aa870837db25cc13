"""Floor 1, the ground: what every other floor may use and that uses nothing of autopar's.

``errors`` (typed errors), ``axes`` (the layout axes, declared once), ``deadline`` (the
``--time-limit`` clock), ``files`` (atomic writes), ``startup`` (quiet interrupts at start-up).
"""
