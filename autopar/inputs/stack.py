"""The training stack: what the software does that no layout axis captures (issue 11).

A ``StackSpec`` names the switches of a Megatron-LM / NeMo / Megatron-Bridge release that change
step time or memory: fused attention, the communication overlaps, the context-parallel
communication, the FP8 recipe and which GEMMs run in FP8, the gradient-reduction dtype, whether
dropout masks are stored, and the memory the user keeps free. Presets live in
``autopar/presets/stacks/*.yaml`` (``autopar stacks``). ``DEFAULT_STACK`` is what ``solve`` and
``evaluate`` use when no stack is named.

Each switch is declared once, as a ``StackSpec`` field made by ``switch()``: its metadata (help,
the values it takes, the API keyword and CLI flag when they differ from the field name) is what
the YAML loader checks, what ``Switch`` hands on, and what generates the CLI options
(``autopar.cli.options``), the API keywords (``autopar.inputs.problem``) and the ``autopar
stacks`` table, the way Megatron-Core generates its arguments from ``TransformerConfig`` field
metadata (``ArgumentGroupFactory``, ``megatron/training/arguments.py``). Adding a switch is one
field here, plus the cost terms and emitters that read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
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
CUDA_GRAPHS: tuple[str, ...] = ("none", "layers", "full")
"""What CUDA graphs capture (Megatron ``--cuda-graph-impl`` / ``--cuda-graph-modules``,
transformer_config.py L1075 / L1090): ``none``; ``layers``: per-layer Transformer Engine graphs
(``transformer_engine`` over ``attn``, ``moe_router``, ``moe_preprocess``: the MoE router and
the dispatcher's host sync run inside the graph); ``full``: the whole forward-backward of a step
(``full_iteration``, Megatron-Bridge's ``local`` + ``full_iteration``)."""
RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn", "mla_up_proj", "layernorm", "moe_act")
"""What selective recomputation re-runs (Megatron ``--recompute-modules``, transformer_config.py
L560-583): the attention core; MLA's up-projections and RoPE; the two norms of a layer
(``input_layernorm``, ``pre_mlp_layernorm``); the routed experts' activation function. The
last three discard their outputs (output-discarding checkpoints)."""
EAGER_ACTIVATIONS: tuple[str, ...] = ("relu2",)
"""Activations whose eager op sequence ``cost_models.compute`` prices
(``EAGER_ACTIVATION_BYTES``)."""
DEFAULT_RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn", "mla_up_proj")
"""autopar's ``selective``: the attention core, with MLA's up-projections (Megatron-Bridge's
DeepSeek recipes' ``mla_up_proj``; it has no effect on other attention)."""


def switch(
    default: Any,
    *,
    help: str,
    choices: tuple[str, ...] = (),
    aliases: dict[str, str] | None = None,
    bounds: tuple[float, float] | None = None,
    keyword: str = "",
    label: str = "",
) -> Any:
    """A ``StackSpec`` field that users may override one by one (module docstring): ``help`` for
    ``--help`` and ``autopar stacks``; ``choices`` the values a text switch (or each entry of a
    list switch) takes, with ``aliases`` for other spellings; ``bounds`` the closed range of a
    number; ``keyword`` the API keyword and CLI flag when not the field name; ``label`` the
    short name in ``autopar stacks``."""
    metadata = {
        "help": help,
        "choices": choices,
        "aliases": aliases or {},
        "bounds": bounds,
        "keyword": keyword,
        "label": label,
    }
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, slots=True, kw_only=True)
class StackSpec:
    """A training software stack (module docstring). Field names are the YAML keys; each
    switch's API keyword and CLI flag are its ``Switch``'s."""

    name: str
    description: str = ""
    flash_attention: bool = switch(
        True,
        help="Fused attention (FlashAttention / cuDNN): scores never stored, causal half skipped.",
        label="flash",
    )
    tp_comm_overlap: bool = switch(
        False,
        help="TP communication overlapped (Megatron --tp-comm-overlap, TE userbuffers).",
        label="tp overlap",
    )
    tp_backward_overlap: bool = switch(
        False,
        help="Without TP overlap, the column-parallel layers' backward all-gather and "
        "reduce-scatter run async behind their dgrad / wgrad GEMMs (Transformer Engine and "
        "megatron-core linear layers); only the row-parallel output-gradient all-gather waits.",
        label="tp bwd async",
    )
    """Transformer Engine ``LayerNormLinear.backward`` gathers the saved input with
    ``async_op=True`` behind the dgrad GEMM and reduce-scatters (all-reduces without SP) the
    dgrad with ``async_op=True`` behind the wgrad GEMM, waiting at the end
    (transformer_engine/pytorch/module/layernorm_linear.py L787-791, L904-910, L1125-1130;
    ``Linear`` the same, linear.py L993-997); the row-parallel layers' output gradient is
    gathered synchronously before both GEMMs (module/base.py ``grad_output_preprocess``
    L1702-1709). megatron-core's own layers do the same
    (tensor_parallel/layers.py ``LinearWithGradAccumulationAndAsyncCommunication`` L675-708).
    Read only when ``tp_comm_overlap`` is off (userbuffers overlap all of it)."""
    overlap_grad_reduce: bool = switch(
        True,
        help="DP gradient buckets reduce during the backward (Megatron --overlap-grad-reduce).",
        label="grad overlap",
    )
    overlap_param_gather: bool = switch(
        True,
        help="Distributed-optimizer gathers during the forward (Megatron --overlap-param-gather).",
        label="param overlap",
    )
    pp_comm_overlap: bool = switch(
        False,
        help="Pipeline send/recv overlapped with compute (Megatron --overlap-p2p-communication, "
        "with interleaving).",
        label="pp overlap",
    )
    cp_comm_type: str = switch(
        "p2p",
        help="CP communication (Megatron --cp-comm-type).",
        choices=CP_COMM_TYPES,
        label="cp comm",
    )
    ep_comm_overlap: bool = switch(
        False,
        help="The stack may run Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm: "
        "one micro-batch's expert all-to-all behind another's compute): the default "
        "--pipeline-schedule then includes combined-1f1b.",
        label="ep overlap",
    )
    fp8_recipe: str = switch(
        "delayed",
        help="FP8 scaling recipe (Megatron --fp8-recipe; tensorwise = current).",
        choices=FP8_RECIPES,
        aliases=FP8_RECIPE_ALIASES,
        label="fp8 recipe",
    )
    fp8_gemms: tuple[str, ...] = switch(
        DEFAULT_FP8_GEMMS,
        help="GEMMs that run in FP8 when the precision is FP8.",
        choices=FP8_GEMMS,
        label="fp8 gemms",
    )
    recompute_modules: tuple[str, ...] = switch(
        DEFAULT_RECOMPUTE_MODULES,
        help="What --recompute selective re-runs: core_attn, mla_up_proj, layernorm, moe_act "
        "(Megatron --recompute-modules).",
        choices=RECOMPUTE_MODULES,
        label="recompute modules",
    )
    moe_dispatchers: tuple[str, ...] = switch(
        ("alltoall", "allgather"),
        help="Token dispatchers the MoE layers may use; the cost model prices the fastest for "
        "each layout, so the search chooses it, and the output sets it "
        "(--moe-token-dispatcher-type). flex needs DeepEP and is opt-in.",
        choices=MOE_DISPATCHERS,
        label="dispatchers",
    )
    grad_reduce_dtype: str = switch(
        "fp32",
        help="Gradient buffer and reduction dtype: fp32 (Megatron-LM's main_grad) or bf16 "
        "(NeMo's grad_reduce_in_fp32=False).",
        choices=GRAD_DTYPES,
        keyword="grad_precision",
        label="grads",
    )
    optimizer_state_dtype: str = switch(
        "fp32",
        help="Adam moments in fp32 or bf16 (Megatron --use-precision-aware-optimizer); FP32 "
        "master weights stay.",
        choices=GRAD_DTYPES,
        label="adam states",
    )
    """BF16 moments: Megatron ``--use-precision-aware-optimizer --exp-avg-dtype bf16
    --exp-avg-sq-dtype bf16`` (arguments.py L3667-3684); Megatron-Bridge 25.09's MoE recipes
    ("Precision-aware optimizer update to support BF16 states", its changelog)."""
    cross_entropy_fusion: bool = switch(
        False,
        help="Fused vocab-parallel cross entropy (Megatron --cross-entropy-loss-fusion): logits "
        "read once forward and the gradient written once.",
        label="fused CE",
    )
    cross_entropy_impl: str = switch(
        "te",
        help="Which fused cross entropy runs (Megatron --cross-entropy-fusion-impl): te, "
        "Transformer Engine's one-pass kernel; native, Megatron's compiled passes in FP32.",
        choices=("te", "native"),
        label="CE impl",
    )
    """With ``cross_entropy_fusion``: ``te`` (``te_parallel_cross_entropy``) or ``native``
    (``fused_vocab_parallel_cross_entropy``, Megatron ``fusions/fused_cross_entropy.py``; the
    default of Megatron's ``cross_entropy_fusion_impl``, model_parallel_config.py L238 at
    core_v0.17.0, and what Megatron-Bridge's GPT-OSS recipes set, recipes/gpt_oss/gpt_oss.py L105
    at v0.4.0)."""
    dropout: bool = switch(
        True,
        help="Hidden and attention dropout on, masks stored for backward (Megatron's 0.1); "
        "NeMo / Megatron-Bridge pretraining recipes set both to 0.",
        label="dropout",
    )
    memory_reserve_gib: float = switch(
        0.0,
        help="GPU memory kept free per GPU (GiB), on top of the cost model's workspace.",
        bounds=(0.0, float(1 << 20)),
        label="reserve GiB",
    )
    cuda_graphs: str = switch(
        "none",
        help="CUDA graphs: none, layers (TE per-layer graphs of attention, MoE router and "
        "dispatch preprocessing) or full (the whole forward-backward): Megatron "
        "--cuda-graph-impl / --cuda-graph-modules.",
        choices=CUDA_GRAPHS,
        label="cuda graphs",
    )
    eager_activations: tuple[str, ...] = switch(
        (),
        help="MLP activations the stack's model code runs as separate eager PyTorch ops, not "
        "one fused kernel: relu2 (NeMo 2.0's squared ReLU, torch.pow(F.relu(x), 2)).",
        choices=EAGER_ACTIVATIONS,
        label="eager act",
    )
    """NeMo 2.0's ``NemotronConfig.activation_func`` is ``nemo.collections.llm.fn.activation.
    squared_relu`` (``nemotron.py`` L22 / L45 at NeMo v2.3.0 and v2.4.0), ``torch.pow(F.relu(x),
    2)`` with its fuser commented out ("# @torch.jit.script # remove until we have
    serialization", ``activation.py`` L34-37; NeMo 1.x, the 24.07 stack, had it under
    ``@jit_fuser``: ``nlp/modules/common/megatron/utils.py`` L184-186 at v2.0.0rc0), and
    Megatron's MLP calls it as is: its
    ``bias_activation_fusion`` covers GELU and SwiGLU only (``transformer/mlp.py`` L105-131 at
    core_v0.12.0). Megatron's own ``squared_relu`` (since core_v0.14.0) is ``@jit_fuser``, one
    compiled kernel (``megatron/core/activations.py`` L8-11), so the other stacks keep ()."""
    moe_fused_mlp: bool = switch(
        False,
        help="Routed experts through Transformer Engine's fused grouped MLP (Megatron "
        "--use-transformer-engine-op-fuser): biases packed, no per-expert host loop; on "
        "Blackwell with MXFP8 / NVFP4 the activation and the FC2 input cast run in the FC1 "
        "GEMM's epilogue.",
        label="fused experts",
    )
    """Megatron ``TransformerConfig.use_transformer_engine_op_fuser`` (transformer_config.py
    L525) with ``moe_grouped_gemm``: ``TEGroupedMLP`` builds the fused ops
    (``experts.py`` ``_make_fused_ops``, Transformer Engine ``ops/fused/grouped_mlp.py``: cuDNN
    CuTe-DSL grouped GEMM + GLU + quantize kernels on compute capability 10 with MXFP8 or
    NVFP4). Megatron-Bridge 26.08's MoE recipes set it (``perf_recipes/qwen/common.py``
    ``_enable_hybridep_full_iteration_mxfp8``)."""
    cpu_offload_layers: int = switch(
        0,
        help="Transformer layers whose activations are offloaded to host memory (Megatron "
        "--cpu-offloading-num-layers; GB200/GB300 over NVLink-C2C).",
        bounds=(0.0, 16384.0),
        label="offload layers",
    )
    kernel_efficiency: float = switch(
        1.0,
        help="Fraction of the GPU's GEMM / fused-attention efficiency the stack's kernels reach "
        "(0.85 for the mid-2024 stacks, 1.0 for current ones).",
        bounds=(0.1, 1.5),
        label="kernels",
    )
    """The Hopper presets' efficiencies are measured with 2026 libraries (``benchmarks/data/``);
    a mid-2024 release (cuBLAS 12.5, Transformer Engine 1.8, Megatron-Core 0.8) ran the same
    models slower on the same H100s: Llama-3 8B on 8 GPUs gave 12,273 tokens/s/GPU in NeMo
    24.07 and 14,079 in Megatron-Bridge 25.09, Llama-3 70B on 64 GPUs 1,524 and 1,619
    (``benchmarks/data/published/``). 1.0 for stacks as current as the profile (and for the 2021
    A100 stack, whose GPU efficiency was calibrated on its own runs)."""

    async_checkpoint: bool = switch(
        False,
        help="Checkpoints written in the background, only the copy to host memory blocks "
        "training (Megatron --async-save, torchtitan checkpoint.async_mode).",
        label="async ckpt",
    )
    """Megatron ``async_save`` (default False, ``megatron/training/config/training_config.py``
    L516; it needs ``--use-persistent-ckpt-worker``, or ``arguments.py`` L1814-1820 turns it off):
    ``filesystem_async.py`` L227-248 copies the shards to host memory and synchronises (the
    blocking part); a worker writes them. torchtitan ``checkpoint.async_mode`` (default
    ``disabled``, ``components/checkpointer/dcp.py`` L137)."""

    ckpt_fully_parallel_save: bool = switch(
        True,
        help="Checkpoint shards spread evenly over the data-parallel ranks that hold them "
        "(Megatron's default; --no-ckpt-fully-parallel-save: the first replica writes).",
        label="parallel ckpt",
    )
    """Megatron ``fully_parallel_save`` (default True, ``training_config.py`` L511; the flag
    ``--no-ckpt-fully-parallel-save`` turns it off): ``cost_models.checkpoint``."""

    def __post_init__(self) -> None:
        for item in SWITCHES:
            item.check(getattr(self, item.name))

    def fp8(self, gemm: str) -> bool:
        """Whether ``gemm`` runs in FP8 when the training precision is FP8."""
        return gemm in self.fp8_gemms

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Switch:
    """One stack switch as users meet it, from its ``StackSpec`` field (``switch()``)."""

    name: str
    """The field name and YAML key."""
    kind: type
    """``bool``, ``str`` (one of ``choices``), ``tuple`` (a list of ``choices``), ``float`` or
    ``int`` (both within ``bounds``)."""
    default: Any
    help: str
    choices: tuple[str, ...]
    aliases: dict[str, str]
    bounds: tuple[float, float] | None
    keyword: str
    """The API keyword (``grad_precision`` for ``grad_reduce_dtype``); the CLI flag is
    ``--`` + it with ``-`` for ``_``."""
    label: str

    @property
    def flag(self) -> str:
        return "--" + self.keyword.replace("_", "-")

    def normalise(self, value: Any) -> Any:
        """``value`` as ``StackSpec`` holds it: aliases resolved, lists as tuples (a
        comma-separated string is accepted), whole numbers as floats."""
        if self.kind is str and isinstance(value, str):
            value = value.strip().lower()
            return self.aliases.get(value, value)
        if self.kind is tuple:
            if isinstance(value, str):
                value = [v for v in value.split(",") if v.strip()]
            if isinstance(value, list | tuple):
                return tuple(str(v).strip() for v in value)
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        whole = isinstance(value, float) and math.isfinite(value) and value.is_integer()
        if self.kind is int and whole:
            return int(value)
        return value

    def check(self, value: Any) -> None:
        """``InputError`` naming the field unless ``value`` is of the switch's kind and range."""
        if self.kind is bool and not isinstance(value, bool):
            raise InputError(f"must be true or false, got {excerpt(value)}", field=self.name)
        if self.kind is str:
            _choice(value, self.choices, self.name)
        if self.kind is tuple:
            if not isinstance(value, tuple) or not value and self.name == "moe_dispatchers":
                raise InputError(f"must be a non-empty list of {self.name}", field=self.name)
            for item in value:
                _choice(item, self.choices, self.name)
        if self.kind is int:
            low, high = self.bounds or (-math.inf, math.inf)
            whole = isinstance(value, int) and not isinstance(value, bool)
            if not (whole and low <= value <= high):
                raise InputError(
                    f"must be a whole number in {_number(low)}..{_number(high)}, got "
                    f"{excerpt(value)}",
                    field=self.name,
                )
        if self.kind is float:
            low, high = self.bounds or (-math.inf, math.inf)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and low <= value <= high):
                raise InputError(
                    f"must be a number in {_number(low)}..{_number(high)}, got {excerpt(value)}",
                    field=self.name,
                )


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _switch_of(spec_field: Any) -> Switch:
    meta = spec_field.metadata
    kind = {bool: bool, str: str, float: float, int: int}.get(type(spec_field.default), tuple)
    return Switch(
        name=spec_field.name,
        kind=kind,
        default=spec_field.default,
        help=meta["help"],
        choices=meta["choices"],
        aliases=meta["aliases"],
        bounds=meta["bounds"],
        keyword=meta["keyword"] or spec_field.name,
        label=meta["label"] or spec_field.name,
    )


SWITCHES: tuple[Switch, ...] = tuple(_switch_of(f) for f in fields(StackSpec) if f.metadata)
"""The switches a user may override one by one (CLI flags, API keywords), in field order."""
SWITCH: dict[str, Switch] = {s.name: s for s in SWITCHES}
STACK_KEYS: tuple[str, ...] = tuple(f.name for f in fields(StackSpec))


def _choice(value: object, choices: tuple[str, ...], name: str) -> None:
    if value not in choices:
        raise InputError(f"must be one of {', '.join(choices)}, got {excerpt(value)}", field=name)


def normalise_switch(key: str, value: Any) -> Any:
    """A switch value (by field name) as ``StackSpec`` holds it (``Switch.normalise``)."""
    return SWITCH[key].normalise(value) if key in SWITCH else value


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
    unknown = set(given) - set(SWITCH)
    if unknown:
        raise InputError(f"unknown stack switch(es): {', '.join(sorted(unknown))}")
    return dataclasses.replace(stack, **given) if given else stack
