"""Floor 7 (beside ``autopar.api``): capacity planning over grids of problems.

``run`` (``autopar.sweep``: solve every point, in processes or on Dask), ``html`` (the
self-contained HTML report).
"""
