"""Megatron-LM: the complete ``pretrain_gpt.py`` argument list for a layout (DESIGN §7).

Flag names, value counts and choices were read from Megatron-LM ``megatron/training/arguments.py``
at main ``d98e8a6`` (2026-08-22; Megatron-Core 0.20.0). The transformer flags there are generated
from ``TransformerConfig`` fields (``ArgumentGroupFactory``, arguments.py:2373), so
``--num-query-groups``, ``--normalization``, ``--moe-token-dispatcher-type``, ``--fp8-recipe`` are
those fields' names. ``tests/data/megatron/`` holds that parser's flag list; the tests also build
megatron-core's own ``TransformerConfig`` from these flags.
"""

from __future__ import annotations

import shlex

from autopar.base.errors import InputError
from autopar.inputs.specs import ModelSpec, Problem, TrainingSpec
from autopar.inputs.stack import DEFAULT_FP8_GEMMS, StackSpec
from autopar.layout.plan import Estimate, Layout
from autopar.outputs.emit.common import (
    MEGATRON_SCHEDULES,
    check_graphs_and_offload,
    checkpoint_interval_of,
    dispatcher_of,
    ffn_pattern,
    layout_of,
    refuse,
    refuse_schedule,
    refuse_unbuildable_rope,
    selective_modules,
    split_of,
    stage_plan_of,
    unsupported_layers,
)
from autopar.outputs.emit.megatron_stages import pipeline_flags, recompute_flags

MEGATRON_TARGET = "Megatron-LM main d98e8a6 (2026-08-22), Megatron-Core 0.20.0"

Flag = tuple[str, str | None]

