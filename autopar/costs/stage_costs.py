"""Per-layer costs for per-stage pipeline plans (``autopar.layout.stages``), over the outer layout
axes.

The interface is ``StageCosts``: numpy arrays over the rows of a layout grid (one row per outer
layout: tp, pp, cp, ep, etp, vpp, mbs, grad_accum, zero, sp), giving

- for each layer kind, one micro-batch's forward + backward time of one layer and the activation
  bytes it keeps, under each recompute mode (none, selective, full), and its static bytes
  (weights, gradients, optimizer states); of that time, the weight-gradient part (the
  zero-bubble schedules run it apart from the input gradient: Qi et al. 2024 §2);
- what sits outside the layers: on every stage (pipeline send/receive, workspace), on the first
  (input embedding: its parameters and its activations), on the last (output layer, loss, the
  logits; MTP modules);
- the step terms (DP gradient sync, optimizer), and the extra static bytes of a stage that
  recomputes (one layer's full activations while it is recomputed).

``probe_stage_costs`` builds it from any ``CostModel`` by probing: each term is evaluated on
one-kind models of ``pp`` and ``2*pp`` layers (one and two layers per stage); the difference is
the cost of one layer, the rest is placed on a stage by ``PLACEMENT`` (by term name; a term it
does not name is charged to every stage, the conservative choice). With an even split this
reproduces the uniform cost model exactly (``tests/test_stages.py``).

Layer kinds: ``ModelSpec.layer_kinds`` when the model has one (per-layer-type costs: dense,
MoE, MLA, sliding-window, Mamba, with MTP modules on the last stage); otherwise every layer is
one kind, ``"layer"``. The probe of a kind is the model with every layer of that kind, so the
per-type terms of the cost model price each kind.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from autopar.base.axes import PIPELINE_SCHEDULES
from autopar.base.deadline import check_deadline
from autopar.costs.schedule_orders import PAIRED
from autopar.costs.terms import CostModel, TermContext, scheduled_microbatch_s, term_phases
from autopar.layout.stages import V_PLACED

NUM_RECOMPUTE_MODES = 3
"""Grid codes of ``recompute``: 0 none, 1 selective, 2 full (``autopar.base.axes``)."""
DEFAULT_KIND = "layer"
SPLIT_BACKWARD = frozenset({"zb-h1", "zb-v", "dualpipe-v"})
"""Schedules that run a backward's weight gradient apart from its input gradient: only rows of
these probe the weight-gradient times (elsewhere they are zero and unread)."""
V_PLACED_STATIC = V_PLACED
"""Schedules whose rows' static bytes are probed on 1F1B: the uniform model puts the output
layer on the first rank under a V (``cost_models.memory.first_stage_dense_params``), which the
per-stage figures place themselves (the last chunk on rank 0, ``StagePlan.last_stage``), so the
probe must see the loop placement or it would count that layer twice."""

PLACEMENT: Mapping[str, str] = {
    # time per micro-batch
    "logits_compute_s": "last",
    # static bytes: the dense-parameter terms hold the input embedding beyond the layers
    "dense_weights_bytes": "first",
    "dense_gradients_bytes": "first",
    "dense_optimizer_bytes": "first",
    "logits_bytes": "last",
    # activation bytes per micro-batch: the embedding's dropout mask and token ids
    "layer_activations_bytes": "first",
}
"""Where the layer-independent part of a term lives; unnamed terms go on every stage."""
LAST_AS_SINGLE_STAGE = frozenset({"logits_bytes"})
"""Terms the cost model counts only with ``pp == 1`` because the first stage dominates there;
the last stage holds them whatever ``pp`` is, so they are probed at ``pp = 1``, per micro-batch
the last chunk holds (GPipe and Looped BFS: every one; ``cost_models.memory.LogitsMemory``)."""
EMBEDDING_TERMS = frozenset(
    {"dense_weights_bytes", "dense_gradients_bytes", "dense_optimizer_bytes"}
)
"""Terms whose layer-free part is the input embedding (``pp > 1``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCosts:
    """Costs over ``rows`` outer layouts (module docstring). ``(rows, 3)`` arrays are indexed by
    the recompute code."""

    layer_kinds: tuple[str, ...]
    """The kind of every layer, in model order."""
    time_s: Mapping[str, np.ndarray]
    weight_s: Mapping[str, np.ndarray]
    """Of ``time_s``, the weight gradient (``Phases.backward_weight``; zero on rows whose
    schedule does not split the backward, ``SPLIT_BACKWARD``)."""
    activation_bytes: Mapping[str, np.ndarray]
    static_bytes: Mapping[str, np.ndarray]
    every_time_s: np.ndarray
    first_time_s: np.ndarray
    last_time_s: np.ndarray
    every_static_bytes: np.ndarray
    first_static_bytes: np.ndarray
    last_static_bytes: np.ndarray
    first_activation_bytes: np.ndarray
    last_activation_bytes: np.ndarray
    every_activation_bytes: np.ndarray
    full_workspace_bytes: np.ndarray
    """Extra static bytes on a stage that recomputes some layer fully."""
    selective_workspace_bytes: np.ndarray
    step_time_s: np.ndarray
    every_weight_s: np.ndarray
    """The weight-gradient parts of ``every_time_s``, ``first_time_s``, ``last_time_s``."""
    first_weight_s: np.ndarray
    last_weight_s: np.ndarray

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.layer_kinds))

    def take(self, index) -> StageCosts:
        """The costs of the rows ``index`` picks (an index array or a slice)."""
        fields = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "layer_kinds":
                fields[f.name] = value
            elif isinstance(value, Mapping):
                fields[f.name] = {k: v[index] for k, v in value.items()}
            else:
                fields[f.name] = value[index]
        return StageCosts(**fields)


