"""Bytes a distributed checkpoint makes each rank and each server write (issue 22).

**What is saved.** Megatron's ``torch_dist`` checkpoint (the default ``--ckpt-format``,
``megatron/training/config/training_config.py`` L486) holds the model's BF16 parameters and the
distributed optimizer's FP32 main parameters and Adam moments (``save_optim`` defaults to True,
L424); gradients are not saved. So a parameter costs ``BYTES_WEIGHT + BYTES_OPTIMIZER`` = 2 + 12
bytes (2 + 4 + 2 + 2 with BF16 moments): the weights and optimizer parts of the memory model
(``cost_models.memory``), sharded as it shards them (TP, PP, EP/ETP; ZeRO over DP x CP, expert
parameters over expert-DP).

**Who writes what.** Every shard is written once, by one of the ranks that hold it:

- *fully parallel save* (Megatron's default, ``fully_parallel_save`` L511; the stack switch
  ``ckpt_fully_parallel_save``): each shard goes to the least loaded of its holders
  (``core/dist_checkpointing/exchange_utils.py`` ``distribute_shards_to_ranks`` L121-171) over
  the DP group with CP (``megatron/training/checkpointing.py`` L862-868), so a stage's
  parameters are spread evenly over its ``num_gpus / pp`` ranks and a rank of stage ``s`` writes
  ``(dense + expert params of s) x bytes x pp / num_gpus``, whatever the ZeRO stage (PyTorch DCP,
  torchtitan's format, deduplicates replicated tensors the same way);
- without it (``--no-ckpt-fully-parallel-save``), a replicated shard is written by its first
  replica (``replica_id`` 0: DP and CP rank 0 for dense parameters, expert-DP rank 0 for experts)
  and a sharded one (a ZeRO-sharded part) by each holder: the server that holds the first
  replicas writes the most.

Ranks are ordered TP fastest, then CP, DP (and ETP, EP, expert-DP on the expert grid), PP slowest
(Megatron's ``tp-cp-ep-dp-pp``): a server of ``g`` GPUs holds ranks of one stage when
``tp*cp*dp >= g`` (otherwise the figures below are an upper bound), and the first server of a
stage holds ``min(g, tp)`` dense and ``min(g, etp*ep)`` expert first replicas. The terms report
the most loaded stage: the checkpoint is done when its slowest writer is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.costs.terms import Grid, TermContext
from cost_models.memory import (
    BYTES_WEIGHT,
    axes_of,
    part_bytes_per_param,
    stage_dense_params,
    stage_moe_layers,
)
from cost_models.shapes import expert_params

_PARTS: tuple[tuple[str, int], ...] = (("weights", 3), ("optimizer", 1))
"""The saved parts and the ZeRO stage from which each is sharded (``DenseParamMemory``)."""


def checkpoint_bytes_per_param(ctx: TermContext) -> float:
    """Bytes a checkpoint keeps per parameter: BF16 weights and the optimizer states."""
    return sum(_part_bytes(part, ctx) for part, _ in _PARTS)


def _part_bytes(part: str, ctx: TermContext) -> float:
    return BYTES_WEIGHT if part == "weights" else part_bytes_per_param("optimizer", ctx)[0]


@dataclass(frozen=True, slots=True)
class _Stages:
    """Per row and per stage (columns; ``pp`` ragged rows padded with zeros): the stage's
    dense-grid parameters over all its TP ranks, and its routed-expert parameters."""

    dense: np.ndarray
    expert: np.ndarray


def _stages(ctx: TermContext, tp: np.ndarray, pp: np.ndarray) -> _Stages:
    model = ctx.model
    per_layer = float(expert_params(model)) if model.is_moe else 0.0
    width = int(pp.max())
    dense, expert = np.zeros((len(tp), width)), np.zeros((len(tp), width))
    for value in np.unique(pp):
        rows = pp == value
        stages = stage_dense_params(model, tp[rows], int(value))
        moe = stage_moe_layers(model, int(value))
        for s, (params, layers) in enumerate(zip(stages, moe, strict=True)):
            dense[rows, s] = params
            expert[rows, s] = layers * per_layer
    return _Stages(dense=dense, expert=expert)


def checkpoint_writes(grid: Grid, ctx: TermContext) -> tuple[np.ndarray, np.ndarray]:
    """(bytes the most loaded rank writes, bytes the most loaded server writes), per row."""
    tp, pp, zero, ep, etp = axes_of(grid, "tp", "pp", "zero", "ep", "etp")
    n = float(ctx.training.num_gpus)
    g = float(min(ctx.cluster.gpus_per_server, ctx.training.num_gpus))
    stages = _stages(ctx, tp, grid["pp"])
    if ctx.training.stack.ckpt_fully_parallel_save:
        share = (stages.dense + stages.expert) * checkpoint_bytes_per_param(ctx)
        rank = share.max(axis=1) * pp / n
        return rank, rank * g
    dense_shards, expert_shards = n / (tp * pp), n / (etp * ep * pp)  # DP x CP, expert-DP
    rank = np.zeros_like(stages.dense)
    server = np.zeros_like(stages.dense)
    for part, sharded_from in _PARTS:
        per_param = _part_bytes(part, ctx)
        for params, split, shards, first in (
            (stages.dense, tp, dense_shards, np.minimum(g, tp)),
            (stages.expert, etp * ep, expert_shards, np.minimum(g, etp * ep)),
        ):
            held = params / split[:, None] * per_param  # one model-parallel shard
            sharded = (zero >= sharded_from)[:, None]
            own = held / shards[:, None]
            rank += np.where(sharded, own, held)
            server += np.where(sharded, g * own, first[:, None] * held)
    return rank.max(axis=1), server.max(axis=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointBytes:
    """Bytes the most loaded server writes to one distributed checkpoint (module docstring);
    ``rank_bytes`` is the most loaded rank's share (what an asynchronous save copies to host
    memory)."""

    name: str = "checkpoint_bytes"
    category: str = "checkpoint"
    depends_on: tuple[str, ...] = ("tp", "pp", "zero", "ep", "etp")

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        return checkpoint_writes(grid, ctx)[1]

    def rank_bytes(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        return checkpoint_writes(grid, ctx)[0]
