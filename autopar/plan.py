"""Layouts and their estimates.

Glossary of the canonical axes (used as names everywhere, like torchtitan's mesh axis names):

- ``tp``: tensor-parallel size (Megatron ``--tensor-model-parallel-size``).
- ``pp``: pipeline-parallel size (number of pipeline ranks).
- ``vpp``: virtual pipeline stages (model chunks) per pipeline rank; 1 = plain 1F1B.
- ``cp``: context-parallel size (the sequence split over ranks, ring attention).
- ``dp``: data-parallel size of the dense layers: ``num_gpus = tp * pp * cp * dp``.
- ``ep``: expert-parallel size, carved out of ``dp * cp`` for the expert layers (Megatron
  ``parallel_state.py``); ``etp``: tensor-parallel size inside the expert layers.
- ``mbs``: micro-batch size in sequences.
- ``grad_accum``: micro-batches per optimizer step on each DP rank
  (``global_batch = mbs*dp*grad_accum``).
- ``recompute``: activation recomputation: ``none``, ``selective`` (attention core), ``full``.
- ``zero``: optimizer sharding over the DP·CP group: 0 none, 1 optimizer states (Megatron
  distributed optimizer), 2 also gradients, 3 also parameters (FSDP).
- ``sp``: sequence parallelism in the TP region (1 on, 0 off).

Rank order is Megatron's default ``tp-cp-ep-dp-pp`` (TP fastest, PP slowest).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from autopar.specs import RECOMPUTE_MODES

# Axes of a cost-term grid; modes are integer codes there (recompute: index in RECOMPUTE_MODES).
GRID_AXES: tuple[str, ...] = (
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "etp",
    "vpp",
    "mbs",
    "grad_accum",
    "recompute",
    "zero",
    "sp",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """One parallel layout (see the module docstring for the axes)."""

    tp: int
    pp: int
    dp: int
    cp: int = 1
    ep: int = 1
    etp: int = 1
    vpp: int = 1
    mbs: int = 1
    grad_accum: int = 1
    recompute: str = "none"
    zero: int = 0
    sequence_parallel: bool = False

    def grid_row(self) -> dict[str, int]:
        """This layout as one row of a cost-term grid (integer codes for the modes)."""
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "cp": self.cp,
            "ep": self.ep,
            "etp": self.etp,
            "vpp": self.vpp,
            "mbs": self.mbs,
            "grad_accum": self.grad_accum,
            "recompute": RECOMPUTE_MODES.index(self.recompute),
            "zero": self.zero,
            "sp": int(self.sequence_parallel),
        }

    @classmethod
    def from_grid_row(cls, row: dict[str, int]) -> Layout:
        return cls(
            tp=int(row["tp"]),
            pp=int(row["pp"]),
            dp=int(row["dp"]),
            cp=int(row["cp"]),
            ep=int(row["ep"]),
            etp=int(row["etp"]),
            vpp=int(row["vpp"]),
            mbs=int(row["mbs"]),
            grad_accum=int(row["grad_accum"]),
            recompute=RECOMPUTE_MODES[int(row["recompute"])],
            zero=int(row["zero"]),
            sequence_parallel=bool(row["sp"]),
        )

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """The cost model's verdict on one layout (DESIGN §1 outputs; ``evaluate``'s JSON contract)."""

    layout: Layout
    fits: bool
    step_time_s: float
    tokens_per_s: float
    mfu: float
    """Model FLOPs (no recompute) per second over the GPUs' dense peak."""
    hfu: float
    """Executed FLOPs (with recompute) per second over the peak."""
    memory_bytes: dict[str, float]
    """``weights``, ``gradients``, ``optimizer``, ``activations``, ``other``, ``total``."""
    capacity_bytes: float
    time_s: dict[str, float]
    """``compute``, ``bubble``, ``tp_comm``, ``pp_comm``, ``dp_comm``, ``cp_comm``, ``ep_comm``,
    ``optimizer`` (and ``other`` if a cost model adds one)."""

    def to_dict(self) -> dict[str, Any]:
        layout = self.layout.to_dict()
        return {
            "fits": self.fits,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "memory_bytes": dict(self.memory_bytes),
            "capacity_bytes": self.capacity_bytes,
            "time_s": dict(self.time_s),
            "layout": {
                "tp": layout["tp"],
                "pp": layout["pp"],
                "dp": layout["dp"],
                "cp": layout["cp"],
                "ep": layout["ep"],
                "etp": layout["etp"],
                "vpp": layout["vpp"],
                "mbs": layout["mbs"],
                "grad_accum": layout["grad_accum"],
                "recompute": layout["recompute"],
                "zero": layout["zero"],
                "sequence_parallel": layout["sequence_parallel"],
            },
        }
