"""Assemble the ``TermContext`` a cost model reads: specs plus the source of collective times."""

from __future__ import annotations

from autopar.base.errors import InputError
from autopar.costs.comm import CollectiveModel, DatasheetCollectives
from autopar.costs.terms import TermContext
from autopar.inputs.specs import Problem


def make_context(problem: Problem, *, comm: CollectiveModel | None = None) -> TermContext:
    """The context of ``problem``: collective times from ``comm``, else from the cluster's
    measured profile (``comm_profile``), else from the datasheet alpha-beta model."""
    datasheet = DatasheetCollectives(problem.cluster)
    gemm = None
    if comm is None and problem.cluster.comm_profile_path:
        from autopar.calibration.profile import load_profile

        path = problem.cluster.comm_profile_path
        try:
            comm = load_profile(path, fallback=datasheet)
        except InputError as err:
            raise err.with_source(path) from None
        gemm = comm if getattr(comm, "gemm", None) else None
    return TermContext(
        model=problem.model,
        cluster=problem.cluster,
        training=problem.training,
        options=problem.options,
        comm=comm or datasheet,
        gemm=gemm,
    )
