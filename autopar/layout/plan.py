"""Layouts and their estimates.

``Layout`` is built from the axes table (``autopar.base.axes.AXES``, which also holds the glossary
of the axes): one field per axis, under its ``Layout`` attribute name, with its default.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from autopar.base.axes import AXES, AXIS, GRID_AXES, PRODUCTS
from autopar.layout.stages import PerStage

_FIELD_TYPES = {"size": int, "mode": object, "flag": bool}


class _LayoutMethods:
    """The methods of ``Layout`` (its fields come from ``AXES``)."""

    __slots__ = ()

    def grid_row(self) -> dict[str, int]:
        """This layout as one row of a cost-term grid (integer codes for the modes)."""
        return {axis.name: axis.encode(getattr(self, axis.layout_attr)) for axis in AXES}

    @classmethod
    def from_grid_row(cls, row: dict[str, Any]) -> Layout:
        return cls(**{axis.layout_attr: axis.decode(row[axis.name]) for axis in AXES})

    @property
    def num_gpus(self) -> int:
        return math.prod(getattr(self, AXIS[a].layout_attr) for a in PRODUCTS["dp"])

    def text(self) -> str:
        """The layout on one line, axes in table order (``TP=8 PP=4 VPP=5 CP=1 DP=32 ...``)."""
        parts = []
        for axis in AXES:
            value = getattr(self, axis.layout_attr)
            if axis.show == "always" or value != axis.default:
                parts.append(axis.text(value))
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Layout = dataclasses.make_dataclass(
    "Layout",
    [
        (axis.layout_attr, _FIELD_TYPES[axis.kind])
        if axis.default is None
        else (axis.layout_attr, _FIELD_TYPES[axis.kind], dataclasses.field(default=axis.default))
        for axis in AXES
    ],
    bases=(_LayoutMethods,),
    frozen=True,
    slots=True,
    kw_only=True,
)
Layout.__module__ = __name__  # make_dataclass takes module= only from Python 3.12
Layout.__doc__ = "One parallel layout: a value for every axis of ``autopar.base.axes.AXES``."

__all__ = ["GRID_AXES", "Estimate", "Goodput", "Layout"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodput:
    """A layout's figures under failures (issue 22; ``autopar.costs.goodput`` computes them):
    the checkpoint it writes, the interval that maximises the fraction of wall time that trains,
    and that fraction."""

    num_gpus: int
    gpu_mtbf_hours: float
    restart_s: float
    job_mtbf_s: float
    """Mean seconds between interruptions of the job (``gpu_mtbf_hours * 3600 / num_gpus``)."""
    interruptions_per_day: float
    checkpoint_bytes_per_gpu: float
    """Bytes the most loaded rank writes to one checkpoint."""
    checkpoint_bytes_per_server: float
    """Bytes the most loaded server writes (its GPUs share its storage bandwidth)."""
    checkpoint_write_s: float
    """Seconds to write one checkpoint to storage."""
    checkpoint_snapshot_s: float
    """Seconds to copy a rank's shards to host memory (what an asynchronous save blocks for)."""
    checkpoint_blocking_s: float
    """Seconds training stops for each checkpoint."""
    async_checkpoint: bool
    checkpoint_interval_s: float
    """Training seconds between checkpoints (whole steps)."""
    checkpoint_interval_steps: int
    """The same in steps: Megatron ``--save-interval``, torchtitan ``checkpoint.interval``."""
    goodput: float
    """Expected fraction of wall time that trains (Daly 2006), at that interval."""
    time_per_useful_step_s: float | None
    """Expected wall seconds per step that counts: ``step_time_s / goodput``; ``None`` where the
    goodput is 0 (the job fails more often than it can finish a checkpoint interval)."""

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
    bubble_fraction: float = 0.0
    """Share of the pipeline part of the step (the micro-batch terms as the layout's schedule
    runs them) that is bubble."""
    inputs: dict[str, Any] | None = None
    """The assumptions behind the estimate (``autopar.inputs.echo``), echoed in every output."""
    choices: dict[str, str] = field(default_factory=dict)
    """What the cost model chose inside its terms for this layout (``CostModel.decisions``),
    e.g. ``{"moe_token_dispatcher": "allgather"}``; the launch configs set it."""
    per_stage: PerStage | None = None
    """The per-stage pipeline plan this estimate runs (``autopar.layout.stages``), or ``None``
    for a uniform split; its figures then replace the uniform ones."""
    error_band: dict[str, Any] | None = None
    """How far the step time may be off: the class's band (``autopar.costs.error_bands``,
    ``ErrorBand.to_dict``: ``rel_error``, ``num_runs``, ``class``, ``few_runs``, ``text``)."""

    @property
    def step_time_range_s(self) -> tuple[float, float] | None:
        """(low, high) step time within the error band, or ``None`` without one."""
        if self.error_band is None:
            return None
        rel = float(self.error_band["rel_error"])
        return self.step_time_s * (1.0 - rel), self.step_time_s * (1.0 + rel)

    goodput: Goodput | None = None
    """Checkpoint, interval and goodput under the cluster's failure model; ``None`` when the
    cost model has no checkpoint term."""
    days_to_train: float | None = None
    """Days to train on ``train_tokens`` with failures (``tokens_per_s * goodput``)."""
    days_to_train_failure_free: float | None = None
    cost: float | None = None
    """``num_gpus * hours * gpu_hour_cost`` with failures."""
    cost_failure_free: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            **({"inputs": self.inputs} if self.inputs is not None else {}),
            "fits": self.fits,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "memory_bytes": dict(self.memory_bytes),
            "capacity_bytes": self.capacity_bytes,
            "time_s": dict(self.time_s),
            "bubble_fraction": self.bubble_fraction,
            "layout": self.layout.to_dict(),
            "choices": dict(self.choices),
            **({"error_band": dict(self.error_band)} if self.error_band is not None else {}),
            "goodput": self.goodput.to_dict() if self.goodput else None,
            "days_to_train": self.days_to_train,
            "days_to_train_failure_free": self.days_to_train_failure_free,
            "cost": self.cost,
            "cost_failure_free": self.cost_failure_free,
        }
        if self.per_stage is not None:
            out.update(self.per_stage.to_dict(self.step_time_s))
        return out
