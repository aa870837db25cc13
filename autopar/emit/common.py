"""What every emitter shares: the layout of an estimate, the uneven pipeline split, refusals."""

from __future__ import annotations

from autopar.errors import InputError
from autopar.plan import Estimate, Layout


def layout_of(item: Estimate | Layout) -> Layout:
    return item.layout if isinstance(item, Estimate) else item


def uneven_end_layers(num_layers: int, pp: int) -> tuple[int, int]:
    """Layers of the first and last stage when ``pp`` does not divide ``num_layers``: the middle
    stages take ``ceil(L/pp)`` each (``autopar.rules.uneven_split_ok``), the ends share the rest,
    the first stage (which also holds the embedding) the smaller half."""
    middle = -(-num_layers // pp)
    rest = num_layers - (pp - 2) * middle
    return rest // 2, rest - rest // 2


def stage_layers(num_layers: int, pp: int, vpp: int) -> tuple[int, int, int]:
    """(layers per middle virtual stage, layers of the first, layers of the last) for ``pp``
    ranks of ``vpp`` virtual stages each; raises when the layout has no such split."""
    stages = pp * vpp
    if num_layers % stages == 0:
        per = num_layers // stages
        return per, per, per
    if vpp > 1 or pp < 2:
        raise InputError(
            f"{num_layers} layers do not split into pp*vpp = {stages} equal stages",
            source="layout",
            field="vpp" if vpp > 1 else "pp",
        )
    first, last = uneven_end_layers(num_layers, pp)
    return -(-num_layers // pp), first, last


def refuse(fmt: str, what: str, instead: str) -> InputError:
    """The one-line refusal of a format that cannot express part of a layout."""
    return InputError(f"cannot express {what}; {instead}", source=f"--format {fmt}")
