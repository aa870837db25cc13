"""Bytes each rank writes to a distributed checkpoint (issue 22).

**What is saved.** Megatron's ``torch_dist`` checkpoint (the default ``--ckpt-format``,
``megatron/training/config/training_config.py`` L486) holds the model's BF16 parameters and the
distributed optimizer's FP32 main parameters and Adam moments (``save_optim`` defaults to True,
L424); gradients are not saved. So a parameter costs ``BYTES_WEIGHT + BYTES_OPTIMIZER`` = 2 + 12
= 14 bytes (2 + 4 + 2 + 2 with BF16 moments), the weights and optimizer parts of the memory model
(``cost_models.memory``).

**Who writes what.** Every shard is written once: the fully parallel save (on by default,
``fully_parallel_save``, L511) hands each shard to one of the ranks that hold it, greedily to the
least loaded (``core/dist_checkpointing/exchange_utils.py`` ``distribute_shards_to_ranks``,
L121-171), over the data-parallel group with context parallelism
(``megatron/training/checkpointing.py`` L862-868); PyTorch DCP (torchtitan) deduplicates
replicated tensors the same way. A rank of pipeline stage ``s`` therefore writes its stage's
parameters spread evenly over the ``num_gpus / pp`` ranks of that stage:

    bytes_s = (dense params of stage s + routed-expert params of stage s) x 14 x pp / num_gpus

(dense shards: ``/tp`` then ``/(dp*cp)``; expert shards: ``/(ep*etp)`` then over expert-DP
``num_gpus/(etp*ep*pp)``; both give ``pp / num_gpus``). The ZeRO stage does not change it, nor
CP or EP; the pipeline split does (the embedding, the output layer and the MTP modules sit on
the end stages), and TP a little (the vocabulary is padded to ``128 * tp``). The term is the
most loaded stage's ``bytes_s``: the checkpoint is done when its slowest writer is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.costs.terms import Grid, TermContext
from cost_models.memory import (
    BYTES_WEIGHT,
    part_bytes_per_param,
    stage_dense_params,
    stage_moe_layers,
)
from cost_models.shapes import expert_params


def checkpoint_bytes_per_param(ctx: TermContext) -> float:
    """Bytes a checkpoint keeps per parameter: BF16 weights and the optimizer states."""
    optimizer_bytes, _ = part_bytes_per_param("optimizer", ctx)
    return BYTES_WEIGHT + optimizer_bytes


def stage_checkpoint_params(model, tp: np.ndarray, pp: np.ndarray) -> np.ndarray:
    """Per row, the parameters of the pipeline stage that holds the most (dense-grid
    parameters over all its TP ranks plus its routed experts)."""
    tp, pp = np.broadcast_arrays(
        np.atleast_1d(np.asarray(tp, dtype=np.float64)), np.atleast_1d(np.asarray(pp))
    )
    per_layer = float(expert_params(model)) if model.is_moe else 0.0
    best = np.zeros(len(tp))
    for value in np.unique(pp):
        rows = pp == value
        dense = stage_dense_params(model, tp[rows], int(value))
        moe = stage_moe_layers(model, int(value))
        best[rows] = np.max([d + n * per_layer for d, n in zip(dense, moe, strict=True)], axis=0)
    return best


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointBytes:
    """Bytes the most loaded rank writes to one distributed checkpoint (module docstring)."""

    name: str = "checkpoint_bytes"
    category: str = "checkpoint"
    depends_on: tuple[str, ...] = ("tp", "pp")

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp = np.asarray(grid["tp"], dtype=np.float64)
        pp = np.asarray(grid["pp"], dtype=np.float64)
        params = stage_checkpoint_params(ctx.model, tp, grid["pp"])
        return params * checkpoint_bytes_per_param(ctx) * pp / ctx.training.num_gpus
