"""The boundary encoding: per-stage plans as CP-SAT variables, for the shapes no table covers
(several layer kinds with interleaving; any shape when tables are off).

Per shape: integer chunk boundaries (layers per chunk in model order), and per stage a
selective-recompute flag and a full-recompute count ``k`` (``min(k, layers of the chunk)``
layers of each chunk). A row fixes every per-layer coefficient (``autopar.costs.stage_costs``),
so under its boolean the stage times, the stage memories and the objective are linear in the
plan variables:

    T_i   >= sum over chunks of stage i and layer kinds of
             count*t_none + selective*(t_sel - t_none) + full*(t_full - t_none) + fixed_i
    M_i   =  static_i + sum_j in_flight_ij * activations of chunk j  <= capacity
    obj   >= step + the schedule's closed form in max_i T_i and sum_i T_i

``max_i T_i`` is an ``add_max_equality``; kind counts of a chunk are prefix sums at its
boundaries (``add_element``). There are no tables to build, so ``tighten`` leaves the bounds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from autopar.layout.stages import StagePlan, StageRecompute
from autopar.pipeline.encoding import Bounds, Fix, PlanContext, RowLink, Shape, ns, whole_bytes


@dataclass(slots=True)
class _Group:
    """The plan variables of one shape."""

    bounds: list
    counts: list  # per chunk: {kind: expr}
    full: list  # per chunk: {kind: expr}
    selective: list  # per chunk: {kind: var}
    sel: list
    k: list
    any_full: list
    times: list
    slowest: cp_model.IntVar


def _prefix(kinds: tuple[str, ...], kind: str) -> list[int]:
    out = [0]
    for k in kinds:
        out.append(out[-1] + (k == kind))
    return out


def _boundaries(model: cp_model.CpModel, shape: Shape, num_layers: int) -> list:
    p, v, name = shape.pp, shape.vpp, shape.name
    chunks = p * v
    b = [model.new_constant(0)]
    b += [model.new_int_var(0, num_layers, f"{name}.b{c}") for c in range(1, chunks)]
    b.append(model.new_constant(num_layers))
    # Chunks hold consecutive layers; every chunk but the first and the last holds one.
    for c in range(chunks):
        model.add(b[c + 1] >= b[c] + (1 if 0 < c < chunks - 1 else 0))
    if v > 1:
        # Interleaving: a stage's chunks differ by at most one layer (the first and the last
        # chunk, which also hold the embedding and the loss, may hold fewer): the schedule
        # formula holds for near-equal chunks only (tests/test_stages.py simulates it).
        for i in range(p):
            low = model.new_int_var(0, num_layers, f"{name}.q{i}")
            for c in range(i, chunks, p):
                n_c = b[c + 1] - b[c]
                model.add(n_c <= low + 1)
                if 0 < c < chunks - 1:
                    model.add(n_c >= low)
    return b


class _KindCounts:
    """Layers of each kind between two layer positions, as expressions (prefix sums looked up
    with ``add_element``; with one kind, the difference itself)."""

    def __init__(self, model: cp_model.CpModel, kinds_in_order: tuple[str, ...], name: str):
        self.model, self.name = model, name
        self.num_layers = len(kinds_in_order)
        self.kinds = tuple(dict.fromkeys(kinds_in_order))
        self.prefixes = {kind: _prefix(kinds_in_order, kind) for kind in self.kinds}

    def between(self, lo, hi, tag: str) -> dict:
        if len(self.kinds) == 1:
            return {self.kinds[0]: hi - lo}
        out = {}
        for kind in self.kinds:
            at = []
            for j, point in enumerate((lo, hi)):
                var = self.model.new_int_var(0, self.num_layers, f"{self.name}.{tag}.P{kind}{j}")
                self.model.add_element(point, self.prefixes[kind], var)
                at.append(var)
            out[kind] = at[1] - at[0]
        return out


def _recompute_vars(model: cp_model.CpModel, shape: Shape, max_chunk: int, modes):
    """Per stage: the selective flag, the full count ``k`` and whether any layer is recomputed
    fully (``None`` where the mode is not allowed)."""
    sel, k, any_full = [], [], []
    for i in range(shape.pp):
        s_i = model.new_bool_var(f"{shape.name}.sel{i}") if "selective" in modes else None
        k_i = model.new_int_var(0, max_chunk, f"{shape.name}.k{i}") if "full" in modes else None
        a_i = model.new_bool_var(f"{shape.name}.anyfull{i}") if k_i is not None else None
        if s_i is not None and k_i is not None:
            # Megatron's granularity is selective or full, not both.
            model.add(k_i == 0).only_enforce_if(s_i)
        sel.append(s_i)
        k.append(k_i)
        any_full.append(a_i)
    return sel, k, any_full


def _chunk_recompute(model, shape: Shape, b, counts, sel, k, kinds: _KindCounts, modes):
    """Per chunk: the layers of each kind recomputed fully and selectively."""
    p, name, max_chunk = shape.pp, shape.name, kinds.num_layers - max(shape.pp * shape.vpp - 2, 0)
    full, selective = [], []
    for c in range(p * shape.vpp):
        i = c % p
        n_c = b[c + 1] - b[c]
        if k[i] is not None:
            r_c = model.new_int_var(0, max_chunk, f"{name}.r{c}")
            n_var = model.new_int_var(0, kinds.num_layers, f"{name}.n{c}")
            model.add(n_var == n_c)
            model.add_min_equality(r_c, [k[i], n_var])
            single = len(kinds.kinds) == 1
            full.append(
                {kinds.kinds[0]: r_c} if single else kinds.between(b[c], b[c] + r_c, f"f{c}")
            )
            if "none" not in modes:
                cond = [sel[i].Not()] if sel[i] is not None else []
                model.add(r_c == n_var).only_enforce_if(cond)
        else:
            full.append({kind: 0 for kind in kinds.kinds})
            if "none" not in modes and sel[i] is not None:
                model.add(sel[i] == 1)
        if sel[i] is not None:
            chunk_sel = {}
            for kind in kinds.kinds:
                var = model.new_int_var(0, kinds.num_layers, f"{name}.s{c}{kind}")
                model.add(var == counts[c][kind]).only_enforce_if(sel[i])
                model.add(var == 0).only_enforce_if(sel[i].Not())
                chunk_sel[kind] = var
            selective.append(chunk_sel)
        else:
            selective.append({kind: 0 for kind in kinds.kinds})
    return full, selective


def _add_group(model, shape: Shape, kinds_in_order: tuple[str, ...], modes, max_ns: int) -> _Group:
    p, chunks = shape.pp, shape.pp * shape.vpp
    kinds = _KindCounts(model, kinds_in_order, shape.name)
    b = _boundaries(model, shape, kinds.num_layers)
    counts = [kinds.between(b[c], b[c + 1], f"c{c}") for c in range(chunks)]
    max_chunk = kinds.num_layers - max(chunks - 2, 0)
    sel, k, any_full = _recompute_vars(model, shape, max_chunk, modes)
    full, selective = _chunk_recompute(model, shape, b, counts, sel, k, kinds, modes)
    for i in range(p):
        if any_full[i] is None:
            continue
        total = sum(full[c][kind] for c in range(i, chunks, p) for kind in kinds.kinds)
        model.add(total >= 1).only_enforce_if(any_full[i])
        model.add(total == 0).only_enforce_if(any_full[i].Not())
    times = [model.new_int_var(0, max_ns, f"{shape.name}.T{i}") for i in range(p)]
    slowest = model.new_int_var(0, max_ns, f"{shape.name}.Tmax")
    model.add_max_equality(slowest, times)
    return _Group(b, counts, full, selective, sel, k, any_full, times, slowest)


def _add_row(model: cp_model.CpModel, g: _Group, shape: Shape, r: int, link: RowLink) -> None:
    """The stage times, memories and objective of row ``r`` under its boolean."""
    costs, x = link.ctx.costs, link.x[r]
    p, v = shape.pp, shape.vpp
    chunks = p * v
    m = int(link.ctx.grid["grad_accum"][r])
    kinds = tuple(dict.fromkeys(costs.layer_kinds))
    t = {kind: [ns(costs.time_s[kind][r, code]) for code in range(3)] for kind in kinds}
    a = {
        kind: [whole_bytes(costs.activation_bytes[kind][r, code]) for code in range(3)]
        for kind in kinds
    }
    s = {kind: whole_bytes(costs.static_bytes[kind][r]) for kind in kinds}

    def per_chunk(c, value):
        return sum(
            g.counts[c][kind] * value[kind][0]
            + g.selective[c][kind] * (value[kind][1] - value[kind][0])
            + g.full[c][kind] * (value[kind][2] - value[kind][0])
            for kind in kinds
        )

    for i in range(p):
        mine = range(i, chunks, p)
        fixed_ns = ns(costs.every_time_s[r])
        fixed_bytes = whole_bytes(costs.every_static_bytes[r])
        if i == 0:
            fixed_ns += ns(costs.first_time_s[r])
            fixed_bytes += whole_bytes(costs.first_static_bytes[r])
        if i == p - 1:
            fixed_ns += ns(costs.last_time_s[r])
            fixed_bytes += whole_bytes(costs.last_static_bytes[r])
        model.add(g.times[i] >= sum(per_chunk(c, t) for c in mine) + fixed_ns).only_enforce_if(x)
        memory = fixed_bytes + sum(g.counts[c][kind] * s[kind] for c in mine for kind in kinds)
        if g.any_full[i] is not None:
            memory += g.any_full[i] * whole_bytes(costs.full_workspace_bytes[r])
        if g.sel[i] is not None:
            memory += g.sel[i] * whole_bytes(costs.selective_workspace_bytes[r])
        flights = shape.schedule.in_flight(p, v, m, i)
        for j, (w, c) in enumerate(zip(flights, mine, strict=True)):
            extra = 0
            if c == 0:
                extra += whole_bytes(costs.first_activation_bytes[r])
            if c == chunks - 1:
                extra += whole_bytes(costs.last_activation_bytes[r])
            if j == 0:
                extra += whole_bytes(costs.every_activation_bytes[r])
            memory += w * (per_chunk(c, a) + extra)
        model.add(memory <= link.capacity_bytes).only_enforce_if(x)
    link.step_at_least(model, r, shape, g.slowest, g.times)


@dataclass(frozen=True, slots=True)
class BoundaryEncoding:
    """Chunk boundaries and recompute counts as variables (module docstring)."""

    shape: Shape

    def tighten(
        self, bounds: Bounds, rows: np.ndarray, ctx: PlanContext
    ) -> tuple[BoundaryEncoding, Bounds]:
        return self, bounds

    def add(self, model: cp_model.CpModel, rows: np.ndarray, link: RowLink) -> _Group:
        costs, shape = link.ctx.costs, self.shape
        g = _add_group(model, shape, costs.layer_kinds, link.ctx.modes, link.max_ns)
        for r in rows:
            _add_row(model, g, shape, int(r), link)
        # Middle stages with the same in-flight counts on every row are interchangeable.
        if len(set(costs.layer_kinds)) == 1 and shape.vpp == 1:
            ms = {int(link.ctx.grid["grad_accum"][r]) for r in rows}
            flights = shape.schedule.in_flight
            for i in range(1, shape.pp - 2):
                if all(flights(shape.pp, 1, m, i) == flights(shape.pp, 1, m, i + 1) for m in ms):
                    b = g.bounds
                    model.add(b[i + 1] - b[i] >= b[i + 2] - b[i + 1])
        return g

    def hint(self, handle: _Group, plan: StagePlan) -> list[Fix]:
        out, start = [], 0
        for c, n in enumerate(plan.chunk_layers[:-1]):
            start += n
            out.append((handle.bounds[c + 1], start))
        for i, rec in enumerate(plan.recompute):
            if handle.sel[i] is not None:
                out.append((handle.sel[i], int(rec.mode == "selective")))
            if handle.k[i] is not None:
                out.append((handle.k[i], rec.num_layers if rec.mode == "full" else 0))
        return out

    def decode(self, solver: cp_model.CpSolver, handle: _Group, row: int) -> StagePlan:
        p, v = self.shape.pp, self.shape.vpp
        bounds = [int(solver.value(b)) for b in handle.bounds]
        layers = tuple(hi - lo for lo, hi in itertools.pairwise(bounds))
        recompute = []
        for i in range(p):
            if handle.sel[i] is not None and solver.boolean_value(handle.sel[i]):
                recompute.append(StageRecompute("selective", 0))
                continue
            k = int(solver.value(handle.k[i])) if handle.k[i] is not None else 0
            # Normalise: no more than the largest chunk of the stage.
            k = min(k, max(layers[c] for c in range(i, p * v, p)))
            recompute.append(StageRecompute("full", k) if k else StageRecompute("none", 0))
        return StagePlan(pp=p, vpp=v, chunk_layers=layers, recompute=tuple(recompute))
