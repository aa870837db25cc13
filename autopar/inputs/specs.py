"""Frozen input specs: the model, the GPU / cluster, the training job and the search options.

Each spec is validated once, in ``__post_init__``, which raises ``InputError`` naming the field and
the rule and mutates nothing; derived quantities are properties. Files are turned into specs by
``autopar.inputs.loading`` only.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Literal

from autopar.base.axes import PIPELINE_SCHEDULES, RECOMPUTE_MODES, SEARCH_AXES, ZERO_STAGES
from autopar.base.errors import InputError, excerpt
from autopar.inputs.checks import non_negative as _non_negative
from autopar.inputs.checks import positive as _positive
from autopar.inputs.checks import positive_number as _positive_number
from autopar.inputs.frameworks import FRAMEWORK_SCHEDULES
from autopar.inputs.hardware import GENERATION_FORMATS as GENERATION_FORMATS
from autopar.inputs.hardware import GIB as GIB
from autopar.inputs.hardware import ClusterSpec as ClusterSpec
from autopar.inputs.hardware import GpuSpec as GpuSpec
from autopar.inputs.stack import StackSpec

MlpKind = Literal["swiglu", "geglu", "gelu", "squared_relu"]
Precision = Literal["bf16", "fp8", "nvfp4"]
Framework = Literal["megatron", "torchtitan", "deepspeed"]

MLP_KINDS: tuple[str, ...] = ("swiglu", "geglu", "gelu", "squared_relu")
GATED_MLPS: tuple[str, ...] = ("swiglu", "geglu")
"""Gated MLPs: three matrices (gate, up, down); the others have two."""
ACTIVATIONS: tuple[str, ...] = ("silu", "gelu", "gelu_tanh", "relu", "relu2")
"""The MLP's activation function: SiLU, erf GELU, tanh-approximated GELU (HF ``gelu_new`` /
``gelu_pytorch_tanh``), ReLU, squared ReLU."""
DEFAULT_ACTIVATION = {
    "swiglu": "silu",
    "geglu": "gelu_tanh",
    "gelu": "gelu",
    "squared_relu": "relu2",
}
ROPE_SCALINGS: tuple[str, ...] = ("none", "llama3", "yarn", "linear")
ROUTER_SCORES: tuple[str, ...] = ("softmax", "sigmoid")
LAYER_MIXERS: tuple[str, ...] = ("attention", "sliding", "mla", "mamba", "none")
"""Token mixers: full (GQA) attention, sliding-window / chunked attention, multi-latent
attention, a Mamba-2 mixer, or none (Nemotron-H's MLP-only and MoE-only layers)."""
LAYER_FFNS: tuple[str, ...] = ("dense", "moe", "none")
PRECISIONS: tuple[str, ...] = ("bf16", "fp8", "nvfp4")
FRAMEWORKS: tuple[str, ...] = ("megatron", "torchtitan", "deepspeed")


@dataclass(frozen=True, slots=True, kw_only=True)
class RopeSpec:
    """Rotary position embedding as the model was trained with it (HF ``rope_theta``,
    ``rope_scaling``, ``partial_rotary_factor``; transformers ``modeling_rope_utils.py``)."""

    theta: float = 10000.0
    """The base (HF ``rope_theta``; Megatron ``--rotary-base``; 10000 is both defaults)."""
    scaling: str = "none"
    """``none``, ``llama3`` (Llama 3.1 frequency bands), ``yarn``, ``linear`` (position
    interpolation)."""
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    truncate: bool = True
    """YaRN: round the correction range to integers (HF ``truncate``, default true)."""
    percent: float = 1.0
    """Share of each head's dimensions rotated (HF ``partial_rotary_factor``)."""
    local_theta: float = 0.0
    """Base of the sliding-window layers when it differs (Gemma 3 ``rope_local_base_freq``)."""

    def __post_init__(self) -> None:
        for name in ("theta", "factor", "percent"):
            _positive_number(getattr(self, name), f"rope.{name}")
        if self.scaling not in ROPE_SCALINGS:
            raise InputError(
                f"must be one of {', '.join(ROPE_SCALINGS)}, got {excerpt(self.scaling)}",
                field="rope_scaling",
            )


@functools.lru_cache(maxsize=256)
def _uniform_layer_kinds(num_layers: int, moe: bool, moe_layer_freq: int) -> tuple[str, ...]:
    """``ModelSpec.layer_kinds`` without ``layer_types``, made once per shape: the cost terms
    read it tens of thousands of times a suite (a tuple: shared safely; a few dozen shapes)."""
    return tuple(
        "attention/moe" if moe and (i + 1) % moe_layer_freq == 0 else "attention/dense"
        for i in range(num_layers)
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, in Hugging Face ``config.json`` terms (DESIGN §1)."""

    name: str
    """Preset or file name, for reports."""
    num_layers: int
    """Transformer layers (HF ``num_hidden_layers``)."""
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    """Key/value heads = Megatron query groups (HF ``num_key_value_heads``); = heads for MHA."""
    ffn_hidden_size: int
    """Dense MLP inner size (HF ``intermediate_size``)."""
    vocab_size: int
    mlp_kind: MlpKind = "swiglu"
    """``swiglu``: gated, 3 matrices; ``gelu``: 2; ``squared_relu``: 2 (Nemotron)."""
    head_dim: int = 0
    """Per-head size; 0 means ``hidden_size // num_attention_heads`` (Qwen3 sets it explicitly)."""
    tied_embeddings: bool = False
    """Output layer shares the input embedding (HF ``tie_word_embeddings``)."""
    learned_position_embeddings: bool = False
    """GPT-3-style learned absolute positions (adds ``max_position_embeddings * hidden`` params)."""
    max_position_embeddings: int = 0
    layernorm: bool = False
    """LayerNorm (weight + bias) instead of RMSNorm (weight only)."""
    linear_bias: bool = False
    """Biases on the linear layers (GPT-3, Megatron GPT)."""
    num_experts: int = 0
    """Routed experts per MoE layer; 0 for a dense model."""
    experts_per_token: int = 0
    """Top-k routing (HF ``num_experts_per_tok``)."""
    moe_ffn_hidden_size: int = 0
    """Per-expert MLP inner size; 0 means ``ffn_hidden_size`` (Mixtral)."""
    shared_expert_ffn_hidden_size: int = 0
    """Inner size of the always-active shared expert(s); 0 when there is none."""
    moe_layer_freq: int = 1
    """Every ``moe_layer_freq``-th layer is an MoE layer (HF ``decoder_sparse_step``)."""
    layer_types: tuple[str, ...] = ()
    """One ``"mixer/ffn"`` entry per layer (``LAYER_MIXERS`` x ``LAYER_FFNS``), e.g.
    ``"mla/dense"``, ``"sliding/moe"``, ``"mamba/none"``; empty means attention in every layer and
    an MoE MLP in every ``moe_layer_freq``-th one (``autopar.inputs.hf_families`` builds it from a
    family's keys: DeepSeek dense-first layers, GPT-OSS sliding layers, Nemotron-H patterns)."""
    num_mtp_layers: int = 0
    """Multi-token-prediction modules after the last layer (DeepSeek-V3
    ``num_nextn_predict_layers``; Megatron ``--mtp-num-layers``, ``multi_token_prediction.py``):
    each one is a layer like the last, a ``2h x h`` projection, two norms, and one more logits
    pass through the shared output layer, on the last pipeline stage."""
    attention_window: int = 0
    """Keys each query sees in a ``sliding`` layer (GPT-OSS ``sliding_window``, Llama 4
    ``attention_chunk_size``); 0 when there are none."""
    attention_sinks: bool = False
    """A learned per-head sink logit in every attention layer (GPT-OSS)."""
    clamped_glu: bool = False
    """The MLP's gated activation clamps its inputs first (GPT-OSS ``swiglu_limit``: Megatron
    ``activation_func_clamp_value`` with ``glu_linear_offset``, Megatron-Bridge
    ``gpt_oss_bridge.py``)."""
    q_lora_rank: int = 0
    """MLA query compression rank (HF ``q_lora_rank``; 0 = null: a full query projection)."""
    kv_lora_rank: int = 0
    """MLA key/value latent rank (HF ``kv_lora_rank``); non-zero means multi-latent attention
    (Megatron ``multi_latent_attention.py``; DeepSeek-V2 report §2.1)."""
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    moe_router_num_groups: int = 0
    """Expert groups for node-limited routing (HF ``n_group``; ``--moe-router-num-groups``)."""
    moe_router_group_topk: int = 0
    """Groups a token may be routed to (HF ``topk_group``; Megatron ``--moe-router-group-topk``)."""
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    mamba_state_size: int = 0
    mamba_num_groups: int = 1
    mamba_conv_kernel: int = 4
    mamba_chunk_size: int = 128
    rope: RopeSpec = field(default_factory=RopeSpec)
    """Rotary embedding base and scaling (unused with learned positions or no positions)."""
    activation: str = ""
    """The MLP activation (``ACTIVATIONS``); empty means ``mlp_kind``'s own (silu for swiglu)."""
    norm_epsilon: float = 1e-5
    """RMSNorm / LayerNorm epsilon (HF ``rms_norm_eps``; Megatron ``--norm-epsilon``)."""
    qkv_bias: bool = False
    """Biases on the q, k, v projections only (Qwen2; Megatron ``--add-qkv-bias``)."""
    qk_layernorm: bool = False
    """RMSNorm on each head's queries and keys (Qwen3, Gemma 3; Megatron ``--qk-layernorm``)."""
    qk_l2_norm: bool = False
    """Weightless L2 norm on queries and keys (Llama 4 ``use_qk_norm``; ``--qk-l2-norm``)."""
    moe_router_score_function: str = "softmax"
    """Router scores (HF ``scoring_func``; ``--moe-router-score-function``)."""
    moe_router_expert_bias: bool = False
    """A per-expert bias added to the scores for top-k selection only (DeepSeek-V3
    ``topk_method: noaux_tc``; ``--moe-router-enable-expert-bias``)."""
    moe_router_topk_scaling_factor: float = 1.0
    """Routed outputs times this (HF ``routed_scaling_factor``)."""
    moe_router_pre_softmax: bool = False
    """Top-k of the softmax over all experts, not renormalised (HF ``norm_topk_prob: false``;
    ``--moe-router-pre-softmax``)."""
    moe_router_load_balancing: str = "aux_loss"
    """``aux_loss`` or ``seq_aux_loss`` (DeepSeek ``seq_aux``)."""
    shared_expert_gate: bool = False
    """A sigmoid gate on the shared expert's output (Qwen1.5/2-MoE;
    ``--moe-shared-expert-gate``)."""
    attn_logit_softcapping: float = 0.0
    """Attention scores through ``cap * tanh(s / cap)`` (Gemma 2); 0 when off."""
    final_logit_softcapping: float = 0.0
    """The output logits likewise (Gemma 2); 0 when off."""
    query_pre_attn_scalar: float = 0.0
    """Scores scaled by ``1/sqrt(this)`` instead of ``1/sqrt(head_dim)`` (Gemma); 0 = head_dim."""
    gemma_norms: bool = False
    """Gemma's extra norms: post-attention and post-MLP RMSNorms, embeddings scaled by
    ``sqrt(hidden)``."""
    norm_zero_centered: bool = False
    """Norm weights applied as ``1 + w`` (Gemma, Nemotron LayerNorm1P; ``--apply-layernorm-1p``)."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads"):
            _positive(getattr(self, name), name)
        for name in ("ffn_hidden_size", "vocab_size", "moe_layer_freq"):
            _positive(getattr(self, name), name)
        for name in ("head_dim", "num_experts", "experts_per_token", "moe_ffn_hidden_size"):
            _non_negative(getattr(self, name), name)
        _non_negative(self.shared_expert_ffn_hidden_size, "shared_expert_ffn_hidden_size")
        _non_negative(self.max_position_embeddings, "max_position_embeddings")
        if self.mlp_kind not in MLP_KINDS:
            raise InputError(
                f"must be one of {', '.join(MLP_KINDS)}, got {excerpt(self.mlp_kind)}",
                field="mlp_kind",
            )
        if self.head_dim == 0 and self.hidden_size % self.num_attention_heads:
            raise InputError(
                f"num_attention_heads ({self.num_attention_heads}) must divide hidden_size "
                f"({self.hidden_size})",
                field="num_attention_heads",
            )
        if self.num_attention_heads % self.num_kv_heads:
            raise InputError(
                f"num_key_value_heads ({self.num_kv_heads}) must divide num_attention_heads "
                f"({self.num_attention_heads})",
                field="num_key_value_heads",
            )
        if self.num_experts and not 1 <= self.experts_per_token <= self.num_experts:
            raise InputError(
                f"num_experts_per_tok must be in 1..{self.num_experts} for an MoE model, "
                f"got {self.experts_per_token}",
                field="num_experts_per_tok",
            )
        if not self.num_experts and self.experts_per_token:
            raise InputError(
                "num_experts_per_tok is set but the model has no experts",
                field="num_experts_per_tok",
            )
        self._check_layer_types()
        self._check_details()

    def _check_details(self) -> None:
        if self.activation and self.activation not in ACTIVATIONS:
            raise InputError(
                f"must be one of {', '.join(ACTIVATIONS)}, got {excerpt(self.activation)}",
                field="hidden_act",
            )
        _positive_number(self.norm_epsilon, "rms_norm_eps")
        _positive_number(self.moe_router_topk_scaling_factor, "routed_scaling_factor")
        if self.moe_router_score_function not in ROUTER_SCORES:
            raise InputError(
                f"must be one of {', '.join(ROUTER_SCORES)}, got "
                f"{excerpt(self.moe_router_score_function)}",
                field="scoring_func",
            )
        for name in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise InputError(f"must be a positive number, got {excerpt(value)}", field=name)

    def _check_layer_types(self) -> None:
        for name in (
            "num_mtp_layers",
            "attention_window",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "moe_router_num_groups",
            "moe_router_group_topk",
            "mamba_num_heads",
            "mamba_head_dim",
            "mamba_state_size",
        ):
            _non_negative(getattr(self, name), name)
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise InputError(
                f"has {len(self.layer_types)} entries for {self.num_layers} layers",
                field="layer_types",
            )
        for kind in self.layer_types:
            mixer, _, ffn = kind.partition("/")
            if mixer not in LAYER_MIXERS or ffn not in LAYER_FFNS:
                raise InputError(
                    f"entry {kind!r} must be mixer/ffn with mixer in {', '.join(LAYER_MIXERS)} "
                    f"and ffn in {', '.join(LAYER_FFNS)}",
                    field="layer_types",
                )
        kinds = self.layer_kinds
        if any(k.endswith("/moe") for k in kinds) and not self.num_experts:
            raise InputError("has MoE layers but the model has no experts", field="layer_types")
        if any(k.startswith("mla/") for k in kinds) and not (
            self.kv_lora_rank and self.qk_rope_head_dim and self.v_head_dim
        ):
            raise InputError(
                "mla layers need kv_lora_rank, qk_rope_head_dim and v_head_dim", field="layer_types"
            )
        if any(k.startswith("mamba/") for k in kinds) and not (
            self.mamba_num_heads and self.mamba_head_dim and self.mamba_state_size
        ):
            raise InputError(
                "mamba layers need mamba_num_heads, mamba_head_dim and ssm_state_size",
                field="layer_types",
            )
        if any(k.startswith("sliding/") for k in kinds) and not self.attention_window:
            raise InputError("sliding layers need a window size", field="layer_types")

    @property
    def gated_mlp(self) -> bool:
        """Three MLP matrices (SwiGLU, GeGLU) rather than two."""
        return self.mlp_kind in GATED_MLPS

    @property
    def activation_function(self) -> str:
        """The MLP activation (``ACTIVATIONS``)."""
        return self.activation or DEFAULT_ACTIVATION[self.mlp_kind]

    @property
    def kv_channels(self) -> int:
        """Per-head dimension (Megatron ``kv_channels``)."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_ffn_hidden_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """``"mixer/ffn"`` of every layer: ``layer_types``, or attention everywhere with an MoE
        MLP in every ``moe_layer_freq``-th layer (HF ``decoder_sparse_step``: layer ``i`` is
        sparse when ``(i + 1) % step == 0``)."""
        if self.layer_types:
            return self.layer_types
        return _uniform_layer_kinds(self.num_layers, self.is_moe, self.moe_layer_freq)

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (the main model; MTP layers excluded)."""
        return sum(kind.endswith("/moe") for kind in self.layer_kinds)

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense MLP."""
        return sum(kind.endswith("/dense") for kind in self.layer_kinds)

    @property
    def mtp_layer_kind(self) -> str:
        """The kind of each MTP module's transformer layer: the last layer's (DeepSeek-V3 §2.2)."""
        return self.layer_kinds[-1]

    @property
    def layer_summary(self) -> str:
        """The layer structure in a few words (``autopar models``): mixers and MLPs by count,
        when they are not one attention + MLP kind throughout, and the MTP modules."""
        counts: dict[str, int] = {}
        for kind in self.layer_kinds:
            for part in kind.split("/"):
                if part != "none":
                    counts[part] = counts.get(part, 0) + 1
        plain = set(self.layer_kinds) in ({"attention/dense"}, {"attention/moe"})
        words = [] if plain else [f"{n} {part}" for part, n in counts.items()]
        if self.num_mtp_layers:
            words.append(f"{self.num_mtp_layers} MTP")
        return ", ".join(words)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def mamba_inner_size(self) -> int:
        """Mamba-2 ``d_inner = nheads * headdim`` (Megatron ``mamba_mixer.py``)."""
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices in one MLP: 3 for gated ones (SwiGLU, GeGLU: ``gated_mlp``), 2
        otherwise."""
        return 3 if self.gated_mlp else 2


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    """The training job: how many GPUs, what batch, what precision."""

    num_gpus: int
    global_batch_sequences: int
    """Sequences per optimizer step (``--global-batch-size`` in Megatron)."""
    seq_len: int
    precision: Precision = "bf16"
    optimizer: Literal["adam"] = "adam"
    grad_precision: Literal["fp32", "bf16"] = "fp32"
    """Gradient buffer and reduction: ``fp32`` is Megatron-LM's bf16 default (it forces
    ``--accumulate-allreduce-grads-in-fp32``); ``bf16`` is NeMo's ``grad_reduce_in_fp32=False``
    and torchtitan's FSDP ``reduce_dtype`` bf16: half the gradient memory and DP traffic."""
    stack: StackSpec = field(default_factory=lambda: StackSpec(name="megatron-lm"))
    """The software stack the job runs on (``autopar.inputs.stack``): overlaps, FP8 recipe,
    dropout."""
    train_tokens: float | None = None
    """Tokens the whole run trains on (``--train-tokens``): gives days to train."""
    gpu_hour_cost: float | None = None
    """Price of one GPU-hour (``--gpu-hour-cost``): gives the cost of the run."""
    default_batch: bool = False
    """The batch is autopar's default (4 Mi tokens), not one the user gave: answers say so when
    it leaves a pipeline too few micro-batches (``autopar.search.notes``)."""

    def __post_init__(self) -> None:
        _positive(self.num_gpus, "num_gpus")
        _positive(self.global_batch_sequences, "global_batch")
        _positive(self.seq_len, "seq_len")
        if self.precision not in PRECISIONS:
            raise InputError(
                f"must be one of {', '.join(PRECISIONS)}, got {excerpt(self.precision)}",
                field="precision",
            )
        if self.grad_precision not in ("fp32", "bf16"):
            raise InputError(
                f"must be fp32 or bf16, got {excerpt(self.grad_precision)}", field="grad_precision"
            )
        if not isinstance(self.stack, StackSpec):
            raise InputError(f"must be a StackSpec, got {self.stack!r}", field="stack")
        for name in ("train_tokens", "gpu_hour_cost"):
            value = getattr(self, name)
            if value is not None:
                _positive_number(value, name)
                if not math.isfinite(value):
                    raise InputError(f"must be finite, got {value!r}", field=name)
        if self.optimizer != "adam":
            raise InputError(
                f"only 'adam' is modelled, got {excerpt(self.optimizer)}", field="optimizer"
            )

    @property
    def global_batch_tokens(self) -> int:
        return self.global_batch_sequences * self.seq_len

    @property
    def grad_bytes(self) -> float:
        """Bytes of one gradient element (buffer and reduction)."""
        return 4.0 if self.grad_precision == "fp32" else 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchOptions:
    """What the solver may choose: allowed features, pins and limits (DESIGN §1, §3)."""

    framework: Framework = "megatron"
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    """Allowed recompute modes."""
    zero_stages: tuple[int, ...] = (0, 1)
    """Allowed optimizer sharding: 0 = none, 1 = distributed optimizer (Megatron) / ZeRO-1,
    2 = also gradients, 3 = also parameters (FSDP / ZeRO-3)."""
    sequence_parallel: bool | None = None
    """Force SP on or off; ``None`` = on whenever tp > 1 (Megatron's recommendation)."""
    allow_interleaving: bool = True
    allow_cp: bool = True
    allow_ep: bool = True
    pipeline_schedules: tuple[str, ...] = ("1f1b",)
    """Allowed pipeline schedules (``autopar.base.axes.PIPELINE_SCHEDULES``), each one the
    framework ships (``FRAMEWORK_SCHEDULES``)."""
    uneven_pipeline: bool = True
    """Allow splits where ``pp*vpp`` does not divide the layers (the default: every framework
    autopar plans for splits them; ``autopar.layout.split`` says how Megatron is told).
    ``False`` (``--even-pipeline``) keeps Megatron's even split only."""
    tp_within_node: bool = True
    """Keep TP (and ETP·EP) inside one NVLink domain (``NVLink domain`` rules)."""
    pins: tuple[tuple[str, int], ...] = ()
    """Fixed values, e.g. ``(("tp", 8),)``, for axes in ``autopar.base.axes.SEARCH_AXES``."""
    maxima: tuple[tuple[str, int], ...] = ()
    """Upper limits, e.g. ``(("pp", 16),)``; a limit on an axis with a search cap
    (``Axis.cap``: mbs 16) replaces the cap."""

    def __post_init__(self) -> None:
        if self.framework not in FRAMEWORKS:
            raise InputError(
                f"must be one of {', '.join(FRAMEWORKS)}, got {excerpt(self.framework)}",
                field="framework",
            )
        for mode in self.recompute:
            if mode not in RECOMPUTE_MODES:
                raise InputError(
                    f"must be among {', '.join(RECOMPUTE_MODES)}, got {excerpt(mode)}",
                    field="recompute",
                )
        if not self.recompute:
            raise InputError("at least one recompute mode must be allowed", field="recompute")
        for stage in self.zero_stages:
            if stage not in ZERO_STAGES:
                raise InputError(f"must be among 0, 1, 2, 3, got {excerpt(stage)}", field="zero")
        if not self.zero_stages:
            raise InputError("at least one ZeRO stage must be allowed", field="zero")
        self._check_schedules()
        for dim, value in (*self.pins, *self.maxima):
            if dim not in SEARCH_AXES:
                raise InputError(f"unknown layout dimension {excerpt(dim)}", field=dim)
            _positive(value, dim)

    def _check_schedules(self) -> None:
        offered = dict(FRAMEWORK_SCHEDULES[self.framework])
        for name in self.pipeline_schedules:
            if name not in PIPELINE_SCHEDULES:
                raise InputError(
                    f"must be among {', '.join(PIPELINE_SCHEDULES)} or 'any', got {excerpt(name)}",
                    field="pipeline_schedule",
                )
            if name not in offered:
                ships = ", ".join(offered)
                raise InputError(
                    f"{self.framework} does not run the {name} schedule (it ships {ships}: "
                    f"{'; '.join(f'{k}: {v}' for k, v in offered.items())})",
                    field="pipeline_schedule",
                )
        if not self.pipeline_schedules:
            raise InputError("at least one schedule must be allowed", field="pipeline_schedule")


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """Everything the solver and the cost model need."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    options: SearchOptions = field(default_factory=SearchOptions)
