"""How the transformer layers split over the pipeline: one function for the rule, the cost model
and every launcher (issue 21: the split priced is the split launched).

``stage_split`` gives the layers of each pipeline stage; it does not depend on the virtual
stages, so the cost terms that price stages read ``pp`` alone. ``pipeline_split`` adds the
chunks (virtual stages; chunk ``c = j*pp + i`` is chunk ``j`` of stage ``i``, Megatron's
interleaving) and how Megatron-LM is told, the plainest way that gives exactly that split:

- nothing when ``pp*vpp`` divides the layers (``get_num_layers_to_build``,
  transformer_block.py);
- ``--account-for-embedding/loss-in-pipeline-split``: the embedding and the loss take one layer's
  slot each on the first and last virtual stage (transformer_config.py L2370-2415);
- ``--decoder-first/last-pipeline-num-layers``: the middle stages hold ``ceil(L/pp)`` each and
  the ends the rest, every count a multiple of ``vpp`` (transformer_config.py L2294-2368);
- otherwise ``--pipeline-model-parallel-layout`` (``pipeline_parallel_layer_layout.py``), which
  accepts any split with the embedding first, the loss last and the MTP modules in the last
  virtual stage of the last rank (``validate_layer_layout``); Megatron-Bridge publishes
  DeepSeek-V3's 61 layers this way.

The stage split is Megatron's own wherever one of its first three forms applies (even; one or
two slots short: the embedding, then the loss, takes one; the ends sharing what the middle
stages leave), and otherwise balanced: ``q`` or ``q + 1`` layers, the ``q + 1`` on the middle
stages first, then on the last, then on the first (the first stage holds the most activations
in flight; the last the logits). MTP modules count as a layer of the last stage where the ends
share the rest or one or two slots are short (there Megatron's account-for split would load the
MTP stage most: DeepSeek-V3 at PP 2 is 31 / 30 + MTP, not 30 / 31 + MTP), as Megatron-Bridge's
DeepSeek-V3 layouts do.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@functools.lru_cache(maxsize=4096)
def stage_split(num_layers: int, pp: int, *, mtp_layers: int = 0) -> tuple[int, ...]:
    """Decoder layers of each of the ``pp`` stages (module docstring)."""
    # numpy integers share the cache key of Python ones: the cached split holds Python ints
    num_layers, pp, mtp_layers = int(num_layers), int(pp), int(mtp_layers)
    if pp <= 1:
        return (num_layers,)
    if num_layers % pp == 0:
        return (num_layers // pp,) * pp
    m = -(-num_layers // pp)
    extra = pp * m - num_layers
    if extra <= 2 and not mtp_layers:  # the embedding takes a slot, then the loss
        return (m - 1, *([m] * (pp - 2)), m - (extra - 1))
    if extra <= 2:  # MTP modules as layers of the last stage: balanced over them too
        sizes = _balanced(num_layers + mtp_layers, pp)
        return (*sizes[:-1], sizes[-1] - mtp_layers)
    rest = num_layers - (pp - 2) * m
    if 2 <= rest <= 2 * m:  # the ends share what the middle stages leave
        first = min(max((rest + mtp_layers) // 2, rest - m, 1), m, rest - 1)
        return (first, *([m] * (pp - 2)), rest - first)
    return _balanced(num_layers, pp)


def _balanced(num_layers: int, pp: int) -> tuple[int, ...]:
    q, r = divmod(num_layers, pp)
    order = [*range(1, pp - 1), pp - 1, 0]  # middle stages first, then the last, then the first
    sizes = [q] * pp
    for stage in order[:r]:
        sizes[stage] += 1
    return tuple(sizes)


def max_chunks(stages: tuple[int, ...]) -> int:
    """The most virtual stages per rank that leave every chunk a layer, except that the
    embedding and the loss may sit alone in the first and the last chunk (Megatron's
    account-for split does this for Llama-3.1 405B at PP 8 VP 16)."""
    if len(stages) == 1:
        return 1
    ends = min(stages[0], stages[-1]) + 1
    return min(ends, *stages[1:-1]) if len(stages) > 2 else ends


def chunk_split(stages: tuple[int, ...], vpp: int) -> tuple[int, ...]:
    """Layers of every chunk, virtual-stage order: each stage's layers over its ``vpp`` chunks,
    ``q`` or ``q + 1``; the first stage's extra layers go to its later chunks (its first holds
    the embedding), every other stage's to its earlier chunks (the last one's last holds the
    loss and the MTP modules)."""
    pp = len(stages)
    chunks = [0] * (pp * vpp)
    for i, layers in enumerate(stages):
        q, r = divmod(layers, vpp)
        extra = range(vpp - r, vpp) if i == 0 else range(r)
        for j in range(vpp):
            chunks[j * pp + i] = q + (1 if j in extra else 0)
    return tuple(chunks)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineSplit:
    """The split of one ``(pp, vpp)`` and the Megatron flags that give it (module docstring).
    Exactly one way is set: nothing (even), the account-for flags, the first/last counts or
    ``layout``."""

    stage_layers: tuple[int, ...]
    """Decoder layers of each stage."""
    chunk_layers: tuple[int, ...]
    """Decoder layers of each chunk, virtual-stage order (``pp*vpp`` entries)."""
    account_for_embedding: bool = False
    account_for_loss: bool = False
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    layout: str | None = None
    """Megatron ``--pipeline-model-parallel-layout`` when no other flag gives this split."""

    @property
    def is_even(self) -> bool:
        return len(set(self.chunk_layers)) == 1


def pipeline_split(
    num_layers: int, pp: int, vpp: int = 1, *, mtp_layers: int = 0
) -> PipelineSplit | None:
    """The split of ``num_layers`` over ``pp`` ranks of ``vpp`` chunks, or ``None`` when there
    is none: ``pp`` above the layers, ``vpp > 1`` at ``pp == 1``, or chunks left empty
    (``max_chunks``)."""
    if pp < 1 or vpp < 1 or pp > num_layers or (pp == 1 and vpp > 1):
        return None
    stages = stage_split(num_layers, pp, mtp_layers=mtp_layers)
    if vpp > max_chunks(stages):
        return None
    chunks = chunk_split(stages, vpp)
    split = PipelineSplit(stage_layers=stages, chunk_layers=chunks)
    if pp == 1 or num_layers % (pp * vpp) == 0:
        return split
    m = -(-num_layers // pp)
    extra = pp * m - num_layers
    if num_layers % pp == 0:  # even stages, uneven chunks: pp 2 accounts for both ends
        if pp == 2 and (m + 1) % vpp == 0:
            return _with(split, account_for_embedding=True, account_for_loss=True)
        return _with(split, layout=layout_text(chunks, pp, mtp_layers=mtp_layers))
    account_for = (m - 1, *([m] * (pp - 2)), m - (extra - 1))
    if extra <= 2 and m % vpp == 0 and stages == account_for:
        return _with(split, account_for_embedding=True, account_for_loss=extra == 2)
    first, last = stages[0], stages[-1]
    middle_even = all(n == m for n in stages[1:-1])
    if middle_even and m % vpp == 0 and first % vpp == 0 and last % vpp == 0:
        return _with(split, first_stage_layers=first, last_stage_layers=last)
    return _with(split, layout=layout_text(chunks, pp, mtp_layers=mtp_layers))


def _with(split: PipelineSplit, **flags) -> PipelineSplit:
    return PipelineSplit(stage_layers=split.stage_layers, chunk_layers=split.chunk_layers, **flags)


def layout_text(chunks: tuple[int, ...], pp: int, *, mtp_layers: int = 0) -> str:
    """``--pipeline-model-parallel-layout`` for ``chunks`` (virtual-stage order): ``E`` on the
    first chunk, ``t`` per decoder layer (``t*n`` for several), the MTP modules ``m`` and the
    loss ``L`` on the last, chunks joined by ``|`` (the grammar of
    ``PipelineParallelLayerLayout.parse_str_to_list``). ``pp`` only checks the chunk count."""
    if len(chunks) % pp:
        raise ValueError(f"{len(chunks)} chunks do not fill {pp} ranks")
    parts = []
    for c, layers in enumerate(chunks):
        text = "E" if c == 0 else ""
        text += "t" if layers == 1 else (f"t*{layers}" if layers else "")
        if c == len(chunks) - 1:
            text += "m" * mtp_layers + "L"
        parts.append(text)
    return "|".join(parts)


def ends_only_shorter(split: PipelineSplit) -> bool:
    """Whether every chunk but the first and the last holds the most layers (torchtitan's
    ``pipeline_parallel_layers_per_stage`` with ``first/last_stage_less_layers``)."""
    chunks = split.chunk_layers
    return len(chunks) <= 2 or set(chunks[1:-1]) == {max(chunks)}


def split_ok(
    num_layers: int,
    pp: np.ndarray,
    vpp: np.ndarray | int = 1,
    *,
    mtp_layers: int = 0,
    ends_only: bool = False,
) -> np.ndarray:
    """``pipeline_split(...) is not None`` over arrays of ``pp`` and ``vpp`` (the rule); with
    ``ends_only``, also ``ends_only_shorter``. Each distinct pair is decided once."""
    pp = np.asarray(pp, dtype=np.int64)
    vpp = np.broadcast_to(np.asarray(vpp, dtype=np.int64), pp.shape)
    if not pp.size:
        return np.zeros(pp.shape, dtype=bool)
    width = int(vpp.max()) + 1
    codes, inverse = np.unique(pp.ravel() * width + vpp.ravel(), return_inverse=True)
    pairs = np.divmod(codes, width)
    ok = np.array(
        [
            _pair_ok(num_layers, p, v, mtp_layers, ends_only)
            for p, v in zip(*(a.tolist() for a in pairs), strict=True)
        ]
    )
    return ok[inverse.ravel()].reshape(pp.shape)


@functools.lru_cache(maxsize=65536)
def _pair_ok(num_layers: int, pp: int, vpp: int, mtp_layers: int, ends_only: bool) -> bool:
    if pp < 1 or vpp < 1 or pp > num_layers or (pp == 1 and vpp > 1):
        return False
    stages = stage_split(num_layers, pp, mtp_layers=mtp_layers)
    if vpp > max_chunks(stages):
        return False
    if not ends_only:
        return True
    split = PipelineSplit(stage_layers=stages, chunk_layers=chunk_split(stages, vpp))
    return ends_only_shorter(split)
