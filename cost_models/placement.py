"""Where a parallel group's ranks sit: how many nodes a group spans (DESIGN §2).

Megatron's default rank order is ``tp-cp-ep-dp-pp`` with TP varying fastest
(``megatron/core/parallel_state.py``, ``RankGenerator``: ``global_rank = tp_rank + cp_rank*tp +
dp_rank*tp*cp + pp_rank*tp*cp*dp`` for the dense grid; the expert grid is ``etp-ep-edp-pp``).
A group of ``size`` ranks whose *stride* (the product of the faster axes) is ``stride`` holds the
ranks ``r0, r0 + stride, ..., r0 + (size-1)*stride``. With ``g = gpus_per_node`` and all sizes
powers of two (or, generally, with ``stride`` and ``size*stride`` dividing or multiples of ``g``):

- ``size * stride <= g``: the whole group sits in one node (1 node);
- ``stride >= g``: every member is on its own node (``size`` nodes);
- otherwise each node holds ``g / stride`` members: ``size * stride / g`` nodes.

All three cases are ``clip(ceil(size * stride / g), 1, size)``. Strides of the groups used here:
TP 1; CP ``tp``; DP·CP (gradient reduction, distributed optimizer) ``tp``; DP ``tp*cp``;
PP ``tp*cp*dp = num_gpus / pp``; EP ``etp``; expert-DP ``etp*ep``.
"""

from __future__ import annotations

import numpy as np


def group_num_nodes(size: np.ndarray, stride: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """Nodes spanned by a group of ``size`` ranks spaced ``stride`` apart (module docstring)."""
    size = np.asarray(size, dtype=np.float64)
    span = np.ceil(size * np.asarray(stride, dtype=np.float64) / gpus_per_node)
    return np.clip(span, 1.0, np.maximum(size, 1.0))


def pp_neighbour_num_nodes(pp: np.ndarray, num_gpus: int, gpus_per_node: int) -> np.ndarray:
    """Nodes spanned by two adjacent pipeline stages (stride ``num_gpus / pp``): 2 or 1."""
    stride = num_gpus / np.asarray(pp, dtype=np.float64)
    return np.where(stride >= gpus_per_node, 2.0, 1.0)
