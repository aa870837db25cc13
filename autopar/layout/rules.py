"""The layout rules (DESIGN §2), one table, each rule with its source and framework.

A rule is a vectorised predicate over a few grid axes. ``autopar.layout.space`` folds the
single-axis rules into the axes' domains and filters the cost tables' rows with the others; the
CP-SAT model also states each rule as an allowed-assignments table over its axes (with one
assumption literal per ``family`` when it explains infeasibility). The brute-force oracle and
``evaluate`` apply the same predicates. The two product rules (``num_gpus = tp*pp*cp*dp`` and
``global_batch = mbs*dp*grad_accum``) are not in this table: they live with the space
(``autopar.layout.space.products``), which derives ``dp`` and ``grad_accum`` from them, and the
model states them as tables of the allowed factorisations.
"""

from __future__ import annotations

import numpy as np

from autopar.base.axes import RECOMPUTE_MODES
from autopar.inputs.specs import Problem
from autopar.layout.rule import Grid, Rule, RuleKind
from autopar.layout.schedule_rules import schedule_rules
from autopar.layout.split import split_ok

__all__ = ["Grid", "Rule", "RuleKind", "layout_rules"]


def _divides(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    return np.asarray(b) % np.asarray(a) == 0


def _pipeline_split_rules(problem: Problem) -> list[Rule]:
    """The split rules (``autopar.layout.split``): Megatron's ``--pipeline-model-parallel-layout``
    accepts any split, so only autopar's own uniform-plan assumptions bind (a layer on every
    stage, and on every chunk but an embedding- or loss-only end); ``--even-pipeline`` asks for
    Megatron's even split only."""
    layers, mtp = problem.model.num_layers, problem.model.num_mtp_layers
    rules = [
        Rule(
            family="layers vs PP",
            text=f"pp <= num_layers ({layers}): every pipeline stage holds a layer",
            axes=("pp",),
            check=lambda g: g["pp"] <= layers,
            source="autopar: a stage without layers only lengthens the pipeline (Megatron's "
            "pipeline_parallel_layer_layout.py accepts empty stages)",
            kind="default",
            brief="every pipeline stage holds a layer",
        ),
        Rule(
            family="layers vs PP",
            text=f"num_layers ({layers}) fill every virtual stage (pp*vpp chunks; the embedding "
            "and the loss may sit alone in the first and last)",
            axes=("pp", "vpp"),
            check=lambda g: split_ok(layers, g["pp"], g["vpp"], mtp_layers=mtp),
            source="autopar uniform plan (autopar.layout.split); Megatron "
            "--pipeline-model-parallel-layout takes any split",
            kind="default",
            brief="every virtual stage holds a layer (the embedding or the loss may sit alone)",
        ),
    ]
    if problem.options.framework == "torchtitan":
        rules.append(
            Rule(
                family="layers vs PP",
                text="torchtitan: every virtual stage but the first and the last holds the same "
                "number of layers",
                axes=("pp", "vpp"),
                check=lambda g: split_ok(layers, g["pp"], g["vpp"], mtp_layers=mtp, ends_only=True),
                source="autopar's torchtitan output: pipeline_parallel_layers_per_stage with "
                "first/last_stage_less_layers (torchtitan distributed/pipeline_parallel.py)",
                kind="default",
                brief="equal middle virtual stages (what the torchtitan output expresses)",
            )
        )
    if not problem.options.uneven_pipeline:
        rules.append(
            Rule(
                family="layers vs PP",
                text=f"num_layers ({layers}) % (pp*vpp) == 0 (--even-pipeline)",
                axes=("pp", "vpp"),
                check=lambda g: _divides(g["pp"] * g["vpp"], layers),
                source="user option",
                kind="user",
                lift="--uneven-pipeline",
                brief="even pipeline splits only",
            )
        )
    return rules


def _model_rules(problem: Problem) -> list[Rule]:
    """The rules the model's shapes set: attention, MLP and pipeline split, then the experts."""
    return [
        *_tensor_rules(problem),
        *_pipeline_split_rules(problem),
        *(_expert_rules(problem) if problem.model.is_moe else _dense_rules()),
    ]


def _tensor_rules(problem: Problem) -> list[Rule]:
    """Heads, KV heads (query groups) and the FFN split over TP ranks."""
    m, framework = problem.model, problem.options.framework
    heads, kv = m.num_attention_heads, m.num_kv_heads
    rules = [
        Rule(
            family="attention heads vs TP",
            text=f"num_attention_heads ({heads}) % tp == 0",
            axes=("tp",),
            check=lambda g: _divides(g["tp"], heads),
            source="Megatron transformer_config.py",
        ),
        Rule(
            family="FFN vs TP",
            text=f"ffn_hidden_size ({m.ffn_hidden_size}) % tp == 0",
            axes=("tp",),
            check=lambda g: _divides(g["tp"], m.ffn_hidden_size),
            source="Megatron tensor_parallel/layers.py divide()",
        ),
    ]
    if framework == "torchtitan":
        rules.append(
            Rule(
                family="KV heads vs TP",
                text=f"num_key_value_heads ({kv}) % tp == 0",
                axes=("tp",),
                check=lambda g: _divides(g["tp"], kv),
                source="torchtitan models/llama3 parallelize (tp must divide n_kv_heads)",
            )
        )
    else:
        rules.append(
            Rule(
                family="KV heads vs TP",
                text=f"num_key_value_heads ({kv}) % tp == 0 or tp % num_key_value_heads == 0",
                axes=("tp",),
                check=lambda g: _divides(g["tp"], kv) | _divides(kv, g["tp"]),
                source="Megatron PR #2565 (KV heads replicated when tp > query groups)",
            )
        )
    return rules


def _expert_rules(problem: Problem) -> list[Rule]:
    """Experts over EP, the expert FFN over ETP, and the expert grid over the GPUs."""
    m = problem.model
    rules = [
        Rule(
            family="experts vs EP",
            text=f"num_experts ({m.num_experts}) % ep == 0",
            axes=("ep",),
            check=lambda g: _divides(g["ep"], m.num_experts),
            source="Megatron arguments.py",
        ),
        Rule(
            family="expert FFN vs ETP",
            text=f"moe_ffn_hidden_size ({m.expert_ffn_hidden_size}) % etp == 0",
            axes=("etp",),
            check=lambda g: _divides(g["etp"], m.expert_ffn_hidden_size),
            source="Megatron moe/experts.py divide()",
        ),
        Rule(
            family="expert TP",
            text="etp == 1 or etp == tp",
            axes=("etp", "tp"),
            check=lambda g: (g["etp"] == 1) | (g["etp"] == g["tp"]),
            source="autopar search restriction (issue 12): an expert TP other than 1 or TP "
            "adds token all-gathers over more ranks for memory that EP saves without them",
            kind="default",
            brief="expert TP 1 or equal to TP",
        ),
        Rule(
            family="expert grid",
            text=f"num_gpus ({problem.training.num_gpus}) % (etp*ep*pp) == 0",
            axes=("etp", "ep", "pp"),
            check=lambda g: _divides(g["etp"] * g["ep"] * g["pp"], problem.training.num_gpus),
            source="Megatron parallel_state.py (expert grid ETP x EP x expert-DP x PP)",
        ),
    ]
    if m.linear_bias and problem.options.framework == "megatron":
        rules.append(
            Rule(
                family="expert bias vs ETP",
                text="biased expert layers need etp == 1",
                axes=("etp",),
                check=lambda g: g["etp"] == 1,
                source="Megatron transformer_config.py L2612-2615 (Bias in MoE only with ETP==1)",
            )
        )
    return rules


def _dense_rules() -> list[Rule]:
    return [
        Rule(
            family="dense model",
            text="ep == 1 and etp == 1 without experts",
            axes=("ep", "etp"),
            check=lambda g: (g["ep"] == 1) & (g["etp"] == 1),
            source="no expert layers to shard",
        )
    ]


def sequence_parallel_on(problem: Problem, tp: np.ndarray | int) -> np.ndarray:
    """Whether a layout with ``tp`` runs sequence parallelism: with TP, unless
    ``--no-sequence-parallel`` says otherwise; DeepSpeed has no SP region, so there it is off
    unless asked for (and then its framework rule rejects it)."""
    option = problem.options.sequence_parallel
    on = problem.options.framework != "deepspeed" if option is None else bool(option)
    return (np.asarray(tp) > 1) & on


def _sequence_rules(problem: Problem) -> list[Rule]:
    seq = problem.training.seq_len

    framework = problem.options.framework
    tp_overlap = framework == "megatron" and problem.training.stack.tp_comm_overlap

    def sp_choice(g: Grid) -> np.ndarray:
        return g["sp"] == sequence_parallel_on(problem, g["tp"]).astype(np.int64)

    rules = []
    if framework == "deepspeed":
        rules.append(
            Rule(
                family="framework features",
                text="DeepSpeed: no Megatron-style sequence parallelism (sp == 0)",
                axes=("sp",),
                check=lambda g: g["sp"] == 0,
                source="DeepSpeed pipe/ZeRO engines have no SP region; Ulysses is a CP scheme",
            )
        )
    if tp_overlap:
        rules.append(
            Rule(
                family="TP overlap",
                text="the stack's --tp-comm-overlap needs sequence parallelism when tp > 1",
                axes=("tp", "sp"),
                check=lambda g: (g["tp"] == 1) | (g["sp"] == 1),
                source="Megatron arguments.py L1441-1442 (asserts sequence_parallel)",
            )
        )
    return [
        *rules,
        *_cp_comm_rules(problem),
        Rule(
            family="sequence vs CP",
            text=f"seq_len ({seq}) % (2*cp) == 0 (cp > 1)",
            axes=("cp",),
            check=lambda g: (g["cp"] == 1) | _divides(2 * g["cp"], seq),
            source="Megatron arguments.py; torchtitan seq_len_divisor (load-balanced CP)",
        ),
        Rule(
            family="sequence vs TP",
            text="(seq_len/cp) % tp == 0 with sequence parallelism",
            axes=("cp", "tp", "sp"),
            check=lambda g: (
                (g["sp"] == 0) | (_divides(g["cp"], seq) & _divides(g["tp"], seq // g["cp"]))
            ),
            source="torchtitan parallel_dims.seq_len_divisor (PR #640)",
        ),
        Rule(
            family="sequence parallel",
            text="sp on iff tp > 1 (or as --sequence-parallel says; off by default on DeepSpeed)",
            axes=("tp", "sp"),
            check=sp_choice,
            source="Megatron recommends --sequence-parallel with tp > 1"
            if problem.options.sequence_parallel is None
            else "user option",
            kind="default" if problem.options.sequence_parallel is None else "user",
            lift=None if problem.options.sequence_parallel is None else _sp_lift(problem),
            brief="sequence parallelism whenever TP > 1"
            if problem.options.sequence_parallel is None
            else f"sequence parallelism {'on' if problem.options.sequence_parallel else 'off'}",
        ),
    ]


def _sp_lift(problem: Problem) -> str:
    given = "--sequence-parallel" if problem.options.sequence_parallel else "--no-sequence-parallel"
    return f"drop {given}"


def _cp_comm_rules(problem: Problem) -> list[Rule]:
    """All-to-all CP (``a2a``; the in-node part of ``a2a+p2p``) moves whole heads: the query and
    key/value heads of a TP rank must divide over its all-to-all group (Transformer Engine
    ``AttnFuncWithCPAndQKVOA2A`` asserts it). ``p2p`` has no such rule."""
    kind = problem.training.stack.cp_comm_type
    if kind == "p2p":
        return []
    heads, kv = problem.model.num_attention_heads, problem.model.num_kv_heads
    node = problem.cluster.gpus_per_node

    def ok(g: Grid) -> np.ndarray:
        tp, cp = g["tp"], g["cp"]
        a2a = cp if kind == "a2a" else np.maximum(np.minimum(cp, node // tp), 1)
        local_kv = np.maximum(kv // tp, 1)
        return (cp == 1) | (((heads // tp) % a2a == 0) & (local_kv % a2a == 0))

    return [
        Rule(
            family="heads vs CP all-to-all",
            text=f"heads/tp ({heads}/tp) and kv heads/tp ({kv}/tp) divide over the CP "
            f"all-to-all ({kind})",
            axes=("tp", "cp"),
            check=ok,
            source="Transformer Engine attention.py AttnFuncWithCPAndQKVOA2A",
        )
    ]


def _schedule_rules(problem: Problem) -> list[Rule]:
    rules = [
        Rule(
            family="interleaved schedule",
            text="vpp > 1 needs pp > 1",
            axes=("pp", "vpp"),
            check=lambda g: (g["vpp"] == 1) | (g["pp"] > 1),
            source="Megatron arguments.py",
        ),
    ]
    if problem.options.framework == "megatron":
        rules.append(
            Rule(
                family="interleaved schedule",
                text="vpp > 1 needs grad_accum % pp == 0",
                axes=("pp", "vpp", "grad_accum"),
                check=lambda g: (g["vpp"] == 1) | _divides(g["pp"], g["grad_accum"]),
                source="Megatron schedules.py forward_backward_pipelining_with_interleaving",
            )
        )
    if problem.options.framework == "deepspeed":
        rules.append(
            Rule(
                family="framework features",
                text="DeepSpeed: no context parallelism or interleaved pipeline",
                axes=("cp", "vpp"),
                check=lambda g: (g["cp"] == 1) & (g["vpp"] == 1),
                source="DeepSpeed pipe engine (1F1B only); Ulysses is not ring CP",
            )
        )
        rules.append(
            Rule(
                family="framework features",
                text="DeepSpeed: ZeRO-2/3 do not combine with pipeline parallelism",
                axes=("pp", "zero"),
                check=lambda g: (g["pp"] == 1) | (g["zero"] <= 1),
                source="DeepSpeed runtime/pipe/engine.py (asserts zero stage < 2)",
            )
        )
    if problem.options.framework == "torchtitan":
        rules.append(
            Rule(
                family="framework features",
                text="torchtitan: FSDP shards gradients too (no optimizer-only sharding, ZeRO-1)",
                axes=("zero",),
                check=lambda g: g["zero"] != 1,
                source="torchtitan distributed/parallelize (FSDP2 fully_shard or DDP)",
            )
        )
    return rules


def _placement_rules(problem: Problem) -> list[Rule]:
    """Performance advice the user can turn off (``SearchOptions.tp_within_node``). EP across
    nodes is no rule: Megatron raises nothing, and ``EpCommTime`` prices its network share."""
    node = problem.cluster.gpus_per_node
    if not problem.options.tp_within_node:
        return []
    return [
        Rule(
            family="NVLink domain",
            text=f"tp <= gpus_per_node ({node})",
            axes=("tp",),
            check=lambda g: g["tp"] <= node,
            source="Megatron performance guide: TP inside the NVLink domain",
            kind="default",
            lift="--no-tp-within-node",
            brief=f"TP within one NVLink domain ({node} GPUs)",
        ),
    ]


def _option_rules(problem: Problem) -> list[Rule]:
    """User pins and limits; a feature turned off pins its size to 1. Each names how to lift it."""
    opts = problem.options
    pins = [
        (dim, value, f"{dim} == {value} (pinned)", f"drop --{dim.replace('_', '-')} {value}")
        for dim, value in opts.pins
    ]
    for allowed, dim, feature, flag in (
        (opts.allow_cp, "cp", "context parallelism", "--context-parallel"),
        (opts.allow_ep, "ep", "expert parallelism", "--expert-parallel"),
        (opts.allow_interleaving, "vpp", "interleaving", "--interleaving"),
    ):
        if not allowed:
            pins.append((dim, 1, f"{dim} == 1 ({feature} off)", flag))
    limits = [
        (dim, value, f"{dim} <= {value} (limit)", f"raise --max-{dim.replace('_', '-')} {value}")
        for dim, value in opts.maxima
    ]
    return [
        Rule(
            family="pins and limits",
            text=text,
            axes=(dim,),
            source="user option",
            check=lambda g, d=dim, v=value: g[d] == v,
            kind="user",
            lift=lift,
        )
        for dim, value, text, lift in pins
    ] + [
        Rule(
            family="pins and limits",
            text=text,
            axes=(dim,),
            source="user option",
            check=lambda g, d=dim, v=value: g[d] <= v,
            kind="user",
            lift=lift,
        )
        for dim, value, text, lift in limits
    ]


def _offload_rules(problem: Problem) -> list[Rule]:
    """Megatron's CPU activation offloading (``StackSpec.cpu_offload_layers``) runs without
    pipeline parallelism and without recomputation: transformer_config.py L1891-1899 raise
    "Currently there is no support for Pipeline parallelism with CPU offloading" and "CPU
    offloading does not work when activation recomputation is enabled"."""
    if not problem.training.stack.cpu_offload_layers or problem.options.framework != "megatron":
        return []
    return [
        Rule(
            family="CPU offloading",
            text="CPU activation offloading needs pp == 1 and no recompute",
            axes=("pp", "recompute"),
            check=lambda g: (g["pp"] == 1) & (g["recompute"] == 0),
            source="Megatron transformer_config.py L1891-1899",
        )
    ]


def _graph_rules(problem: Problem) -> list[Rule]:
    """CUDA graphs (``StackSpec.cuda_graphs``) and recomputation in Megatron's
    transformer_config.py: per-layer graphs with full recompute (L2854-2858, "full recompute is
    only supported with full iteration CUDA graph"); graphed attention recomputed selectively
    with attention dropout (L2878-2884, "attention dropout is not supported with graphed
    attention recomputation")."""
    stack = problem.training.stack
    if stack.cuda_graphs == "none" or problem.options.framework != "megatron":
        return []
    rules = []
    if stack.cuda_graphs == "layers":
        rules.append(
            Rule(
                family="CUDA graphs",
                text="per-layer CUDA graphs need recompute none or selective",
                axes=("recompute",),
                check=lambda g: g["recompute"] != RECOMPUTE_MODES.index("full"),
                source="Megatron transformer_config.py L2854-2858",
            )
        )
    if stack.dropout:
        rules.append(
            Rule(
                family="CUDA graphs",
                text="graphed attention with dropout cannot be recomputed selectively",
                axes=("recompute",),
                check=lambda g: g["recompute"] != RECOMPUTE_MODES.index("selective"),
                source="Megatron transformer_config.py L2878-2884",
            )
        )
    return rules


def layout_rules(problem: Problem) -> tuple[Rule, ...]:
    """Every rule of DESIGN §2 that applies to ``problem`` (products excepted)."""
    return (
        *_model_rules(problem),
        *_sequence_rules(problem),
        *_offload_rules(problem),
        *_graph_rules(problem),
        *_schedule_rules(problem),
        *schedule_rules(problem),
        *_placement_rules(problem),
        *_option_rules(problem),
    )
