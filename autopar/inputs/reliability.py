"""The failure model of a cluster (issue 22): how often a GPU fails, how long a restart takes,
and how fast a checkpoint reaches storage.

The defaults come from the one public record of a frontier run at this scale, Meta's Llama 3
405B pre-training on 16,384 H100s (Grattafiori et al. 2024, "The Llama 3 Herd of Models",
arXiv 2407.21783):

- §3.3.4: "During a 54-day snapshot period of pre-training, we experienced a total of 466 job
  interruptions. Of these, 47 were planned ... The remaining 419 were unexpected". Counting every
  unexpected interruption against the GPUs (one job of 16,384), a GPU interrupts the job once
  per 54 x 24 x 16,384 / 419 = 50,677 GPU-hours (``DEFAULT_GPU_MTBF_HOURS``); a job of ``n``
  GPUs then fails at ``n / 50,677`` per hour (failures in series: the job stops when any GPU
  does; Kokolis et al., HPCA 2025, project their clusters' job MTTF the same way).
- §3.3.1: the Tectonic storage fabric "supports a sustainable throughput of 2 TB/s"; shared by
  the job's 16,384 GPUs that is 122 MB/s per GPU (``DEFAULT_CHECKPOINT_BYTES_PER_S_PER_GPU``),
  0.98 GB/s per 8-GPU server.

The restart time (detect, re-schedule, start the processes, load the checkpoint) has no published
figure for that run; ``DEFAULT_RESTART_S`` (10 minutes) is an assumption, and the Llama 3
figures bound it: above 90% effective training time with 466 interruptions in 54 days leaves at
most 16.7 minutes per interruption for restart and lost work together (benchmarks/README.md,
"goodput").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autopar.base.errors import InputError, excerpt

LLAMA3_GPUS = 16_384
LLAMA3_WINDOW_HOURS = 54 * 24.0
LLAMA3_UNEXPECTED_INTERRUPTIONS = 419
DEFAULT_GPU_MTBF_HOURS = LLAMA3_WINDOW_HOURS * LLAMA3_GPUS / LLAMA3_UNEXPECTED_INTERRUPTIONS
"""GPU-hours between job interruptions, per GPU (Llama 3 §3.3.4, module docstring): 50,677 h."""
DEFAULT_RESTART_S = 600.0
"""Seconds from a failure to training again, checkpoint load included (an assumption)."""
LLAMA3_STORAGE_BYTES_PER_S = 2e12
DEFAULT_CHECKPOINT_BYTES_PER_S_PER_GPU = LLAMA3_STORAGE_BYTES_PER_S / LLAMA3_GPUS
"""Storage write bandwidth per GPU (Llama 3 §3.3.1: 2 TB/s sustained for 16,384 GPUs)."""
DEFAULT_HOST_BYTES_PER_S = 64e9
"""GPU-to-host copy bandwidth of a GPU preset that gives none: PCIe Gen5 x16, 128 GB/s both
directions (the H100 / H200 datasheets' "PCIe Gen5: 128 GB/s") = 64 GB/s per direction."""
MAX_MTBF_HOURS = 1e9
MAX_RESTART_S = 1e7
MAX_CHECKPOINT_GB_PER_S = 1e6


def _positive_finite(value: object, name: str, maximum: float) -> float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and 0 < value <= maximum):
        raise InputError(
            f"must be a finite number > 0 and <= {maximum:g}, got {excerpt(value)}", field=name
        )
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReliabilitySpec:
    """The cluster's failure model (module docstring for the defaults and their sources)."""

    gpu_mtbf_hours: float = DEFAULT_GPU_MTBF_HOURS
    """Hours between job-stopping failures, per GPU (cluster file ``gpu_mtbf_hours``,
    ``--gpu-mtbf-hours``): a job of ``n`` GPUs is interrupted every ``gpu_mtbf_hours / n``."""
    restart_s: float = DEFAULT_RESTART_S
    """Seconds from a failure to training again: detection, re-scheduling, process start-up and
    the checkpoint load (``restart_s``, ``--restart-s``)."""
    checkpoint_bytes_per_s: float | None = None
    """Storage write bandwidth of one server (``checkpoint_gb_per_s``, ``--checkpoint-gb-per-s``),
    shared by its GPUs; ``None``: ``DEFAULT_CHECKPOINT_BYTES_PER_S_PER_GPU`` per GPU."""

    def __post_init__(self) -> None:
        _positive_finite(self.gpu_mtbf_hours, "gpu_mtbf_hours", MAX_MTBF_HOURS)
        _positive_finite(self.restart_s, "restart_s", MAX_RESTART_S)
        if self.checkpoint_bytes_per_s is not None:
            _positive_finite(
                self.checkpoint_bytes_per_s / 1e9, "checkpoint_gb_per_s", MAX_CHECKPOINT_GB_PER_S
            )

    def server_bytes_per_s(self, gpus_per_server: int) -> float:
        """The write bandwidth of one server of ``gpus_per_server`` GPUs."""
        if self.checkpoint_bytes_per_s is not None:
            return self.checkpoint_bytes_per_s
        return DEFAULT_CHECKPOINT_BYTES_PER_S_PER_GPU * gpus_per_server

    def job_mtbf_s(self, num_gpus: int) -> float:
        """Mean seconds between interruptions of a job on ``num_gpus`` GPUs (failures in series)."""
        return self.gpu_mtbf_hours * 3600.0 / num_gpus


RELIABILITY_KEYS: dict[str, str] = {
    # cluster-file key -> ReliabilitySpec field (and its scale to the field's unit)
    "gpu_mtbf_hours": "gpu_mtbf_hours",
    "restart_s": "restart_s",
    "checkpoint_gb_per_s": "checkpoint_bytes_per_s",
}
RELIABILITY_MAXIMA: dict[str, float] = {
    "gpu_mtbf_hours": MAX_MTBF_HOURS,
    "restart_s": MAX_RESTART_S,
    "checkpoint_gb_per_s": MAX_CHECKPOINT_GB_PER_S,
}


def reliability_from_values(
    values: dict[str, object], base: ReliabilitySpec | None = None
) -> ReliabilitySpec:
    """``base`` (default: the defaults) with the values given under their cluster-file keys
    (``RELIABILITY_KEYS``; ``None`` values are left out). ``InputError`` names the key."""
    base = base or ReliabilitySpec()
    fields: dict[str, float | None] = {
        "gpu_mtbf_hours": base.gpu_mtbf_hours,
        "restart_s": base.restart_s,
        "checkpoint_bytes_per_s": base.checkpoint_bytes_per_s,
    }
    for key, value in values.items():
        if value is None:
            continue
        number = _positive_finite(value, key, RELIABILITY_MAXIMA[key])
        fields[RELIABILITY_KEYS[key]] = number * 1e9 if key == "checkpoint_gb_per_s" else number
    return ReliabilitySpec(**fields)
