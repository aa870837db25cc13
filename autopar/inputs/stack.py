"""The training stack: what the software does that no layout axis captures (issue 11).

A ``StackSpec`` names the switches of a Megatron-LM / NeMo / Megatron-Bridge release that change
step time or memory: fused attention, the communication overlaps, the context-parallel
communication, the FP8 recipe and which GEMMs run in FP8, the gradient-reduction dtype, whether
dropout masks are stored, and the memory the user keeps free. Presets live in
``autopar/presets/stacks/*.yaml`` (``autopar stacks``); every switch is also a CLI flag and an API
argument that overrides the preset. ``DEFAULT_STACK`` is what ``solve`` and ``evaluate`` use when
no stack is named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from autopar.base.errors import InputError, excerpt

DEFAULT_STACK = "megatron-lm"
"""The stack assumed when none is named (stated in README and in every output)."""

CP_COMM_TYPES: tuple[str, ...] = ("p2p", "a2a", "a2a+p2p")
"""Megatron ``--cp-comm-type`` (transformer_config.py ``cp_comm_type``): ``p2p`` ring
(Transformer Engine ``AttnFuncWithCPAndKVP2P``), ``a2a`` (Ulysses, DeepSpeed), ``a2a+p2p``
(hierarchical: a2a inside ``cp_a2a_size`` ranks, ring across)."""
FP8_RECIPES: tuple[str, ...] = ("delayed", "current", "blockwise", "mxfp8")
"""Megatron ``--fp8-recipe`` (``delayed``, ``tensorwise`` = current scaling, ``blockwise``,
``mxfp8``; ``megatron/training/arguments.py``). ``mxfp8`` needs Blackwell tensor cores."""
FP8_RECIPE_ALIASES: dict[str, str] = {"tensorwise": "current", "cs": "current"}
FP8_GEMMS: tuple[str, ...] = ("qkv", "proj", "fc1", "fc2", "attention", "logits")
"""GEMMs that may run in FP8: the four linear layers of a block (Transformer Engine ``fp8_autocast``
covers them), the attention core (``--fp8-dot-product-attention``) and the output layer (kept in
BF16 by Megatron and NeMo)."""
DEFAULT_FP8_GEMMS: tuple[str, ...] = ("qkv", "proj", "fc1", "fc2")
MOE_DISPATCHERS: tuple[str, ...] = ("alltoall", "allgather", "flex")
"""Megatron ``--moe-token-dispatcher-type`` values (``moe/token_dispatcher.py``); ``flex`` runs
DeepEP / HybridEP, which a cluster must have installed."""
GRAD_DTYPES: tuple[str, ...] = ("fp32", "bf16")


@dataclass(frozen=True, slots=True, kw_only=True)
class StackSpec:
    """A training software stack (module docstring). Field names are the YAML keys, the API
    arguments and, with ``-`` for ``_``, the CLI flags."""

    name: str
    description: str = ""
    flash_attention: bool = True
    """Fused attention (FlashAttention / cuDNN): scores never stored, causal half skipped."""
    tp_comm_overlap: bool = False
    """Megatron ``--tp-comm-overlap`` (Transformer Engine userbuffers)."""
    overlap_grad_reduce: bool = True
    """Megatron ``--overlap-grad-reduce``: gradient buckets reduce during the backward."""
    overlap_param_gather: bool = True
    """Megatron ``--overlap-param-gather``: distributed-optimizer gathers during the forward."""
    pp_comm_overlap: bool = False
    """Pipeline send/recv overlapped with compute (Megatron ``overlap_p2p_comm`` with
    interleaving, ``--overlap-p2p-communication``)."""
    cp_comm_type: str = "p2p"
    ep_comm_overlap: bool = False
    """Expert all-to-all overlapped with the other micro-batch's compute (Megatron
    ``--overlap-moe-expert-parallel-comm``, 1F1B A2A overlap)."""
    fp8_recipe: str = "delayed"
    fp8_gemms: tuple[str, ...] = DEFAULT_FP8_GEMMS
    moe_dispatchers: tuple[str, ...] = ("alltoall", "allgather")
    """Token dispatchers the MoE layers may use; the cost model prices the fastest for each
    layout, so the search chooses it, and the output sets it (``--moe-token-dispatcher-type``).
    Megatron ships ``alltoall`` and ``allgather``; ``flex`` needs DeepEP and is opt-in."""
    grad_reduce_dtype: str = "fp32"
    """Gradient buffer and reduction dtype: Megatron-LM's default keeps FP32 ``main_grad``;
    NeMo's recipes reduce in BF16 (``grad_reduce_in_fp32=False``)."""
    optimizer_state_dtype: str = "fp32"
    """Adam moments' dtype: ``fp32`` (Megatron's default) or ``bf16`` (Megatron
    ``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``,
    arguments.py L3667-3684; Megatron-Bridge 25.09's MoE recipes: "Precision-aware optimizer
    update to support BF16 states", its changelog). FP32 master weights stay."""
    cross_entropy_fusion: bool = False
    """Fused vocab-parallel cross entropy (Megatron ``--cross-entropy-loss-fusion``; Megatron-Bridge
    recipes use Transformer Engine's): the logits are read once forward and the gradient written
    once, instead of the FP32 softmax passes of ``cross_entropy.py``."""
    dropout: bool = True
    """Hidden and attention dropout on (Megatron's 0.1 default: masks stored for backward);
    NeMo / Megatron-Bridge pretraining recipes set both to 0."""
    memory_reserve_gib: float = 0.0
    """GPU memory kept free on top of the cost model's workspace term."""
    kernel_efficiency: float = 1.0
    """Fraction of the GPU preset's tensor-core efficiency (GEMMs and fused attention) the stack's
    kernels reach. The Hopper presets' efficiencies are measured with 2026 libraries
    (``benchmarks/data/``); a mid-2024 release (cuBLAS 12.5, Transformer Engine 1.8, Megatron-Core
    0.8) ran the same models slower on the same H100s: Llama-3 8B on 8 GPUs gave 12,273
    tokens/s/GPU in NeMo 24.07 and 14,079 in Megatron-Bridge 25.09, Llama-3 70B on 64 GPUs 1,524
    and 1,619 (``benchmarks/data/published/``). 1.0 for stacks as current as the profile (and for
    the 2021 A100 stack, whose GPU efficiency was calibrated on its own runs)."""

    def __post_init__(self) -> None:
        for name in (
            "flash_attention",
            "tp_comm_overlap",
            "overlap_grad_reduce",
            "overlap_param_gather",
            "pp_comm_overlap",
            "ep_comm_overlap",
            "cross_entropy_fusion",
            "dropout",
        ):
            if not isinstance(getattr(self, name), bool):
                got = excerpt(getattr(self, name))
                raise InputError(f"must be true or false, got {got}", field=name)
        _choice(self.cp_comm_type, CP_COMM_TYPES, "cp_comm_type")
        _choice(self.fp8_recipe, FP8_RECIPES, "fp8_recipe")
        for name in ("grad_reduce_dtype", "optimizer_state_dtype"):
            if getattr(self, name) not in GRAD_DTYPES:
                raise InputError(
                    f"must be fp32 or bf16, got {excerpt(getattr(self, name))}", field=name
                )
        if not isinstance(self.fp8_gemms, tuple):
            raise InputError("must be a list of GEMM names", field="fp8_gemms")
        for gemm in self.fp8_gemms:
            _choice(gemm, FP8_GEMMS, "fp8_gemms")
        if not isinstance(self.moe_dispatchers, tuple) or not self.moe_dispatchers:
            raise InputError("must be a non-empty list of dispatchers", field="moe_dispatchers")
        for dispatcher in self.moe_dispatchers:
            _choice(dispatcher, MOE_DISPATCHERS, "moe_dispatchers")
        reserve = self.memory_reserve_gib
        number = isinstance(reserve, int | float) and not isinstance(reserve, bool)
        if not (number and math.isfinite(reserve) and 0 <= reserve <= 1 << 20):
            raise InputError(
                f"must be a number in 0..1048576, got {excerpt(reserve)}",
                field="memory_reserve_gib",
            )

        efficiency = self.kernel_efficiency
        number = isinstance(efficiency, int | float) and not isinstance(efficiency, bool)
        if not (number and math.isfinite(efficiency) and 0.1 <= efficiency <= 1.5):
            raise InputError(
                f"must be a number in 0.1..1.5, got {excerpt(efficiency)}",
                field="kernel_efficiency",
            )

    def fp8(self, gemm: str) -> bool:
        """Whether ``gemm`` runs in FP8 when the training precision is FP8."""
        return gemm in self.fp8_gemms

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["fp8_gemms"] = list(self.fp8_gemms)
        out["moe_dispatchers"] = list(self.moe_dispatchers)
        return out