# Megatron's default vocabulary padding unit (arguments.py --make-vocab-size-divisible-by 128);
# the embedding is padded to a multiple of this times TP (build_tokenizer.vocab_size_with_padding).
_VOCAB_DIVISOR = 128


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """Megatron's padded vocabulary (``megatron/core/tokenizers/utils/build_tokenizer.py``)."""
    multiple = _VOCAB_DIVISOR * tp
    return -(-vocab_size // multiple) * multiple


_ACTIVATIONS: dict[tuple[str, str], list[Flag]] = {
    # (mlp_kind, activation) -> Megatron's flags (core_transformer_config_from_args,
    # megatron/training/argument_utils.py:312-324: --swiglu sets silu + GLU, --squared-relu
    # squared_relu; F.gelu, erf GELU, is TransformerConfig's default activation_func)
    ("swiglu", "silu"): [("--swiglu", None)],
    ("gelu", "gelu"): [],
    ("squared_relu", "relu2"): [("--squared-relu", None)],
}


def _activation(model: ModelSpec) -> list[Flag]:
    """The MLP's activation; one Megatron-LM's flags cannot name is refused (GeGLU: only
    --quick-geglu, x * sigmoid(1.702 x), exists; tanh GELU: --openai-gelu reaches no
    TransformerConfig field at d98e8a6)."""
    key = (model.mlp_kind, model.activation_function)
    if key not in _ACTIVATIONS:
        raise refuse(
            "megatron",
            f"{model.name}'s MLP ({model.mlp_kind} with {model.activation_function}): no "
            "Megatron-LM flag sets that activation",
            "use --format megatron-bridge (model.activation_func)",
        )
    return list(_ACTIVATIONS[key])


def _whole(value: float, what: str) -> str:
    if not float(value).is_integer():
        raise refuse("megatron", f"{what} {value:g} (the flag takes an integer)", "round it")
    return str(int(value))


def rope_flags(model: ModelSpec) -> list[Flag]:
    """RoPE base and scaling. Llama 3.1's scaling: megatron-core's fixed low/high frequency
    factors 1 and 4 and 8192 original positions (rotary_pos_embedding.py ``_apply_scaling``),
    only the factor is a flag (arguments.py:2424-2426). YaRN: GPT layers read the --yarn-* flags
    (argument_utils.py ``_apply_yarn_config_from_args``); MLA reads --rotary-scaling-factor,
    --mscale, --mscale-all-dim, and takes beta_fast 32, beta_slow 1 and 4096 original positions
    from ``MLATransformerConfig``'s defaults (transformer_config.py:3315-3318; no flag)."""
    rope = model.rope
    flags: list[Flag] = [("--rotary-base", _whole(rope.theta, "rope_theta"))]
    if rope.percent != 1:
        flags.append(("--rotary-percent", repr(rope.percent)))
    refuse_unbuildable_rope("megatron", model, "use --format megatron-bridge")
    if rope.scaling == "llama3":
        flags += [("--use-rope-scaling", None), ("--rope-scaling-factor", repr(rope.factor))]
    elif rope.scaling == "linear":
        flags.append(("--rotary-seq-len-interpolation-factor", _whole(rope.factor, "factor")))
    elif rope.scaling == "yarn":
        flags += _yarn(model)
    elif model.is_mla:  # MLA defaults to YaRN x40: say plain RoPE
        flags.append(("--rope-type", "rope"))
    return flags


def _yarn(model: ModelSpec) -> list[Flag]:
    rope = model.rope
    flags: list[Flag] = [
        ("--rotary-scaling-factor", repr(rope.factor)),
        ("--mscale", repr(rope.mscale)),
        ("--mscale-all-dim", repr(rope.mscale_all_dim)),
    ]
    if model.is_mla:
        fixed = (rope.beta_fast, rope.beta_slow, rope.original_max_position_embeddings)
        if fixed != (32.0, 1.0, 4096):
            raise refuse(
                "megatron",
                f"{model.name}'s YaRN beta_fast {fixed[0]:g}, beta_slow {fixed[1]:g}, "
                f"{fixed[2]} original positions: MLA takes 32, 1 and 4096 from "
                "MLATransformerConfig (no flag)",
                "use --format megatron-bridge",
            )
        return [("--rope-type", "yarn"), *flags]
    flags = [("--position-embedding-type", "yarn"), *flags]
    flags += [
        ("--yarn-original-max-position-embeddings", str(rope.original_max_position_embeddings)),
        ("--yarn-beta-fast", repr(rope.beta_fast)),
        ("--yarn-beta-slow", repr(rope.beta_slow)),
    ]
    if not rope.truncate:
        flags.append(("--no-yarn-correction-range-round-to-int", None))
    return flags


def _architecture(model: ModelSpec, seq_len: int, tp: int) -> list[Flag]:
    flags: list[Flag] = [
        ("--num-layers", str(model.num_layers)),
        ("--hidden-size", str(model.hidden_size)),
        ("--ffn-hidden-size", str(model.ffn_hidden_size)),
        ("--num-attention-heads", str(model.num_attention_heads)),
        ("--kv-channels", str(model.kv_channels)),
    ]
    if model.num_kv_heads != model.num_attention_heads:
        flags += [
            ("--group-query-attention", None),
            ("--num-query-groups", str(model.num_kv_heads)),
        ]
    # arguments.py:1354 asserts max_position_embeddings >= seq_length
    flags.append(("--max-position-embeddings", str(max(model.max_position_embeddings, seq_len))))
    if not (model.rope.scaling == "yarn" and not model.is_mla):  # else rope_flags says yarn
        flags.append(
            (
                "--position-embedding-type",
                "learned_absolute" if model.learned_position_embeddings else "rope",
            )
        )
    flags.append(("--normalization", "LayerNorm" if model.layernorm else "RMSNorm"))
    flags.append(("--norm-epsilon", repr(model.norm_epsilon)))
    if model.norm_zero_centered:
        flags.append(("--apply-layernorm-1p", None))
    flags += _activation(model)
    if not model.linear_bias:
        flags.append(("--disable-bias-linear", None))
        if model.qkv_bias:
            flags.append(("--add-qkv-bias", None))
    if model.qk_layernorm:
        flags.append(("--qk-layernorm", None))
    if model.qk_l2_norm:
        flags.append(("--qk-l2-norm", None))
    if not model.learned_position_embeddings:
        flags += rope_flags(model)
    if not model.tied_embeddings:
        flags.append(("--untie-embeddings-and-output-weights", None))
    # NullTokenizer (eod = vocab_size - 1) for mock-data runs; the header says to swap in yours.
    flags += [
        ("--tokenizer-type", "NullTokenizer"),
        ("--vocab-size", str(model.vocab_size)),
        ("--padded-vocab-size", str(padded_vocab_size(model.vocab_size, tp))),
    ]
    return flags


def _attention_variants(model: ModelSpec) -> list[Flag]:
    """Multi-latent attention (``multi_latent_attention.py``) and MTP modules; layer kinds the
    emitter cannot write are refused (``unsupported_layers``)."""
    missing = unsupported_layers(model)
    if missing:
        raise refuse(
            "megatron",
            f"{model.name}'s {', '.join(missing)}",
            "start from its Megatron-Bridge recipe",
        )
    gemma = [
        what
        for what, present in (
            ("attention logit soft-capping", model.attn_logit_softcapping),
            ("final logit soft-capping", model.final_logit_softcapping),
            (
                "query_pre_attn_scalar",
                model.query_pre_attn_scalar and model.query_pre_attn_scalar != model.kv_channels,
            ),
            ("post-attention/post-MLP norms and sqrt(hidden) embedding scaling", model.gemma_norms),
        )
        if present
    ]
    if gemma:
        raise refuse(
            "megatron",
            f"{model.name}'s {', '.join(gemma)} (no Megatron-LM flag)",
            "use Megatron-Bridge's recipe of this family",
        )
    flags: list[Flag] = []
    if model.is_mla:
        flags.append(("--multi-latent-attention", None))
        if model.q_lora_rank:
            flags.append(("--q-lora-rank", str(model.q_lora_rank)))
        flags += [
            ("--kv-lora-rank", str(model.kv_lora_rank)),
            ("--qk-head-dim", str(model.qk_nope_head_dim)),
            ("--qk-pos-emb-head-dim", str(model.qk_rope_head_dim)),
            ("--v-head-dim", str(model.v_head_dim)),
        ]
    if model.num_mtp_layers:
        flags.append(("--mtp-num-layers", str(model.num_mtp_layers)))
    return flags


def _moe(model: ModelSpec, lay: Layout, dispatcher: str = "alltoall") -> list[Flag]:
    if not model.is_moe:
        return []
    if model.linear_bias and lay.etp > 1:
        raise refuse(
            "megatron",
            f"etp={lay.etp} with biased experts (transformer_config.py "
            "asserts ETP == 1 for MoE biases)",
            "solve with --etp 1",
        )
    flags: list[Flag] = [
        ("--num-experts", str(model.num_experts)),
        ("--moe-router-topk", str(model.experts_per_token)),
        ("--moe-ffn-hidden-size", str(model.expert_ffn_hidden_size)),
        # the dispatcher the cost model priced (Estimate.choices; cost_models/communication.py
        # EpCommTime), which Megatron would otherwise leave at its allgather default
        ("--moe-token-dispatcher-type", dispatcher),
        ("--moe-grouped-gemm", None),
        # FP32 router: megatron-core warns against BF16 routing with >= 32 experts
        # (transformer_config.py moe_router_dtype), and Megatron-Bridge's MoE recipes set it
        ("--moe-router-dtype", "fp32"),
        ("--moe-router-load-balancing-type", model.moe_router_load_balancing),
        ("--expert-model-parallel-size", str(lay.ep)),
        ("--expert-tensor-parallel-size", str(lay.etp)),
    ]
    if dispatcher == "flex":  # DeepEP behind the flex dispatcher (the stack allowed it)
        flags.append(("--moe-flex-dispatcher-backend", "deepep"))
    if model.shared_expert_ffn_hidden_size:
        size = str(model.shared_expert_ffn_hidden_size)
        flags.append(("--moe-shared-expert-intermediate-size", size))
        if model.shared_expert_gate:
            flags.append(("--moe-shared-expert-gate", None))
    flags += _router(model)
    if (pattern := ffn_pattern(model)) is not None:
        flags.append(("--moe-layer-freq", pattern))
    if model.moe_router_num_groups:
        flags += [
            ("--moe-router-num-groups", str(model.moe_router_num_groups)),
            ("--moe-router-group-topk", str(model.moe_router_group_topk)),
        ]
    return flags


def _router(model: ModelSpec) -> list[Flag]:
    """Router scoring as the model was trained: sigmoid scores, the expert bias of
    aux-loss-free balancing, the routed-output scale, no top-k renormalisation
    (``--moe-router-pre-softmax``; Megatron renormalises sigmoid top-k scores always,
    moe_utils.py ``topk_routing_with_score_function``)."""
    flags: list[Flag] = []
    if model.moe_router_score_function != "softmax":
        flags.append(("--moe-router-score-function", model.moe_router_score_function))
    if model.moe_router_expert_bias:
        flags.append(("--moe-router-enable-expert-bias", None))
    if model.moe_router_topk_scaling_factor != 1:
        flags.append(
            ("--moe-router-topk-scaling-factor", repr(model.moe_router_topk_scaling_factor))
        )
    if model.moe_router_pre_softmax and model.experts_per_token > 1:
        if model.moe_router_score_function != "softmax":
            raise refuse(
                "megatron",
                "sigmoid router scores without top-k renormalisation",
                "use --format megatron-bridge",
            )
        flags.append(("--moe-router-pre-softmax", None))
    return flags


def _pipeline(model: ModelSpec, lay: Layout) -> list[Flag]:
    """The split the solver planned (``autopar.layout.split.pipeline_split``): even, embedding/
    loss accounted, first/last-stage layer counts, or ``--pipeline-model-parallel-layout``;
    interleaving as layers per virtual stage when even, else as virtual stages per rank
    (arguments.py:954-956 asks for it with uneven splits; the layout sets it itself,
    arguments.py:941-949)."""
    if lay.pipeline_schedule not in MEGATRON_SCHEDULES:
        raise refuse_schedule("megatron", lay, "megatron")
    flags: list[Flag] = [("--pipeline-model-parallel-size", str(lay.pp))]
    if lay.pipeline_schedule == "combined-1f1b":
        # the combined 1F1B (schedules.py L1485); its wgrad delay (model_parallel_config.py
        # L348) needs it (transformer_config.py L3074-3077) and overlaps the wgrad with the
        # other micro-batch's all-to-all
        flags += [("--overlap-moe-expert-parallel-comm", None), ("--delay-wgrad-compute", None)]
    if lay.pp == 1:
        return flags
    split = split_of(model.num_layers, lay.pp, lay.vpp, mtp_layers=model.num_mtp_layers)
    if split.layout is not None:
        return [*flags, ("--pipeline-model-parallel-layout", split.layout)]
    if split.account_for_embedding:
        flags.append(("--account-for-embedding-in-pipeline-split", None))
    if split.account_for_loss:
        flags.append(("--account-for-loss-in-pipeline-split", None))
    if split.first_stage_layers is not None:
        flags += [
            ("--decoder-first-pipeline-num-layers", str(split.first_stage_layers)),
            ("--decoder-last-pipeline-num-layers", str(split.last_stage_layers)),
        ]
    if lay.vpp > 1:
        if split.is_even:
            per_stage = model.num_layers // (lay.pp * lay.vpp)
            flags.append(("--num-layers-per-virtual-pipeline-stage", str(per_stage)))
        else:
            flags.append(("--num-virtual-stages-per-pipeline-rank", str(lay.vpp)))
    return flags


def _zero(lay: Layout, stack: StackSpec) -> list[Flag]:
    """ZeRO-1 is the distributed optimizer; ZeRO-2/3 are Megatron-FSDP (arguments.py:1118-1170:
    v1 needs the distributed optimizer and ``--ckpt-format fsdp_dtensor``). The DP overlaps are
    the stack's; ``--overlap-param-gather`` needs a sharded optimizer and the grad overlap
    (arguments.py:1024-1029)."""
    flags: list[Flag] = []
    if lay.zero >= 1:
        flags.append(("--use-distributed-optimizer", None))
    if lay.zero >= 2:
        strategy = "optim_grads" if lay.zero == 2 else "optim_grads_params"
        flags = [
            ("--use-megatron-fsdp", None),
            *flags,
            ("--data-parallel-sharding-strategy", strategy),
            ("--ckpt-format", "fsdp_dtensor"),
        ]
    if stack.overlap_grad_reduce:
        flags.append(("--overlap-grad-reduce", None))
        if stack.overlap_param_gather and lay.zero >= 1:
            flags.append(("--overlap-param-gather", None))
    return flags


_FP8_RECIPES = {
    "delayed": "delayed",
    "current": "tensorwise",
    "blockwise": "blockwise",
    "mxfp8": "mxfp8",
}
"""autopar stack recipe -> Megatron ``--fp8-recipe`` (transformer_config.py L594 choices)."""


def _precision(training: TrainingSpec) -> list[Flag]:
    flags: list[Flag] = [("--bf16", None)]
    if training.grad_precision == "bf16":
        flags.append(("--grad-reduce-in-bf16", None))  # else FP32 gradient accumulation
    if training.stack.optimizer_state_dtype == "bf16":  # arguments.py L3667-3684
        flags.append(("--use-precision-aware-optimizer", None))
        flags.append(("--exp-avg-dtype", "bf16"))
        flags.append(("--exp-avg-sq-dtype", "bf16"))
    if training.precision not in ("fp8", "nvfp4"):
        return flags
    stack = training.stack
    if set(stack.fp8_gemms) != set(DEFAULT_FP8_GEMMS):
        fmt = "FP4" if training.precision == "nvfp4" else "FP8"
        raise refuse(
            "megatron",
            f"{fmt} on the GEMMs {', '.join(stack.fp8_gemms)}: Megatron-LM runs exactly the "
            f"linear layers in {fmt} (no flag for the attention core or the logits)",
            "use fp8_gemms qkv,proj,fc1,fc2",
        )
    if training.precision == "nvfp4":
        # transformer_config.py L673-681: fp4 'e2m1' (--fp4-format), fp4_recipe 'nvfp4'
        # (TE NVFP4BlockScaling); arguments.py L1100 refuses --fp8-format beside it
        return [*flags, ("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")]
    # MXFP8 takes E4M3 throughout (TE MXFP8BlockScaling's default format, recipe/__init__.py
    # L369; Megatron-Bridge bf16_with_mxfp8_mixed); the tensor-wise recipes E4M3 / E5M2 hybrid
    fmt = "e4m3" if stack.fp8_recipe == "mxfp8" else "hybrid"
    return [*flags, ("--fp8-format", fmt), ("--fp8-recipe", _FP8_RECIPES[stack.fp8_recipe])]


def _graphs_and_offload(model: ModelSpec, lay: Layout, stack: StackSpec) -> list[Flag]:
    """CUDA graphs and CPU activation offloading (transformer_config.py L1075-1090:
    ``cuda_graph_impl``, ``cuda_graph_modules``; arguments.py L1950-1951: a positive
    ``--cpu-offloading-num-layers`` turns ``cpu_offloading`` on). Per-layer graphs capture what
    Megatron-Bridge's recipes capture: attention and the MLP of a dense layer; attention, the
    router and the dispatch preprocessing of a MoE layer (whose expert compute is
    data-dependent: ``moe`` needs drop-padding, L2838-2844)."""
    check_graphs_and_offload("megatron", lay, stack)
    flags: list[Flag] = []
    if stack.cuda_graphs == "full":
        flags.append(("--cuda-graph-impl", "full_iteration"))
    elif stack.cuda_graphs == "layers":
        modules = "attn moe_router moe_preprocess" if model.is_moe else "attn mlp"
        flags += [("--cuda-graph-impl", "transformer_engine"), ("--cuda-graph-modules", modules)]
    if stack.cpu_offload_layers:
        flags.append(("--cpu-offloading-num-layers", str(stack.cpu_offload_layers)))
    return flags


def _stack(model: ModelSpec, lay: Layout, stack: StackSpec) -> list[Flag]:
    """The stack's switches that Megatron-LM takes as flags (``autopar/inputs/stack.py`` names
    them)."""
    flags: list[Flag] = []
    if lay.cp > 1:
        if stack.cp_comm_type == "a2a+p2p":
            raise refuse(
                "megatron",
                "cp_comm_type a2a+p2p without its --hierarchical-context-parallel-sizes",
                "use cp_comm_type p2p or a2a",
            )
        flags.append(("--cp-comm-type", stack.cp_comm_type))
    if stack.tp_comm_overlap and lay.tp > 1:
        if not lay.sequence_parallel:  # arguments.py:1442 asserts it
            raise refuse(
                "megatron",
                "TP communication overlap without sequence parallelism",
                "solve with --sequence-parallel",
            )
        flags.append(("--tp-comm-overlap", None))
    if lay.vpp > 1 and not stack.pp_comm_overlap and lay.pp > 2:
        flags.append(("--no-overlap-p2p-communication", None))  # Megatron overlaps by default
    # --overlap-moe-expert-parallel-comm comes with the combined 1F1B schedule (_pipeline)
    if stack.moe_fused_mlp and model.is_moe:  # transformer_config.py L525
        flags.append(("--use-transformer-engine-op-fuser", None))
    if stack.cross_entropy_fusion:  # Megatron's default implementation is native
        flags.append(("--cross-entropy-loss-fusion", None))
        flags.append(("--cross-entropy-fusion-impl", stack.cross_entropy_impl))
    if not stack.dropout:
        flags += [("--hidden-dropout", "0"), ("--attention-dropout", "0")]
    if not stack.flash_attention:
        flags.append(("--attention-backend", "unfused"))
    return flags + _graphs_and_offload(model, lay, stack)


def _recompute(lay: Layout, model: ModelSpec, stack: StackSpec) -> list[Flag]:
    if lay.recompute == "selective":
        modules = selective_modules(model, stack)
        if modules is None:
            return [("--recompute-granularity", "selective")]
        if not modules:  # nothing of the stack's modules applies to this model
            return []
        return [
            ("--recompute-granularity", "selective"),
            ("--recompute-modules", " ".join(modules)),
        ]
    if lay.recompute == "full":
        return [
            ("--recompute-granularity", "full"),
            ("--recompute-method", "uniform"),
            ("--recompute-num-layers", "1"),
        ]
    return []


def _split_and_recompute(
    item: Estimate | Layout, model: ModelSpec, stack: StackSpec
) -> tuple[list, list]:
    """The pipeline flags and the recompute flags: the layout's, or its per-stage plan's
    (``autopar.outputs.emit.megatron_stages``: the layout flag replaces the uniform split)."""
    lay, plan = layout_of(item), stage_plan_of(item)
    if plan is None:
        return _pipeline(model, lay), _recompute(lay, model, stack)
    modules = selective_modules(model, stack)
    flags = recompute_flags(plan, modules=modules)[0]
    return pipeline_flags(plan, num_mtp_layers=model.num_mtp_layers), flags


def megatron_flags(item: Estimate | Layout, problem: Problem) -> list[Flag]:
    """The arguments as (flag, value) pairs; value ``None`` for a switch."""
    lay = layout_of(item)
    model, training = problem.model, problem.training
    if lay.vpp > 1 and lay.pp == 1:
        raise InputError("vpp > 1 needs pp > 1", source="layout", field="vpp")
    pipeline, recompute = _split_and_recompute(item, model, training.stack)
    flags = _architecture(model, training.seq_len, lay.tp) + _attention_variants(model)
    flags += _moe(model, lay, dispatcher_of(item))
    flags += [("--tensor-model-parallel-size", str(lay.tp)), *pipeline]
    flags.append(("--context-parallel-size", str(lay.cp)))
    if lay.sequence_parallel:
        flags.append(("--sequence-parallel", None))
    flags += [
        ("--micro-batch-size", str(lay.mbs)),
        ("--global-batch-size", str(training.global_batch_sequences)),
        ("--seq-length", str(training.seq_len)),
    ]
    flags += _zero(lay, training.stack) + recompute
    flags += _stack(model, lay, training.stack)
    return flags + _precision(training) + _checkpoint(item, training.stack)


def _checkpoint(item: Estimate | Layout, stack: StackSpec) -> list[Flag]:
    """The checkpoint interval that maximises goodput (``Goodput.checkpoint_interval_steps``,
    ``--save-interval``, training_config.py L398), the asynchronous save (``--async-save``
    needs ``--use-persistent-ckpt-worker``, arguments.py L1814-1820) and the first-replica save
    (``--no-ckpt-fully-parallel-save``, L511) when the stack asks for them."""
    flags: list[Flag] = []
    interval = checkpoint_interval_of(item)
    if interval is not None:
        flags.append(("--save-interval", str(interval)))
    if stack.async_checkpoint:
        flags += [("--async-save", None), ("--use-persistent-ckpt-worker", None)]
    if not stack.ckpt_fully_parallel_save:
        flags.append(("--no-ckpt-fully-parallel-save", None))
    return flags


def megatron_args(item: Estimate | Layout, problem: Problem) -> str:
    """The arguments as one shell-pasteable line."""
    flags = megatron_flags(item, problem)
    # values quoted for the shell: a --moe-layer-freq pattern holds ( ) [ ] *, a
    # --pipeline-model-parallel-layout | and *; a value of several words is a flag of several
    # values (--cuda-graph-modules attn mlp)
    return " ".join(
        flag if value is None else " ".join([flag, *map(shlex.quote, value.split(" "))])
        for flag, value in flags
    )


def megatron_text(item: Estimate | Layout, problem: Problem) -> str:
    """The arguments with a header naming the version targeted and what to add."""
    lay = layout_of(item)
    stack = problem.training.stack
    notes = [
        f"# autopar: pretrain_gpt.py arguments for {problem.model.name}, stack {stack.name}, "
        f"{MEGATRON_TARGET}.",
        "# Add data, optimizer, schedule and --save flags; replace NullTokenizer by yours.",
    ]
    if lay.vpp > 1 and lay.pp == 2 and not stack.pp_comm_overlap:
        notes.append(
            "# PP 2 interleaved: Megatron overlaps P2P here (arguments.py:1006); unplanned."
        )
    if lay.zero >= 2:
        notes.append(
            "# Megatron-FSDP: leave CUDA_DEVICE_MAX_CONNECTIONS unset (arguments.py:1167)."
        )
    elif lay.tp > 1 or lay.cp > 1:
        notes.append(
            "# export CUDA_DEVICE_MAX_CONNECTIONS=1 (arguments.py:1477, before Blackwell)."
        )
    plan = stage_plan_of(item)
    if plan is not None and (note := recompute_flags(plan)[1]) is not None:
        notes.append(note)
    if stack.cuda_graphs == "layers":
        notes.append(
            "# TE CUDA graphs: NCCL_GRAPH_REGISTER=0 if PYTORCH_CUDA_ALLOC_CONF has "
            "expandable_segments:True (arguments.py:1961)."
        )
    return "\n".join([*notes, megatron_args(item, problem)])
