"""What autopar does with each key of a Hugging Face ``config.json``, per ``model_type`` (data).

One table, read by ``autopar.inputs.hf_config``: a key of a downloaded config is either **read**
(modelled: it reaches the ``ModelSpec`` and every emitter), **harmless** (ignored, with the reason
it changes nothing autopar plans or emits), or **refused** (it changes the computation in a way
autopar does not model: exit 2 naming the key and the file). A key in none of the three lists of
the file's ``model_type`` is refused too, as not reviewed: nothing is read as something else.
A ``model_type`` not listed here is refused with the list of those that are.

Each family cites the transformers files whose code fixes what the config leaves implicit
(``implied``): Qwen2's q/k/v biases, Qwen3's q/k RMSNorm, Qwen1.5-MoE's shared-expert gate,
Gemma's GeGLU and extra norms, GPT-2's learned positions and biases.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

COMMON_READ: tuple[str, ...] = (
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "head_dim",
    "tie_word_embeddings",
    "max_position_embeddings",
    "hidden_act",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "rms_norm_eps",
)
"""Keys every decoder family below reads (``autopar.inputs.hf_config.MODEL_KEYS`` and the RoPE,
activation and norm keys)."""

_DROPOUT = "dropout is the training stack's switch (--dropout / --no-dropout), not the model's"
_INIT = "weight initialisation only: no effect on the step's work or its launch flags"
_TOKENS = "tokenizer ids: no effect on the layers"
_INFERENCE = "inference-time setting (KV cache, generation, attention kernel choice)"
_LOSS = (
    "a training-loss coefficient of the router: it changes no layer shape, FLOP or byte; the "
    "launch flags keep the framework's default (set it in the recipe)"
)

COMMON_HARMLESS: dict[str, str] = {
    # transformers PretrainedConfig (configuration_utils.py) bookkeeping
    **dict.fromkeys(
        ("_name_or_path", "architectures", "auto_map", "transformers_version", "name_or_path"),
        "file bookkeeping",
    ),
    **dict.fromkeys(
        ("torch_dtype", "dtype"), "the checkpoint's dtype; training runs at --precision"
    ),
    "quantization_config": "how the checkpoint's weights are stored; training runs at --precision",
    **dict.fromkeys(
        (
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "sep_token_id",
            "decoder_start_token_id",
            "tokenizer_class",
        ),
        _TOKENS,
    ),
    **dict.fromkeys(
        (
            "use_cache",
            "cache_implementation",
            "_attn_implementation",
            "_attn_implementation_autoset",
            "max_length",
            "min_length",
            "do_sample",
            "early_stopping",
            "num_beams",
            "num_beam_groups",
            "diversity_penalty",
            "temperature",
            "top_k",
            "top_p",
            "typical_p",
            "repetition_penalty",
            "length_penalty",
            "no_repeat_ngram_size",
            "encoder_no_repeat_ngram_size",
            "bad_words_ids",
            "num_return_sequences",
            "output_scores",
            "return_dict_in_generate",
            "forced_bos_token_id",
            "forced_eos_token_id",
            "remove_invalid_values",
            "exponential_decay_length_penalty",
            "suppress_tokens",
            "begin_suppress_tokens",
            "task_specific_params",
            "output_attentions",
            "output_hidden_states",
            "return_dict",
            "torchscript",
            "use_bfloat16",
            "tf_legacy_loss",
            "pruned_heads",
            "chunk_size_feed_forward",
            "is_encoder_decoder",
            "is_decoder",
            "add_cross_attention",
            "tie_encoder_decoder",
            "cross_attention_hidden_size",
            "id2label",
            "label2id",
            "problem_type",
            "finetuning_task",
            "prefix",
        ),
        _INFERENCE,
    ),
    "initializer_range": _INIT,
    **dict.fromkeys(
        ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"), _DROPOUT
    ),
    "pretraining_tp": "inference-time split of the same matmuls (modeling_llama.py): same math",
}


@dataclass(frozen=True, slots=True)
class Family:
    """One ``model_type``: the keys it reads beyond ``COMMON_READ``, those ignored as harmless
    (key -> why), those refused when set to anything but their no-op value (key -> what they
    change), what its modeling code fixes that the config does not say (``implied``:
    ``ModelSpec`` field -> value), and the facts of its modeling code the details read
    (``gated_mlp``, ``refuses_attention_bias``, ``renormalised_topk``)."""

    source: str
    read: tuple[str, ...] = ()
    harmless: Mapping[str, str] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)
    implied: Mapping[str, Any] = field(default_factory=dict)
    gated_mlp: bool = False
    """The MLP is gated in the modeling code (``act(gate(x)) * up(x)``): the activation key
    gives SwiGLU or GeGLU (``autopar.inputs.hf_details.activation_of``)."""
    refuses_attention_bias: bool = False
    """``attention_bias: true`` (biases on q, k, v and the output projection) is not modelled
    for this family."""
    renormalised_topk: bool = False
    """The router normalises the top-k probabilities whatever ``norm_topk_prob`` says (Mixtral
    and GPT-OSS: softmax over the top-k logits; Llama 4: top-1)."""


_SLIDING = ("sliding_window", "use_sliding_window", "max_window_layers", "layer_types")
_MOE = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step")
_QWEN_MOE = (*_MOE, "mlp_only_layers", "norm_topk_prob", "shared_expert_intermediate_size")
_ROUTER_LOSS = dict.fromkeys(("router_aux_loss_coef", "output_router_logits"), _LOSS)
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_DEEPSEEK_READ = (
    *MLA_KEYS,
    "attention_bias",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "first_k_dense_replace",
    "moe_layer_freq",
    "n_group",
    "topk_group",
    "num_nextn_predict_layers",
    "topk_method",
    "scoring_func",
    "norm_topk_prob",
    "routed_scaling_factor",
    "seq_aux",
)
_DEEPSEEK = Family(
    source="transformers models/deepseek_v3/configuration_deepseek_v3.py, modeling_deepseek_v3.py "
    "(DeepseekV3TopkRouter: sigmoid scores, e_score_correction_bias, routed_scaling_factor)",
    gated_mlp=True,
    read=_DEEPSEEK_READ,
    harmless={
        "aux_loss_alpha": _LOSS,
        "ep_size": "the inference checkpoint's expert split; the layout is autopar's to choose",
        "rope_interleave": "the order of the rotary pairs in the weights: same math",
    },
    # MLA's RMSNorms on the compressed query and key-value latents (q_a_layernorm,
    # kv_a_layernorm in modeling_deepseek_v3.py DeepseekV3Attention): Megatron's MLA applies
    # them when qk_layernorm is set (multi_latent_attention.py; Megatron-Bridge's DeepSeek
    # bridges set it, models/deepseek/deepseek_v3_bridge.py:62)
    implied={"qk_layernorm": True},
)
_GEMMA_IMPLIED = {"gemma_norms": True, "norm_zero_centered": True, "tied_embeddings": True}

FAMILIES: dict[str, Family] = {
    "llama": Family(
        source="transformers models/llama/configuration_llama.py, modeling_llama.py",
        gated_mlp=True,
        refuses_attention_bias=True,
        read=("attention_bias", "mlp_bias"),
    ),
    "mistral": Family(
        source="transformers models/mistral/configuration_mistral.py, modeling_mistral.py "
        "(sliding_window: every layer attends to the last sliding_window keys)",
        gated_mlp=True,
        refuses_attention_bias=True,
        read=("sliding_window",),
    ),
    "mixtral": Family(
        source="transformers models/mixtral/configuration_mixtral.py, modeling_mixtral.py "
        "(softmax over the top-k logits: normalised top-k probabilities)",
        gated_mlp=True,
        renormalised_topk=True,
        read=("sliding_window", "num_local_experts", "num_experts_per_tok"),
        harmless=_ROUTER_LOSS,
        refused={"router_jitter_noise": "multiplies the router input by noise in training"},
    ),
    "qwen2": Family(
        source="transformers models/qwen2/modeling_qwen2.py (q_proj/k_proj/v_proj bias=True, "
        "o_proj bias=False; sliding layers from max_window_layers on, when use_sliding_window)",
        gated_mlp=True,
        read=_SLIDING,
        refused={"use_mrope": "multimodal rotary sections (Qwen2-VL)"},
        implied={"qkv_bias": True},
    ),
    "qwen2_moe": Family(
        source="transformers models/qwen2_moe/modeling_qwen2_moe.py (q/k/v biases; "
        "shared_expert_gate: a sigmoid gate on the shared expert; norm_topk_prob)",
        gated_mlp=True,
        read=(*_SLIDING, *_QWEN_MOE),
        harmless=_ROUTER_LOSS,
        implied={"qkv_bias": True},
    ),
    "qwen3": Family(
        source="transformers models/qwen3/modeling_qwen3.py (q_norm/k_norm: RMSNorm per head)",
        gated_mlp=True,
        refuses_attention_bias=True,
        read=(*_SLIDING, "attention_bias"),
        implied={"qk_layernorm": True},
    ),
    "qwen3_moe": Family(
        source="transformers models/qwen3_moe/modeling_qwen3_moe.py (q_norm/k_norm, no shared "
        "expert)",
        gated_mlp=True,
        refuses_attention_bias=True,
        read=(*_SLIDING, "attention_bias", *_QWEN_MOE),
        harmless=_ROUTER_LOSS,
        implied={"qk_layernorm": True},
    ),
    "phi3": Family(
        source="transformers models/phi3/configuration_phi3.py, modeling_phi3.py (sliding_window "
        "on every layer; partial_rotary_factor)",
        gated_mlp=True,
        refuses_attention_bias=True,
        read=("sliding_window", "attention_bias", "partial_rotary_factor"),
        harmless={
            "original_max_position_embeddings": "read by longrope scaling only (rope_scaling)",
        },
    ),
    "gemma2": Family(
        source="transformers models/gemma2/modeling_gemma2.py (GeGLU with gelu_pytorch_tanh; "
        "post-attention and post-feedforward RMSNorms; RMSNorm weights as 1 + w; embeddings "
        "scaled by sqrt(hidden); even layers slide; tanh soft-capping; query_pre_attn_scalar)",
        gated_mlp=True,
        refuses_attention_bias=True,
        read=(
            "hidden_activation",
            "attention_bias",
            "sliding_window",
            "sliding_window_size",
            "layer_types",
            "query_pre_attn_scalar",
            "attn_logit_softcapping",
            "final_logit_softcapping",
        ),
        implied=_GEMMA_IMPLIED,
    ),
    "gemma3_text": Family(
        source="transformers models/gemma3/modeling_gemma3.py (as gemma2, plus q/k RMSNorm; "
        "every sliding_window_pattern-th layer full; local layers use rope_local_base_freq)",
        gated_mlp=True,
        refuses_attention_bias=True,
        read=(
            "hidden_activation",
            "attention_bias",
            "sliding_window",
            "sliding_window_pattern",
            "layer_types",
            "query_pre_attn_scalar",
            "attn_logit_softcapping",
            "final_logit_softcapping",
            "rope_local_base_freq",
        ),
        harmless={"use_bidirectional_attention": "False in every causal-LM checkpoint"},
        implied={**_GEMMA_IMPLIED, "qk_layernorm": True},
    ),
    "gpt2": Family(
        source="transformers models/gpt2/modeling_gpt2.py (learned absolute positions, "
        "LayerNorm, biases on every linear layer, tied output layer)",
        read=("activation_function", "layer_norm_epsilon", "scale_attn_weights"),
        harmless={
            "n_ctx": "the same as n_positions",
            "reorder_and_upcast_attn": "computes the same attention scores in FP32",
            **dict.fromkeys(
                (
                    "summary_type",
                    "summary_use_proj",
                    "summary_activation",
                    "summary_proj_to_labels",
                    "summary_first_dropout",
                ),
                "the sequence-classification head, not trained with the language model",
            ),
        },
        refused={"scale_attn_by_inverse_layer_idx": "scales attention scores by 1/(layer+1)"},
        implied={
            "learned_position_embeddings": True,
            "layernorm": True,
            "linear_bias": True,
            "tied_embeddings": True,
        },
    ),
    "nemotron": Family(
        source="transformers models/nemotron/modeling_nemotron.py (NemotronLayerNorm1P: "
        "LayerNorm with weights applied as 1 + w; squared-ReLU MLP; partial rotary)",
        read=("partial_rotary_factor", "norm_eps", "mlp_bias", "attention_bias"),
        implied={"layernorm": True, "norm_zero_centered": True},
    ),
    "deepseek_v2": _DEEPSEEK,
    "deepseek_v3": _DEEPSEEK,
    "kimi_k2": _DEEPSEEK,
    "gpt_oss": Family(
        source="transformers models/gpt_oss/configuration_gpt_oss.py, modeling_gpt_oss.py",
        gated_mlp=True,
        renormalised_topk=True,
        read=(
            "num_local_experts",
            "num_experts_per_tok",
            "experts_per_token",
            "layer_types",
            "sliding_window",
            "attention_bias",
            "swiglu_limit",
        ),
        harmless={
            **_ROUTER_LOSS,
            "initial_context_length": (
                "the pre-training context before YaRN extension (rope_scaling)"
            ),
        },
    ),
    "llama4_text": Family(
        source="transformers models/llama4/configuration_llama4.py, modeling_llama4.py",
        gated_mlp=True,
        renormalised_topk=True,
        read=(
            "num_local_experts",
            "num_experts_per_tok",
            "interleave_moe_layer_step",
            "moe_layers",
            "intermediate_size_mlp",
            "attention_chunk_size",
            "no_rope_layers",
            "use_qk_norm",
            "attention_bias",
        ),
        harmless={
            **_ROUTER_LOSS,
            "router_jitter_noise": "0 in every Llama 4 checkpoint; read by no training path",
            "attn_temperature_tuning": "inference-time scaling of long-context attention",
            "floor_scale": "inference-time scaling of long-context attention",
            "attn_scale": "inference-time scaling of long-context attention",
        },
    ),
    "nemotron_h": Family(
        source="transformers models/nemotron_h (NemotronHConfig); Megatron "
        "megatron/core/ssm/mamba_hybrid_layer_allocation.py",
        read=(
            "hybrid_override_pattern",
            "mamba_num_heads",
            "mamba_head_dim",
            "ssm_state_size",
            "n_groups",
            "conv_kernel",
            "expand",
            "chunk_size",
            "mamba_hidden_act",
            "mamba_proj_bias",
            "use_conv_bias",
            "use_bias",
            "mlp_bias",
            "attention_bias",
            "mlp_hidden_act",
            "attention_head_dim",
            "n_routed_experts",
            "n_shared_experts",
            "moe_shared_expert_intermediate_size",
            "moe_intermediate_size",
            "num_experts_per_tok",
            "n_group",
            "topk_group",
            "num_nextn_predict_layers",
            "mtp_hybrid_override_pattern",
            "moe_latent_size",
            "norm_topk_prob",
            "routed_scaling_factor",
            "residual_in_fp32",
            "layer_norm_epsilon",
        ),
        harmless={
            **_ROUTER_LOSS,
            **dict.fromkeys(
                ("time_step_min", "time_step_max", "time_step_floor", "time_step_limit"),
                "Mamba dt initialisation and clamping: no effect on shapes or work",
            ),
            "rescale_prenorm_residual": _INIT,
            "num_logits_to_keep": _INFERENCE,
        },
    ),
}
"""model_type -> what autopar does with its keys (``llama4`` and ``gemma3`` configs nest the
language model under ``text_config``, read as ``llama4_text`` / ``gemma3_text``)."""

SUPPORTED = ", ".join(sorted(FAMILIES))


def key_status(model_type: str, key: str) -> tuple[str, str]:
    """``("read" | "harmless" | "refused" | "unknown", reason)`` of ``key`` in a config of
    ``model_type`` (a listed family)."""
    family = FAMILIES[model_type]
    if key in COMMON_READ or key in family.read:
        return "read", ""
    if key in family.refused:
        return "refused", family.refused[key]
    reason = family.harmless.get(key) or COMMON_HARMLESS.get(key)
    if reason is not None:
        return "harmless", reason
    return "unknown", ""