STACK_KEYS: tuple[str, ...] = tuple(f.name for f in fields(StackSpec))
SWITCHES: tuple[str, ...] = tuple(k for k in STACK_KEYS if k not in ("name", "description"))
"""The keys a user may override one by one (CLI flags, API arguments)."""


def _choice(value: object, choices: tuple[str, ...], name: str) -> None:
    if value not in choices:
        raise InputError(f"must be one of {', '.join(choices)}, got {excerpt(value)}", field=name)


def normalise_switch(key: str, value: Any) -> Any:
    """A switch value as ``StackSpec`` holds it: FP8 recipe aliases resolved, GEMM lists as
    tuples (a comma-separated string is accepted)."""
    if key == "fp8_recipe" and isinstance(value, str):
        return FP8_RECIPE_ALIASES.get(value.strip().lower(), value.strip().lower())
    if key in ("fp8_gemms", "moe_dispatchers"):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        if isinstance(value, list | tuple):
            return tuple(str(v).strip() for v in value)
    numeric = key in ("memory_reserve_gib", "kernel_efficiency")
    if numeric and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def stack_from_mapping(data: dict[str, Any], *, name: str) -> StackSpec:
    """A ``StackSpec`` from preset/file keys; unknown keys are errors with a suggestion."""
    import difflib

    for key in data:
        if key not in (*STACK_KEYS, "aliases", "source"):
            close = difflib.get_close_matches(str(key), STACK_KEYS, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InputError(f"unknown stack key{hint}", field=str(key))
    values = {k: normalise_switch(k, v) for k, v in data.items() if k in STACK_KEYS}
    values.setdefault("name", name)
    values["name"] = str(values["name"])
    values["description"] = str(values.get("description", ""))
    return StackSpec(**values)


def with_overrides(stack: StackSpec, overrides: dict[str, Any]) -> StackSpec:
    """``stack`` with the given switches replaced (``None`` values are ignored)."""
    import dataclasses

    given = {k: normalise_switch(k, v) for k, v in overrides.items() if v is not None}
    unknown = set(given) - set(SWITCHES)
    if unknown:
        raise InputError(f"unknown stack switch(es): {', '.join(sorted(unknown))}")
    return dataclasses.replace(stack, **given) if given else stack