def layer_kinds(model) -> tuple[str, ...]:
    """The kind of every layer (``ModelSpec.layer_kinds`` where the model has per-layer types)."""
    return tuple(model.layer_kinds)


def mtp_layers(model) -> tuple[int, str]:
    """MTP modules on the last stage and their layer kind (none without per-layer types)."""
    count = model.num_mtp_layers
    return count, (model.mtp_layer_kind if count else DEFAULT_KIND)


def _probe_model(model, kind: str, num_layers: int):
    """``model`` with ``num_layers`` layers, all of ``kind`` (and no MTP modules)."""
    changes: dict[str, object] = {"num_layers": num_layers}
    names = {f.name for f in dataclasses.fields(model)}
    if "layer_types" in names and kind != DEFAULT_KIND:
        changes["layer_types"] = (kind,) * num_layers
    if "num_mtp_layers" in names:
        changes["num_mtp_layers"] = 0
    return dataclasses.replace(model, **changes)


def _sum_by(terms, grid, ctx, size, value_of) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(sum of all terms, sum per placement) of ``value_of(term, grid, ctx, size)``: the term's
    value (``_value``), its value as the layout's schedule runs it on average
    (``scheduled_microbatch_s``: the combined 1F1B's pairs hide part of the expert all-to-all)
    or its weight-gradient part (``_weight``)."""
    total = np.zeros(size)
    by: dict[str, np.ndarray] = {}
    for term in terms:
        value = value_of(term, grid, ctx, size)
        total = total + value
        where = _place(term)
        by[where] = by.get(where, np.zeros(size)) + value
    return total, by


def _weight(term, grid, ctx, size: int) -> np.ndarray:
    """The weight-gradient part of one micro-batch's ``term`` (``terms.term_phases``: a term
    without phases counts none, ``terms.FORWARD_SHARE``)."""
    return term_phases(term, grid, ctx, size).backward_weight


def _scheduled(slots, term, grid, ctx, size: int) -> np.ndarray:
    return scheduled_microbatch_s(term, slots, grid, ctx, size)


def _value(term, grid, ctx, size: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(term.evaluate(grid, ctx), dtype=np.float64), (size,))


def _place(term) -> str:
    return PLACEMENT.get(term.name, "every")


FIXED_FIELDS = (
    "every_time_s",
    "first_time_s",
    "last_time_s",
    "every_static_bytes",
    "first_static_bytes",
    "last_static_bytes",
    "first_activation_bytes",
    "last_activation_bytes",
    "every_activation_bytes",
    "full_workspace_bytes",
    "selective_workspace_bytes",
    "every_weight_s",
    "first_weight_s",
    "last_weight_s",
)
"""The ``StageCosts`` fields outside the layers (filled from the first layer kind's probes)."""


def _codes(names) -> list[int]:
    return [i for i, name in enumerate(PIPELINE_SCHEDULES) if name in names]


def _runs_any(g, names) -> bool:
    """Whether some row of ``g`` runs one of the schedules ``names`` (``PAIRED``: pairs that
    hide communication, elsewhere ``scheduled_microbatch_s`` is the term's own value;
    ``SPLIT_BACKWARD``)."""
    return "schedule" in g and bool(np.isin(np.asarray(g["schedule"]), _codes(names)).any())


def _v_output_bytes(static_terms, grid, ctx) -> np.ndarray:
    """What the uniform model's dense-parameter terms (``EMBEDDING_TERMS``) add on the V rows
    over the same rows loop-placed: the output layer, which a V puts on the first rank
    (``cost_models.memory.stage_dense_params``; for splits the uniform model makes even)."""
    size = len(np.asarray(grid["pp"]))
    loop = _as_one_f_one_b(grid, V_PLACED_STATIC)
    terms = [t for t in static_terms if t.name in EMBEDDING_TERMS]
    placed = sum((_value(t, grid, ctx, size) for t in terms), np.zeros(size))
    return placed - sum((_value(t, loop, ctx, size) for t in terms), np.zeros(size))


def _v_rows(g) -> np.ndarray:
    """Rows that run a V-placed schedule."""
    if "schedule" not in g:
        return np.zeros(len(np.asarray(g["pp"])), dtype=bool)
    return np.isin(np.asarray(g["schedule"]), _codes(V_PLACED_STATIC))


def _as_one_f_one_b(g, names=SPLIT_BACKWARD) -> dict:
    """``g`` with the rows of ``names`` on 1F1B: ``SPLIT_BACKWARD`` for the activation probes,
    ``V_PLACED_STATIC`` for the static ones. A micro-batch's
    activation bytes do not depend on the schedule, but the cost model scales them to the rank
    that peaks highest over the first rank's count (``cost_models.shapes._scheduled_peak``),
    and under ZB-H1 a rank's chunks hold different counts: with ``pp`` or ``2*pp`` layers over
    ``pp*vpp`` chunks that scaling is not linear in the layers, so the difference of the probes
    is not one layer's bytes (10% below the uniform model's first stage at pp 8, vpp 2, 12
    micro-batches). The 1F1B scaling of equal stages is 1 (``peak_in_flight_stage_bytes``)."""
    if not _runs_any(g, names):
        return g
    schedule = np.asarray(g["schedule"])
    split = np.isin(schedule, _codes(names))
    return {**g, "schedule": np.where(split, PIPELINE_SCHEDULES.index("1f1b"), schedule)}


def _probe_parts(cost_model: CostModel, static_terms, g, probes, n: int) -> dict:
    """Per label (time, activations, static bytes): the slope per layer and the intercepts per
    placement, from the sums at 1 and 2 layers per stage (``v(layers) = intercept + layers *
    slope``)."""
    parts = {}
    for label, terms in (
        ("time_s", cost_model.microbatch_terms),
        ("activation_bytes", cost_model.microbatch_memory_terms),
        ("static_bytes", static_terms),
    ):
        value_of = _value
        if label == "time_s" and _runs_any(g, PAIRED):
            value_of = functools.partial(_scheduled, cost_model.slots)
        at = {
            "activation_bytes": _as_one_f_one_b(g),
            "static_bytes": _as_one_f_one_b(g, V_PLACED_STATIC),
        }.get(label, g)
        v1, by1 = _sum_by(terms, at, probes[0], n, value_of)
        v2, by2 = _sum_by(terms, at, probes[1], n, value_of)
        parts[label] = (v2 - v1, {w: 2.0 * by1[w] - by2[w] for w in by1})
    if _runs_any(g, SPLIT_BACKWARD):
        v1, by1 = _sum_by(cost_model.microbatch_terms, g, probes[0], n, _weight)
        v2, by2 = _sum_by(cost_model.microbatch_terms, g, probes[1], n, _weight)
        parts["weight_s"] = (v2 - v1, {w: 2.0 * by1[w] - by2[w] for w in by1})
    return parts


class _Probes:
    """The arrays of a ``StageCosts`` as ``probe_stage_costs`` fills them."""

    def __init__(self, kinds: tuple[str, ...], size: int) -> None:
        self.time = {k: np.zeros((size, NUM_RECOMPUTE_MODES)) for k in kinds}
        self.weight = {k: np.zeros((size, NUM_RECOMPUTE_MODES)) for k in kinds}
        self.act = {k: np.zeros((size, NUM_RECOMPUTE_MODES)) for k in kinds}
        self.static = {k: np.zeros(size) for k in kinds}
        self.fixed = {name: np.zeros(size) for name in FIXED_FIELDS}
        self.embedding_bytes = np.zeros(size)

    def probe(self, cost_model, ctx, static_terms, kind: str, rows, sub, *, first: bool) -> None:
        """The costs of ``kind`` on ``rows`` (one ``pp``), and with the ``first`` kind the
        layer-independent parts and the recompute workspaces (``_mode_passes``)."""
        n, p = len(rows), int(sub["pp"][0])
        probes = [
            dataclasses.replace(ctx, model=_probe_model(ctx.model, kind, p * layers))
            for layers in (1, 2)
        ]
        static_fixed = {}
        for codes in _mode_passes(n):
            g = {a: np.tile(np.asarray(v), len(codes)) for a, v in sub.items()}
            g["recompute"] = np.repeat(np.array(codes, dtype=np.int64), n)
            parts = _probe_parts(cost_model, static_terms, g, probes, len(codes) * n)
            fixed = sum(parts["static_bytes"][1].values(), np.zeros(len(codes) * n))
            for j, code in enumerate(codes):
                mine = slice(j * n, (j + 1) * n)  # the rows of this mode
                self.time[kind][rows, code] = parts["time_s"][0][mine]
                if "weight_s" in parts:
                    self.weight[kind][rows, code] = parts["weight_s"][0][mine]
                self.act[kind][rows, code] = parts["activation_bytes"][0][mine]
                static_fixed[code] = fixed[mine]
                if code == 0:
                    self.static[kind][rows] = parts["static_bytes"][0][mine]
                if code == 0 and first:
                    for label, (_, intercepts) in parts.items():
                        for where, value in intercepts.items():
                            self.fixed[f"{where}_{label}"][rows] += value[mine]
        if not first:
            return  # layer-independent parts from the first layer's kind
        for code, name in ((1, "selective_workspace_bytes"), (2, "full_workspace_bytes")):
            self.fixed[name][rows] = np.maximum(static_fixed[code] - static_fixed[0], 0.0)
        loop = _as_one_f_one_b({**sub, "recompute": np.zeros(n, dtype=np.int64)}, V_PLACED_STATIC)
        self.embedding_bytes[rows] = sum(
            (2.0 * one - two)
            for one, two in (
                (_value(t, loop, probes[0], n), _value(t, loop, probes[1], n))
                for t in static_terms
                if t.name in EMBEDDING_TERMS
            )
        )


STACKED_ROWS = 16384
"""Most rows probed in one evaluation of each term (``_mode_passes``)."""


def _mode_passes(n: int) -> list[tuple[int, ...]]:
    """The recompute modes probed together over ``n`` rows: all three in one evaluation of each
    term (the rows once per mode, mode-major) while that stays within ``STACKED_ROWS``, else one
    at a time. The terms are elementwise over rows, so each row's floats are those of a probe
    of its mode alone either way: on few rows the stacked probe makes a third of the calls
    (2-3x faster on 1-200 rows), on many the arrays of one mode stay in cache."""
    if NUM_RECOMPUTE_MODES * n <= STACKED_ROWS:
        return [tuple(range(NUM_RECOMPUTE_MODES))]
    return [(code,) for code in range(NUM_RECOMPUTE_MODES)]


def probe_stage_costs(
    cost_model: CostModel,
    ctx: TermContext,
    grid: Mapping[str, np.ndarray],
    *,
    deadline: float | None = None,
) -> StageCosts:
    """``StageCosts`` of ``cost_model`` over the rows of ``grid`` (every axis; ``recompute`` is
    ignored: each mode is probed)."""
    size = len(grid["pp"])
    model = ctx.model
    kinds_in_order = layer_kinds(model)
    num_mtp, mtp_kind = mtp_layers(model)
    kinds = tuple(dict.fromkeys((*kinds_in_order, *([mtp_kind] if num_mtp else []))))
    found = _Probes(kinds, size)
    fixed = found.fixed
    pp_all = np.asarray(grid["pp"], dtype=np.int64)
    static_terms = tuple(
        t for t in cost_model.static_memory_terms if t.name not in LAST_AS_SINGLE_STAGE
    )
    single_terms = tuple(
        t for t in cost_model.static_memory_terms if t.name in LAST_AS_SINGLE_STAGE
    )
    for p in np.unique(pp_all):
        rows = np.flatnonzero(pp_all == p)
        sub = {a: np.asarray(v)[rows] for a, v in grid.items()}
        n = len(rows)
        for kind in kinds:
            check_deadline(deadline)  # --time-limit covers probing (autopar.base.deadline)
            found.probe(
                cost_model, ctx, static_terms, kind, rows, sub, first=kind == kinds_in_order[0]
            )
        one = {**sub, "pp": np.ones(n, dtype=np.int64), "recompute": np.zeros(n, dtype=np.int64)}
        for term in single_terms:
            value = np.asarray(term.evaluate(one, ctx), dtype=np.float64)
            fixed["last_activation_bytes"][rows] += np.broadcast_to(value, (n,))
    if not model.tied_embeddings:
        # The untied output layer has the input embedding's shape: the last stage holds its
        # parameters (the cost model counts them only with pp == 1, on the first stage).
        # Under a V the output layer's bytes are what the uniform model adds for it on the
        # first rank (V rows' static bytes are probed loop-placed, V_PLACED_STATIC), not the
        # layer-free part of the probes, which also holds what is alike on every stage (the
        # ZeRO-3 prefetch buffer: kept as it was for the loop-placed rows).
        output = np.where(_v_rows(grid), _v_output_bytes(static_terms, grid, ctx), 0.0)
        output = np.where(_v_rows(grid), output, found.embedding_bytes)
        fixed["last_static_bytes"] += np.where(pp_all > 1, output, 0.0)
    if num_mtp:
        # each MTP module: one more layer and one more pass through the output layer and loss
        fixed["last_time_s"] += num_mtp * (found.time[mtp_kind][:, 0] + fixed["last_time_s"])
        fixed["last_weight_s"] += num_mtp * (found.weight[mtp_kind][:, 0] + fixed["last_weight_s"])
        fixed["last_static_bytes"] += num_mtp * found.static[mtp_kind]
        fixed["last_activation_bytes"] += num_mtp * found.act[mtp_kind][:, 0]
    step = np.zeros(size)
    for term in cost_model.step_terms:
        step = step + _value(term, grid, ctx, size)
    return StageCosts(
        layer_kinds=kinds_in_order,
        time_s=found.time,
        weight_s=found.weight,
        activation_bytes=found.act,
        static_bytes=found.static,
        step_time_s=step,
        **fixed,
    )
