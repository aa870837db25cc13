"""The charts of the sweep report (plotly): the panels of ``autopar.sweeps.report.PANELS``
against GPU count, then the best layout's memory per GPU against the usable capacity.

Every series (GPU type x sequence length) has one colour and one marker in every panel and one
entry in the legend, which toggles it everywhere (``legendgroup``). The GPU axes are logarithmic
with the GPU counts as their ticks (plotly's own log ticks label 256..2048 as ``3 4 ... 1000
2``). Memory parts are greys in a second legend so that no part is mistaken for a series; each
bar is outlined in its series' colour.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from autopar.base.errors import InputError
from autopar.sweeps.report import (
    PANELS,
    Panel,
    SeriesKey,
    Trace,
    drawn,
    layout_label,
    series,
    series_names,
    title_values,
    value_of,
)
from autopar.sweeps.run import EXTRA_HINT, SweepResult, SweepRow

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000")
"""Okabe & Ito (2008), "Color Universal Design" (jfly.uni-koeln.de/color): told apart under
every common colour-vision deficiency; its yellow (#F0E442) is left out, it vanishes on white."""
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star")
"""Markers for series beyond the palette (the eighth series is blue again, with squares)."""
PART_GREYS = ("#3d3d3d", "#6e6e6e", "#9a9a9a", "#c2c2c2", "#e0e0e0", "#f2f2f2")
PART_NAMES = {"reserve": "runtime reserve"}
"""Legend names of the memory parts that differ from their JSON key: the cost model's reserve
(CUDA context, NCCL buffers, allocator fragmentation) is not the ``--memory-reserve-gib`` kept
free above the capacity."""
MAX_TICKS = 12
"""GPU-count labels per axis at most (the memory chart shares them among its series)."""
MAX_OUTLINED_BARS = 64
MEMORY_TITLE = "Memory per GPU (best layout)"
ROW_HEIGHT_PX = 330


def require_plotly():
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        raise InputError(f"needs plotly: {EXTRA_HINT['plotly']}", source="--format html") from None
    return go, make_subplots


@dataclass(frozen=True, slots=True)
class _Style:
    """Each series' name, colour and marker."""

    names: dict[SeriesKey, str]
    colour: dict[SeriesKey, str]
    symbol: dict[SeriesKey, str]


def _style(groups: dict[SeriesKey, list[int]]) -> _Style:
    keys = list(groups)
    return _Style(
        names=series_names(keys),
        colour={k: PALETTE[i % len(PALETTE)] for i, k in enumerate(keys)},
        symbol={k: SYMBOLS[(i // len(PALETTE)) % len(SYMBOLS)] for i, k in enumerate(keys)},
    )


def gpu_ticks(counts: Sequence[int]) -> tuple[list[int], list[str]]:
    """Tick values and texts of a GPU axis: the counts themselves, or the powers of two they
    span when there are more than ``MAX_TICKS``."""
    values = sorted(set(counts))
    if len(values) > MAX_TICKS:
        low, high = values[0], values[-1]
        powers = [2**k for k in range(math.ceil(math.log2(low)), int(math.log2(high)) + 1)]
        step = max(1, math.ceil(len(powers) / MAX_TICKS))
        values = powers[::step] or [low, high]
    return values, [f"{v:,}" for v in values]


def _rgba(colour: str, alpha: float) -> str:
    red, green, blue = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},{alpha})"


def _band(go, trace: Trace, rows: list[SweepRow], key: SeriesKey, style: _Style):
    low, high = trace.band
    points = [(r.gpus, value_of(low, r), value_of(high, r)) for r in rows]
    points = [p for p in points if p[1] is not None and p[2] is not None]
    if not points:
        return None
    x = [p[0] for p in points]
    return go.Scatter(
        x=x + x[::-1],
        y=[p[2] for p in points] + [p[1] for p in points][::-1],
        mode="lines",  # a shaded range: no markers on its outline
        fill="toself",
        fillcolor=_rgba(style.colour[key], 0.18),
        line={"width": 0},
        hoverinfo="skip",
        name=f"{style.names[key]} {trace.label} range",
        legendgroup=style.names[key],
        showlegend=False,
    )


def _line(go, panel: Panel, trace: Trace, rows: list[SweepRow], key: SeriesKey, style: _Style):
    name = style.names[key]
    fmt = panel.hoverformat or panel.tickformat
    return go.Scatter(
        x=[r.gpus for r in rows],
        y=[value_of(trace.value, r) for r in rows],
        mode="lines+markers",
        name=name,
        legendgroup=name,
        line={"color": style.colour[key], "dash": trace.dash},
        marker={"color": style.colour[key], "symbol": style.symbol[key], "size": 7},
        hovertext=[layout_label(r) for r in rows],
        hovertemplate=f"{html.escape(name)}, %{{x:,}} GPUs: %{{y:{fmt}}} "
        f"{html.escape(trace.label)}<br>%{{hovertext}}<extra></extra>",
    )


def _grid(make_subplots, panels: Sequence[Panel], titles: list[str]):
    """Two charts a row, a lone last chart and the memory chart across the page."""
    specs = [
        [{}, {}] if i + 1 < len(panels) else [{"colspan": 2}, None]
        for i in range(0, len(panels), 2)
    ]
    specs.append([{"colspan": 2}, None])
    rows = len(specs)
    fig = make_subplots(
        rows=rows,
        cols=2,
        specs=specs,
        subplot_titles=titles,
        vertical_spacing=0.3 / rows,
        horizontal_spacing=0.09,
    )
    return fig, rows


def figure(result: SweepResult):
    """The panels that have values, then the memory chart; one legend of series."""
    go, make_subplots = require_plotly()
    rows = list(result.rows)
    groups = series(rows)
    style = _style(groups)
    values = title_values(result.inputs)
    panels = [p for p in PANELS if drawn(p, rows)]
    titles = [p.title.format(**values) for p in panels] + [MEMORY_TITLE]
    fig, grid_rows = _grid(make_subplots, panels, titles)
    ticks, texts = gpu_ticks([r.gpus for r in rows])
    legend: set[SeriesKey] = set()
    for k, panel in enumerate(panels):
        at = {"row": k // 2 + 1, "col": k % 2 + 1}
        for key, idx in groups.items():
            points = [rows[i] for i in idx]
            for trace in panel.traces:
                if trace.band and (band := _band(go, trace, points, key, style)) is not None:
                    fig.add_trace(band, **at)
                line = _line(go, panel, trace, points, key, style)
                line.showlegend = key not in legend and trace is panel.traces[0]
                legend.add(key)
                fig.add_trace(line, **at)
        fig.update_xaxes(title_text="GPUs", type="log", tickvals=ticks, ticktext=texts, **at)
        fig.update_yaxes(
            title_text=panel.axis.format(**values),
            tickformat=panel.tickformat,
            hoverformat=panel.hoverformat or None,
            **at,
        )
    _memory(go, fig, result, groups, style, grid_rows)
    fig.update_layout(
        height=ROW_HEIGHT_PX * grid_rows + 80,
        barmode="stack",
        template="plotly_white",
        margin={"t": 40, "l": 70, "r": 220, "b": 60},
        legend={"title": {"text": "series"}, "x": 1.02, "y": 1.0, "yanchor": "top"},
        legend2={"title": {"text": "memory per GPU"}, "x": 1.02, "y": 0.0, "yanchor": "bottom"},
    )
    return fig


def _positions(groups: dict[SeriesKey, list[int]]) -> dict[int, int]:
    """Each row's bar position: the series side by side, one slot apart."""
    out, x = {}, 0
    for idx in groups.values():
        for i in idx:
            out[i] = x
            x += 1
        x += 1
    return out


def _memory(go, fig, result: SweepResult, groups, style: _Style, at_row: int) -> None:
    rows = result.rows
    at = {"row": at_row, "col": 1}
    position = _positions(groups)
    order = [i for idx in groups.values() for i in idx]
    parts = list(dict.fromkeys(p for m in result.memory_gib for p in (m or {})))
    outline = [style.colour[(rows[i].gpu, rows[i].seq_len)] for i in order]
    width = 2 if len(order) <= MAX_OUTLINED_BARS else 0  # thin bars: the outline would hide them
    names = [style.names[(rows[i].gpu, rows[i].seq_len)] for i in order]
    for j, part in enumerate(parts):
        bar = go.Bar(
            x=[position[i] for i in order],
            y=[(result.memory_gib[i] or {}).get(part) for i in order],
            name=PART_NAMES.get(part, part),
            legend="legend2",
            marker={
                "color": PART_GREYS[j % len(PART_GREYS)],
                "line": {"color": outline, "width": width},
            },
            customdata=names,
            hovertemplate=f"%{{customdata}}: {PART_NAMES.get(part, part)} %{{y:.1f}} GiB"
            "<extra></extra>",
        )
        fig.add_trace(bar, **at)
    for trace in _capacity_lines(go, result, order, position):
        fig.add_trace(trace, **at)
    for key, idx in groups.items():
        middle = (position[idx[0]] + position[idx[-1]]) / 2
        fig.add_annotation(
            x=middle, y=0.0, yref="y domain", yanchor="top", yshift=-22, showarrow=False,
            text=f"<b>{html.escape(style.names[key])}</b>", font={"color": style.colour[key]},
            **at,
        )  # fmt: skip
    labelled = [i for idx in groups.values() for i in _spread(idx, MAX_TICKS // len(groups))]
    fig.update_xaxes(
        title_text="GPUs",
        title_standoff=28,
        tickvals=[position[i] for i in labelled],
        ticktext=[f"{rows[i].gpus:,}" for i in labelled],
        **at,
    )
    fig.update_yaxes(title_text="GiB per GPU", rangemode="tozero", **at)


def _spread(idx: list[int], most: int) -> list[int]:
    """At most ``most`` (and at least 2) of ``idx``, evenly spread, first and last included."""
    most = max(2, most)
    if len(idx) <= most:
        return idx
    step = (len(idx) - 1) / (most - 1)
    return [idx[round(k * step)] for k in range(most)]


def _capacity_lines(go, result: SweepResult, order: list[int], position: dict[int, int]):
    """The usable memory (the capacity fits are held to) over each bar, dashed, and the GPU's
    whole memory dotted above it when a reserve is kept free."""
    inputs = result.inputs
    if inputs is None:
        return []
    gpus = {g.label: g for g in inputs.gpus}
    lines = [("usable memory (capacity)", "usable_gib", "dash")]
    if any(g.reserve_gib > 0 for g in inputs.gpus):
        lines.append(("GPU memory (usable + reserve)", "memory_gib", "dot"))
    out = []
    for name, attr, dash in lines:
        x, y = [], []
        for i in order:
            gpu = gpus.get(result.rows[i].gpu)
            if gpu is None:
                continue
            level = gpu.usable_gib if attr == "usable_gib" else gpu.memory_gib
            x += [position[i] - 0.45, position[i] + 0.45, None]
            y += [level, level, None]
        out.append(
            go.Scatter(
                x=x,
                y=y,
                mode="lines",
                name=name,
                legend="legend2",
                line={"color": "#000000", "dash": dash, "width": 2},
                hovertemplate=f"{name}: %{{y:.1f}} GiB<extra></extra>",
            )  # fmt: skip
        )
    return out
