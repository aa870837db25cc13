"""Floor 8, above ``autopar.api``: capacity planning over grids of problems, one API solve each.

``run`` (``autopar.sweep``: solve every point, in processes or on Dask), ``html`` (the
self-contained HTML report).
"""
