"""The GPU and the cluster as frozen specs (``autopar.inputs.specs`` re-exports them):
datasheet figures and the node's shape, validated once in ``__post_init__``."""

from __future__ import annotations

from dataclasses import dataclass, field

from autopar.base.errors import InputError, excerpt
from autopar.inputs.checks import non_negative as _non_negative
from autopar.inputs.checks import positive as _positive
from autopar.inputs.checks import positive_number as _positive_number
from autopar.inputs.reliability import ReliabilitySpec

GIB = 1024**3
BLACKWELL_GENERATIONS: frozenset[str] = frozenset({"blackwell", "blackwell-ultra"})
"""NVIDIA generations of compute capability 10.x (B200 / GB200 sm_100, B300 / GB300 sm_103), with
NVLink 5: the cost model's Blackwell facts (each cites its own evidence where it is used) read
this one set."""
GENERATION_FORMATS: dict[str, tuple[str, ...]] = {
    "ampere": (),
    "hopper": (),
    "blackwell": ("mxfp8", "nvfp4"),
    "blackwell-ultra": ("mxfp8", "nvfp4"),
    "cdna3": (),
    "cdna4": ("mxfp8",),
}
"""GPU generation -> the block-scaled formats its tensor cores run. MXFP8 and NVFP4 need compute
capability 10.0 (Transformer Engine ``pytorch/quantization.py`` ``_compute_mxfp8_support`` and
``_compute_nvfp4_support``, L162-175: "Device compute capability 10.0 or higher required");
AMD CDNA 4 (MI350 series) runs the OCP MX formats (E8M0 scales per 32 elements: MXFP8, MXFP6,
MXFP4; AMD CDNA 4 white paper), not NVFP4's E4M3 scales per 16 elements. A GPU file may name
its ``generation``; without one no block-scaled format is assumed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One accelerator and its node, from the vendor datasheet (presets cite it)."""

    name: str
    memory_bytes: int
    """Total device memory as the driver reports it."""
    peak_bf16_flop_per_s: float
    """Dense (no sparsity) BF16 tensor-core peak."""
    peak_fp8_flop_per_s: float | None
    """Dense FP8 peak; ``None`` where the GPU has no FP8 tensor cores."""
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    """Scale-up bandwidth per GPU, per direction."""
    nic_bytes_per_s: float
    """Scale-out (network) bandwidth per GPU, per direction."""
    gpus_per_node: int
    """GPUs that share the NVLink domain (8 on DGX/HGX, 72 on GB200 NVL72)."""
    description: str = ""
    gemm_efficiency: float | None = None
    """Measured fraction of the BF16 peak that training GEMMs sustain (``None``: the cost model's
    calibrated default); Hopper presets carry the value measured on an H200."""
    fp8_gemm_efficiency: float | None = None
    """The same for FP8 GEMMs against the FP8 peak."""
    peak_fp4_flop_per_s: float | None = None
    """Dense FP4 peak (NVFP4 on NVIDIA, MXFP4 on AMD); ``None`` where there are no FP4 tensor
    cores."""
    fp4_gemm_efficiency: float | None = None
    """Fraction of the FP4 peak that NVFP4 training GEMMs sustain (``None``: the cost model's)."""
    generation: str = ""
    """Architecture generation (``GENERATION_FORMATS``): which block-scaled formats exist."""
    attention_exp_per_s: float | None = None
    """Exponentials per second of the special-function units (MUFU ``ex2``), the bound of the
    fused-attention forward on Blackwell (``None``: attention is priced as its GEMMs)."""
    host_bytes_per_s: float | None = None
    """GPU <-> host copy bandwidth per direction (PCIe, or NVLink-C2C on Grace parts): activation
    CPU offloading (``None``: offloaded bytes are not priced) and the asynchronous checkpoint's
    snapshot (``None``: ``autopar.inputs.reliability.DEFAULT_HOST_BYTES_PER_S``)."""
    gpus_per_server: int | None = None
    """GPUs of one host (a GB200 NVL72 compute tray holds 4): the unit that fails and is
    replaced, and that shares the storage NICs; ``None``: ``gpus_per_node``."""

    def __post_init__(self) -> None:
        _positive(self.memory_bytes, "memory_gib")
        if self.generation not in ("", *GENERATION_FORMATS):
            known = ", ".join(GENERATION_FORMATS)
            raise InputError(
                f"must be one of {known}, got {excerpt(self.generation)}", field="generation"
            )
        for name in ("peak_fp4_flop_per_s", "attention_exp_per_s", "host_bytes_per_s"):
            if getattr(self, name) is not None:
                _positive_number(getattr(self, name), name)
        for name in ("gemm_efficiency", "fp8_gemm_efficiency", "fp4_gemm_efficiency"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, float) and 0.0 < value <= 1.0):
                raise InputError(f"must be a number in (0, 1], got {value!r}", field=name)
        _positive(self.gpus_per_node, "gpus_per_node")
        if self.gpus_per_server is not None:
            _positive(self.gpus_per_server, "gpus_per_server")
        for name in (
            "peak_bf16_flop_per_s",
            "hbm_bytes_per_s",
            "nvlink_bytes_per_s",
            "nic_bytes_per_s",
        ):
            _positive_number(getattr(self, name), name)
        if self.peak_fp8_flop_per_s is not None:
            _positive_number(self.peak_fp8_flop_per_s, "peak_fp8_flop_per_s")

    def runs(self, block_format: str) -> bool:
        """Whether the tensor cores run ``block_format`` (``mxfp8``, ``nvfp4``) natively."""
        return block_format in GENERATION_FORMATS.get(self.generation, ())

    def peak_flop_per_s(self, precision: str) -> float:
        """Dense tensor-core peak for the training precision (NVFP4: the FP4 peak)."""
        if precision == "nvfp4":
            if self.peak_fp4_flop_per_s is None or not self.runs("nvfp4"):
                generation = self.generation or "not given"
                raise InputError(
                    f"nvfp4 needs NVIDIA Blackwell tensor cores (generation blackwell or "
                    f"blackwell-ultra: compute capability 10.0) and a peak_fp4_tflop_per_s; "
                    f"{self.name} (generation {generation}) has none: use fp8 or bf16",
                    field="precision",
                )
            return self.peak_fp4_flop_per_s
        if precision == "fp8":
            if self.peak_fp8_flop_per_s is None:
                raise InputError(
                    f"{self.name} has no FP8 tensor cores; use --precision bf16", field="precision"
                )
            return self.peak_fp8_flop_per_s
        return self.peak_bf16_flop_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """The GPUs of the job and how they are connected."""

    gpu: GpuSpec
    gpus_per_node: int
    """NVLink domain size used for placement (defaults to the GPU preset's)."""
    intra_node_latency_s: float = 5e-6
    """Per-step latency of an NVLink collective (NCCL ring step order of magnitude)."""
    inter_node_latency_s: float = 12e-6
    """Per-step latency of a collective crossing the network (InfiniBand/RoCE magnitude)."""
    comm_profile_path: str | None = None
    """A communication profile fitted from nccl-tests logs (``autopar calibrate``)."""
    memory_reserve_bytes: int = 0
    """Memory the user keeps free on each GPU, on top of the cost model's workspace term."""
    reliability: ReliabilitySpec = field(default_factory=ReliabilitySpec)
    """How often GPUs fail, how long a restart takes, how fast checkpoints are written
    (``autopar.inputs.reliability``; cluster-file keys and flags override the defaults)."""

    def __post_init__(self) -> None:
        _positive(self.gpus_per_node, "gpus_per_node")
        if not isinstance(self.reliability, ReliabilitySpec):
            raise InputError(
                f"must be a ReliabilitySpec, got {self.reliability!r}", field="reliability"
            )
        _positive_number(self.intra_node_latency_s, "intra_node_latency_s")
        _positive_number(self.inter_node_latency_s, "inter_node_latency_s")
        _non_negative(self.memory_reserve_bytes, "memory_reserve_gib")
        if self.memory_reserve_bytes > self.gpu.memory_bytes:
            raise InputError(
                f"must be at most the GPU's memory ({self.gpu.memory_bytes / GIB:.1f} GiB)",
                field="memory_reserve_gib",
            )

    @property
    def usable_memory_bytes(self) -> int:
        return self.gpu.memory_bytes - self.memory_reserve_bytes

    @property
    def gpus_per_server(self) -> int:
        """GPUs of one host (the failure and storage unit): the GPU preset's, else the NVLink
        domain (an 8-GPU HGX / DGX node is one host)."""
        return self.gpu.gpus_per_server or self.gpus_per_node
