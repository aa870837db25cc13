"""Each layout rule, on its own: one layout the framework accepts and one it rejects.

The brute-force oracle checks the solver against the same rule predicates it encodes, so it
cannot catch a wrong rule; these pairs can. Each pair is taken from the framework's own check
(the rule's ``source``): Megatron-LM ``arguments.py`` / ``transformer_config.py`` /
``parallel_state.py``, torchtitan's ``parallel_dims.py``, DeepSpeed's pipe engine. A new rule
needs a pair here: ``test_every_rule_has_a_pair`` fails otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import autopar
from autopar.base.axes import PIPELINE_SCHEDULES
from autopar.layout.rules import Rule, layout_rules

BASE_ROW: dict[str, int] = {
    "tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "vpp": 1, "mbs": 1,
    "grad_accum": 1, "recompute": 0, "zero": 0, "sp": 0, "schedule": 0,
}  # fmt: skip
S = {name: i for i, name in enumerate(PIPELINE_SCHEDULES)}

LLAMA_70B = {"model": "llama-70b", "gpus": 64}
MIXTRAL = {"model": "mixtral-8x7b", "gpus": 64}
TITAN = {"model": "llama-8b", "gpus": 64, "framework": "torchtitan"}
DEEPSPEED = {"model": "llama-8b", "gpus": 64, "framework": "deepspeed"}
UNEVEN = {"model": "llama-3.1-405b", "gpus": 1024}
EVEN = {"model": "llama-70b", "gpus": 64, "uneven_pipeline": False}
TITAN_70B = {"model": "llama-70b", "gpus": 960, "framework": "torchtitan"}
OVERLAP = {"model": "llama-70b", "gpus": 64, "stack": "nemo-24.07", "sequence_parallel": False}
BIASED_MOE = {"model": "gpt-oss-120b", "gpus": 64}
PINNED = {"model": "llama-8b", "gpus": 64, "tp": 2, "limits": {"pp": 4}, "allow_cp": False}

# (family, rule text fragment): problem options, a row the framework accepts, one it rejects.
CASES: dict[tuple[str, str], tuple[dict[str, Any], dict[str, int], dict[str, int]]] = {
    # Megatron transformer_config.py: num_attention_heads % tensor_model_parallel_size == 0
    ("attention heads vs TP", "num_attention_heads"): (LLAMA_70B, {"tp": 8}, {"tp": 3}),
    # tensor_parallel/layers.py divide(ffn_hidden_size, tp) asserts divisibility
    ("FFN vs TP", "ffn_hidden_size"): (LLAMA_70B, {"tp": 4}, {"tp": 3}),
    # autopar: every stage holds a layer (Megatron's layout flag accepts empty stages)
    ("layers vs PP", "every pipeline stage holds a layer"): (UNEVEN, {"pp": 64}, {"pp": 128}),
    # Llama-3.1 405B as published (PP 8 x VP 8: embedding and loss counted as layers); 16 virtual
    # stages of PP 8 leave the embedding and the loss alone; 17 would leave a chunk empty
    ("layers vs PP", "fill every virtual stage"): (
        UNEVEN,
        {"pp": 8, "vpp": 16},
        {"pp": 8, "vpp": 17},
    ),
    # --even-pipeline: Megatron's even split (num_layers_per_virtual_pipeline_stage), 80 layers
    ("layers vs PP", "(--even-pipeline)"): (EVEN, {"pp": 4, "vpp": 5}, {"pp": 4, "vpp": 3}),
    # torchtitan's output: equal middle virtual stages (80 layers over 6 x 2: 6,7,7,7,7,6,6,...)
    ("layers vs PP", "torchtitan: every virtual stage"): (
        TITAN_70B,
        {"pp": 5, "vpp": 2},
        {"pp": 6, "vpp": 2},
    ),
    # Megatron replicates KV heads when tp > query groups (8 groups: tp 16 ok, tp 3 not)
    ("KV heads vs TP", "or tp % num_key_value_heads"): (LLAMA_70B, {"tp": 16}, {"tp": 3}),
    # torchtitan: tp must divide n_kv_heads (8): tp 16 rejected
    ("KV heads vs TP", "num_key_value_heads (8) % tp == 0"): (TITAN, {"tp": 8}, {"tp": 16}),
    ("dense model", "without experts"): (LLAMA_70B, {}, {"ep": 2}),
    # arguments.py: num_experts % expert_model_parallel_size == 0 (8 experts)
    ("experts vs EP", "num_experts"): (MIXTRAL, {"ep": 8}, {"ep": 3}),
    ("expert FFN vs ETP", "moe_ffn_hidden_size"): (MIXTRAL, {"etp": 2}, {"etp": 3}),
    # parallel_state.py: world size divisible by etp * ep * pp
    # autopar search restriction (issue 12): expert TP is 1 or TP
    ("expert TP", "etp == 1 or etp == tp"): (MIXTRAL, {"tp": 2, "etp": 2}, {"tp": 4, "etp": 2}),
    ("expert grid", "etp*ep*pp"): (MIXTRAL, {"ep": 8, "pp": 8}, {"ep": 8, "pp": 4, "etp": 3}),
    # arguments.py: seq_length % (2 * context_parallel_size) == 0 (load-balanced chunks)
    ("sequence vs CP", "(2*cp)"): (LLAMA_70B, {"cp": 4}, {"cp": 3}),
    # sequence parallelism splits the sequence over TP ranks
    ("sequence vs TP", "sequence parallelism"): (
        LLAMA_70B,
        {"tp": 8, "sp": 1},
        {"tp": 8, "cp": 1024, "sp": 1},
    ),
    ("sequence parallel", "sp on iff tp > 1"): (LLAMA_70B, {"tp": 2, "sp": 1}, {"tp": 2, "sp": 0}),
    ("interleaved schedule", "needs pp > 1"): (LLAMA_70B, {"pp": 2, "vpp": 2}, {"vpp": 2}),
    # schedules.py: interleaving needs num_microbatches % pipeline size == 0
    ("interleaved schedule", "grad_accum % pp"): (
        LLAMA_70B,
        {"pp": 4, "vpp": 2, "grad_accum": 8},
        {"pp": 4, "vpp": 2, "grad_accum": 6},
    ),
    ("framework features", "torchtitan: FSDP"): (TITAN, {"zero": 3}, {"zero": 1}),
    ("framework features", "DeepSpeed: no context"): (DEEPSPEED, {"pp": 2}, {"cp": 2}),
    ("framework features", "DeepSpeed: ZeRO-2/3"): (
        DEEPSPEED,
        {"pp": 2, "zero": 1},
        {"pp": 2, "zero": 2},
    ),
    ("framework features", "DeepSpeed: no Megatron-style"): (DEEPSPEED, {"tp": 2}, {"sp": 1}),
    # arguments.py L1441: --tp-comm-overlap asserts --sequence-parallel
    ("TP overlap", "--tp-comm-overlap"): (OVERLAP, {"tp": 4, "sp": 1}, {"tp": 4, "sp": 0}),
    # transformer_config.py L2612: "Bias in Moe is only supported when ETP==1"
    ("expert bias vs ETP", "biased expert"): (BIASED_MOE, {"etp": 1}, {"etp": 2}),
    ("NVLink domain", "tp <= gpus_per_node"): (LLAMA_70B, {"tp": 8}, {"tp": 16}),
    ("pins and limits", "tp == 2"): (PINNED, {"tp": 2}, {"tp": 4}),
    ("pins and limits", "pp <= 4"): (PINNED, {"pp": 4}, {"pp": 8}),
    ("pins and limits", "cp == 1"): (PINNED, {}, {"cp": 2}),
    # FRAMEWORK_SCHEDULES: what each framework ships (get_schedule_class; engine.py L501)
    ("pipeline schedule", "megatron ships"): (LLAMA_70B, {}, {"schedule": S["zb-v"]}),
    ("pipeline schedule", "torchtitan ships"): (
        TITAN,
        {"schedule": S["zb-v"]},
        {"schedule": S["combined-1f1b"]},
    ),
    ("pipeline schedule", "deepspeed ships"): (DEEPSPEED, {}, {"schedule": S["zb-h1"]}),
    ("pipeline schedule", "pp == 1 runs no pipeline"): (
        TITAN,
        {"pp": 2, "schedule": S["zb-h1"]},
        {"schedule": S["zb-h1"]},
    ),
    # torchtitan pipeline_parallel.py L245-257: single-stage 1 chunk, multi-stage >= 2
    ("pipeline schedule", "gpipe runs one chunk"): (
        TITAN,
        {"pp": 2, "schedule": S["gpipe"]},
        {"pp": 2, "vpp": 2, "schedule": S["gpipe"]},
    ),
    ("pipeline schedule", "looped-bfs and zb-h1"): (
        TITAN,
        {"pp": 2, "vpp": 2, "schedule": S["looped-bfs"]},
        {"pp": 2, "schedule": S["looped-bfs"]},
    ),
    # schedules.py L3505-3509 / L3691-3695: ZBV and DualPipeV need exactly 2 stages per rank
    ("pipeline schedule", "exactly two chunks"): (
        TITAN,
        {"pp": 4, "vpp": 2, "schedule": S["dualpipe-v"], "grad_accum": 8},
        {"pp": 4, "vpp": 4, "schedule": S["zb-v"]},
    ),
    # Schedule1F1B: n_microbatches >= num_stages (L1231-1235)
    ("pipeline schedule", "1F1B needs grad_accum >= pp"): (
        TITAN,
        {"pp": 4, "grad_accum": 4},
        {"pp": 4, "grad_accum": 3},
    ),
    # m % max(1, m // pp): 10 micro-batches over 4 ranks are 2 rounds of 5; 9 are not
    ("pipeline schedule", "Interleaved1F1B / InterleavedZeroBubble"): (
        TITAN,
        {"pp": 4, "vpp": 2, "grad_accum": 10, "schedule": S["zb-h1"]},
        {"pp": 4, "vpp": 2, "grad_accum": 9},
    ),
    ("pipeline schedule", "DualPipeV needs grad_accum >= 2*pp"): (
        TITAN,
        {"pp": 4, "vpp": 2, "grad_accum": 8, "schedule": S["dualpipe-v"]},
        {"pp": 4, "vpp": 2, "grad_accum": 7, "schedule": S["dualpipe-v"]},
    ),
    # transformer_config.py L3002-3046: --overlap-moe-expert-parallel-comm
    ("pipeline schedule", "combined-1f1b needs expert layers"): (
        LLAMA_70B,
        {},
        {"schedule": S["combined-1f1b"]},
    ),
    ("pipeline schedule", "needs ep > 1"): (
        MIXTRAL,
        {"pp": 2, "vpp": 2, "ep": 8, "schedule": S["combined-1f1b"]},
        {"pp": 2, "ep": 8, "schedule": S["combined-1f1b"]},
    ),
    ("pipeline schedule", "full recompute"): (
        MIXTRAL,
        {"recompute": 1, "schedule": S["combined-1f1b"]},
        {"recompute": 2, "schedule": S["combined-1f1b"]},
    ),
}

PROBLEMS = (
    LLAMA_70B, MIXTRAL, TITAN, DEEPSPEED, UNEVEN, EVEN, TITAN_70B, PINNED, OVERLAP, BIASED_MOE,
)  # fmt: skip


def _rules(options: dict[str, Any]) -> tuple[Rule, ...]:
    return layout_rules(autopar.make_problem(**options))


def _find(options: dict[str, Any], family: str, fragment: str) -> Rule:
    found = [r for r in _rules(options) if r.family == family and fragment in r.text]
    assert len(found) == 1, (family, fragment, [r.text for r in _rules(options)])
    return found[0]


def _holds(rule: Rule, overrides: dict[str, int]) -> bool:
    row = {**BASE_ROW, **overrides}
    return bool(rule.check({a: np.array([row[a]]) for a in rule.axes})[0])


@pytest.mark.parametrize("key", list(CASES), ids=[f"{f}: {t}" for f, t in CASES])
def test_rule_accepts_and_rejects(key: tuple[str, str]) -> None:
    options, good, bad = CASES[key]
    rule = _find(options, *key)
    assert rule.source, "every rule cites its source"
    assert _holds(rule, good), f"{rule.text} should accept {good}"
    assert not _holds(rule, bad), f"{rule.text} should reject {bad}"


def test_every_rule_has_a_pair() -> None:
    missing = [
        (rule.family, rule.text)
        for options in PROBLEMS
        for rule in _rules(options)
        if not any(rule.family == f and t in rule.text for f, t in CASES)
    ]
    assert missing == []


def test_each_rule_says_whose_it_is() -> None:
    """A ``framework`` rule cites the framework's own check; a ``user`` rule is the user's and
    says how to lift it; a ``default`` is autopar's (its source says so) or the framework's
    advice, never presented as something the framework raises on (issue 21: proofs state what
    they cover)."""
    for options in PROBLEMS:
        for rule in _rules(options):
            if rule.kind == "framework":
                assert "autopar" not in rule.source and rule.source != "user option", rule
            elif rule.kind == "user":
                assert rule.source == "user option" and rule.lift, rule
            else:
                assert rule.kind == "default", rule
                advice = ("autopar", "guide", "recommends")
                assert any(word in rule.source for word in advice), rule
