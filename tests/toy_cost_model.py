"""A small cost model that follows the term protocol, for solver tests independent of the
default model's physics: compute shrinks with every parallel dimension, communication grows with
tp/pp/dp, memory shrinks with tp*pp, ZeRO and recompute."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.costs.terms import CostModel, TermContext


@dataclass(frozen=True, slots=True, kw_only=True)
class Term:
    name: str
    category: str
    depends_on: tuple[str, ...]
    formula: object

    def evaluate(self, grid, ctx: TermContext) -> np.ndarray:
        g = {k: np.asarray(v, dtype=np.float64) for k, v in grid.items()}
        return np.asarray(self.formula(g, ctx), dtype=np.float64)


def _work(ctx: TermContext) -> float:
    m, t = ctx.model, ctx.training
    return 24.0 * m.num_layers * m.hidden_size**2 * t.seq_len * 1e-15


@dataclass(frozen=True, slots=True, kw_only=True)
class Flops:
    def model_flop(self, grid, ctx):
        return np.full(len(grid["tp"]), 3 * _work(ctx) * ctx.training.global_batch_sequences * 1e15)

    def hardware_flop(self, grid, ctx):
        return self.model_flop(grid, ctx)


def toy_cost_model(weights: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0)) -> CostModel:
    a, b, c, d = weights
    return CostModel(
        name="toy",
        step_terms=(
            Term(
                name="dp_s",
                category="dp_comm",
                depends_on=("dp", "tp", "pp", "zero"),
                formula=lambda g, x: (
                    c * 0.01 * np.log2(g["dp"] + 1) / (g["tp"] * g["pp"]) * (1 + 0.1 * g["zero"])
                ),
            ),
        ),
        microbatch_terms=(
            Term(
                name="compute_s",
                category="compute",
                depends_on=("tp", "pp", "cp", "mbs", "recompute"),
                formula=lambda g, x: (
                    a
                    * _work(x)
                    * g["mbs"]
                    / (g["tp"] * g["pp"] * g["cp"])
                    * (1 + 0.3 * g["recompute"])
                    * (1 + 0.2 / g["mbs"])
                ),
            ),
            Term(
                name="tp_s",
                category="tp_comm",
                depends_on=("tp", "mbs", "cp"),
                formula=lambda g, x: b * 1e-4 * (g["tp"] - 1) * g["mbs"] / g["cp"],
            ),
            Term(
                name="cp_s",
                category="cp_comm",
                depends_on=("cp",),
                formula=lambda g, x: d * 2e-4 * (g["cp"] - 1),
            ),
        ),
        slots=Term(
            name="pipeline_slots",
            category="bubble",
            depends_on=("pp", "vpp", "grad_accum"),
            formula=lambda g, x: g["grad_accum"] + (g["pp"] - 1) / g["vpp"],
        ),
        static_memory_terms=(
            Term(
                name="states_bytes",
                category="optimizer",
                depends_on=("tp", "pp", "dp", "zero"),
                formula=lambda g, x: (
                    16e9 / (g["tp"] * g["pp"]) * np.where(g["zero"] > 0, 0.25 + 0.75 / g["dp"], 1.0)
                ),
            ),
        ),
        microbatch_memory_terms=(
            Term(
                name="activation_bytes",
                category="activations",
                depends_on=("tp", "cp", "mbs", "recompute", "pp"),
                formula=lambda g, x: (
                    4e9 * g["mbs"] / (g["tp"] * g["cp"] * g["pp"]) / (1 + 2 * g["recompute"])
                ),
            ),
        ),
        in_flight=Term(
            name="in_flight",
            category="activations",
            depends_on=("pp", "vpp", "grad_accum"),
            formula=lambda g, x: (
                np.minimum(g["pp"], g["grad_accum"]) * (1 + (g["pp"] - 1) / (g["pp"] * g["vpp"]))
            ),
        ),
        flops=Flops(),
    )
