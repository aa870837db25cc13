"""What a sweep assumed, once for the whole grid (issue 24): the model, each GPU type's memory,
the batch at each sequence length, precision, stack, cost model, the training size and price,
and the autopar release. Reports put it at the top (``autopar.sweeps.html``) and JSON carries it
(``SweepResult.to_dict()["inputs"]``); built from the problems the sweep checks before any solve.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from autopar.inputs.echo import parameter_count
from autopar.inputs.specs import GIB, Problem

DEFAULT_CURRENCY = "USD"
"""The label ``--gpu-hour-cost`` is priced in unless ``--currency`` names another."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuMemory:
    """One GPU type of the sweep as its rows name it (``label``) and its memory per GPU."""

    label: str
    name: str
    """The preset's own name (``h100-sxm``)."""
    memory_gib: float
    """The GPU's memory."""
    usable_gib: float
    """What layouts may use: the memory less the reserve (the capacity every fit is held to)."""
    reserve_gib: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """The global batch at one sequence length."""

    seq_len: int
    sequences: int
    tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepInputs:
    """The assumptions every point of a sweep shares, and what varies (GPU types, counts,
    sequence lengths with their batches)."""

    model: str
    parameters: int
    gpus: tuple[GpuMemory, ...]
    gpu_counts: tuple[int, ...]
    batches: tuple[Batch, ...]
    precision: str
    grad_precision: str
    fp8_recipe: str | None
    stack: str
    framework: str
    cost_model: str
    train_tokens: float | None
    gpu_hour_cost: float | None
    currency: str
    version: str

    def gpu(self, label: str) -> GpuMemory | None:
        return next((g for g in self.gpus if g.label == label), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sweep_inputs(
    problems: Mapping[tuple[str, int, int], Problem],
    *,
    gpu_counts: Sequence[int],
    cost_model: str,
    train_tokens: float | None,
    gpu_hour_cost: float | None,
    currency: str,
    version: str,
) -> SweepInputs | None:
    """The shared inputs of the valid points, keyed ``(gpu label, seq_len, gpus)``; ``None``
    when there are none."""
    if not problems:
        return None
    first = next(iter(problems.values()))
    gpus: dict[str, GpuMemory] = {}
    batches: dict[int, Batch] = {}
    for (label, seq_len, _), problem in problems.items():
        cluster, training = problem.cluster, problem.training
        gpus.setdefault(
            label,
            GpuMemory(
                label=label,
                name=cluster.gpu.name,
                memory_gib=cluster.gpu.memory_bytes / GIB,
                usable_gib=cluster.usable_memory_bytes / GIB,
                reserve_gib=cluster.memory_reserve_bytes / GIB,
            ),
        )
        batches.setdefault(
            seq_len,
            Batch(
                seq_len=seq_len,
                sequences=training.global_batch_sequences,
                tokens=training.global_batch_tokens,
            ),
        )
    training = first.training
    return SweepInputs(
        model=first.model.name,
        parameters=parameter_count(first.model),
        gpus=tuple(gpus.values()),
        gpu_counts=tuple(gpu_counts),
        batches=tuple(batches[s] for s in sorted(batches)),
        precision=training.precision,
        grad_precision=training.grad_precision,
        fp8_recipe=training.stack.fp8_recipe if training.precision == "fp8" else None,
        stack=training.stack.name,
        framework=first.options.framework,
        cost_model=cost_model,
        train_tokens=train_tokens,
        gpu_hour_cost=gpu_hour_cost,
        currency=currency,
        version=version,
    )
