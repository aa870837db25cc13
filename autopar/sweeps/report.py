"""What the sweep report draws and tabulates, declared once (issue 24).

The HTML page (``autopar.sweeps.html``) and the ``sweep`` text table read these tables; a new
quantity is one entry here, never a change to the figure code:

- ``Panel``: one chart against GPU count, its title and y axis (``{currency}``, ``{rate}`` and
  ``{train_tokens}`` are filled from the sweep's inputs), its tick format, the flags that fill it
  (a panel with no value is left out and the page says which flag fills it), and its traces.
- ``Trace``: one quantity, drawn once per series (GPU type x sequence length) in the series'
  colour; ``dash`` tells a second quantity of the same panel apart, ``band`` draws a ``(low,
  high)`` range around it.
- ``Column``: one column of the layout table; the layout axes come from the axis table
  (``autopar.base.axes.AXES``), so a new axis is a new column by itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autopar.base.axes import AXES
from autopar.layout.plan import Layout
from autopar.sweeps.inputs import SweepInputs

if TYPE_CHECKING:
    from autopar.sweeps.run import SweepRow

Value = str | Callable[..., Any]
"""A ``SweepRow`` field name, or a function of the row (``Callable[[SweepRow], Any]``)."""

SOLVED = ("optimal", "feasible")
"""Row statuses that carry a layout and figures."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """One quantity of a panel, drawn once per series."""

    label: str
    value: Value
    dash: str = "solid"
    """plotly's line dash (``solid``, ``dash``, ``dot``, ...)."""
    band: tuple[Value, Value] | None = None
    """Low and high values drawn as a shaded range in the series' colour."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Panel:
    """One chart against GPU count."""

    key: str
    title: str
    axis: str
    traces: tuple[Trace, ...]
    tickformat: str = ""
    """d3 format of the y ticks (``.0%``: MFU in percent)."""
    hoverformat: str = ""
    needs: tuple[str, ...] = ()
    """The flags that fill the panel (``--train-tokens``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Column:
    """One column of the layout table."""

    key: str
    title: str
    fmt: str = ""
    """Python format of a float cell (``.1%``)."""
    default: Any = None
    """A column whose every row is empty or this value is left out (EP 1 for a dense model)."""
    wide: bool = False
    """Free text (the reason a point has no layout): in the HTML table, not the text one."""


def _throughput_at(step_field: str) -> Callable[[SweepRow], float]:
    """Tokens/s per GPU at one end of the step time's error band (``autopar.costs.error_bands``):
    the same tokens in the band's step time."""

    def value(row: SweepRow) -> float:
        step = getattr(row, step_field)
        return row.tokens_per_s_per_gpu * row.step_time_s / step if step else math.nan

    return value


PANELS: tuple[Panel, ...] = (
    Panel(
        key="throughput",
        title="Throughput per GPU",
        axis="tokens/s per GPU",
        traces=(
            Trace(
                label="tokens/s per GPU",
                value="tokens_per_s_per_gpu",
                band=(_throughput_at("step_time_high_s"), _throughput_at("step_time_low_s")),
            ),
        ),
        tickformat=",.0f",
    ),
    Panel(
        key="mfu",
        title="Model FLOPs utilisation",
        axis="MFU",
        traces=(Trace(label="MFU", value="mfu"),),
        tickformat=".0%",
        hoverformat=".1%",
    ),
    Panel(
        key="days",
        title="Time to train {train_tokens}",
        axis="days",
        traces=(
            Trace(label="days with failures", value="days_to_train"),
            Trace(label="days without failures", value="days_to_train_failure_free", dash="dash"),
        ),
        tickformat=",.0f",
        hoverformat=",.1f",
        needs=("--train-tokens",),
    ),
    Panel(
        key="cost",
        title="Cost to train {train_tokens} at {rate}",
        axis="cost ({currency})",
        traces=(
            Trace(label="cost with failures", value="cost"),
            Trace(label="cost without failures", value="cost_failure_free", dash="dash"),
        ),
        tickformat=",.3s",
        hoverformat=",.0f",
        needs=("--train-tokens", "--gpu-hour-cost"),
    ),
    Panel(
        key="goodput",
        title="Goodput under failures",
        axis="wall time that trains",
        traces=(Trace(label="goodput", value="goodput"),),
        tickformat=".0%",
        hoverformat=".1%",
    ),
)
"""The charts against GPU count, in page order (the memory chart follows them)."""

COLUMNS: tuple[Column, ...] = (
    Column(key="gpus", title="GPUs"),
    Column(key="gpu", title="GPU"),
    Column(key="seq_len", title="seq"),
    Column(key="status", title="status"),
    *(
        Column(
            key=axis.layout_attr,
            title=axis.title,
            fmt=".0f",
            default=axis.default if axis.show == "changed" else None,
        )
        for axis in AXES
    ),
    Column(key="step_time_s", title="step s", fmt=".3f"),
    Column(key="error_band_pct", title="±%", fmt=".0f"),
    Column(key="tokens_per_s_per_gpu", title="tok/s/GPU", fmt=",.0f"),
    Column(key="mfu", title="MFU", fmt=".1%"),
    Column(key="memory_gib", title="GiB", fmt=".1f"),
    Column(key="goodput", title="goodput", fmt=".1%"),
    Column(key="days_to_train_failure_free", title="days (no failures)", fmt=",.1f"),
    Column(key="cost_failure_free", title="cost (no failures)", fmt=",.0f"),
    Column(key="days_to_train", title="days", fmt=",.1f"),
    Column(key="cost", title="cost {currency}", fmt=",.0f"),
    Column(key="reason", title="why no layout", wide=True),
)
"""The layout table, in order: the point, one column per layout axis, the figures."""


def value_of(value: Value, row: SweepRow) -> Any:
    """A trace's or column's value on a row; NaN and infinities are ``None``."""
    out = getattr(row, value) if isinstance(value, str) else value(row)
    if isinstance(out, float) and not math.isfinite(out):
        return None
    return out


def cell(value: Any, fmt: str) -> str:
    """A table cell: ``-`` when empty, ``on``/``off`` for flags, floats in ``fmt``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return format(value, fmt)
    return str(value)


def shown_columns(rows: Sequence[SweepRow], *, wide: bool = True) -> tuple[Column, ...]:
    """The columns with something to say: not empty or at their default in every row."""
    out = []
    for column in COLUMNS:
        if column.wide and not wide:
            continue
        values = [value_of(column.key, row) for row in rows]
        if any(v is not None and v != column.default for v in values):
            out.append(column)
    return tuple(out)


def drawn(panel: Panel, rows: Sequence[SweepRow]) -> bool:
    """Whether any row gives the panel a value."""
    return any(value_of(t.value, row) is not None for t in panel.traces for row in rows)


def _tokens(count: float) -> str:
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if count >= scale:
            return f"{count / scale:,.3g}{unit} tokens"
    return f"{count:,.0f} tokens"


def title_values(inputs: SweepInputs | None) -> dict[str, str]:
    """What panel and column titles are filled with: ``{train_tokens}`` (``15T tokens``),
    ``{rate}`` (``2.50 USD per GPU-hour``), ``{currency}``."""
    currency = inputs.currency if inputs else "USD"
    tokens = inputs.train_tokens if inputs else None
    price = inputs.gpu_hour_cost if inputs else None
    return {
        "train_tokens": _tokens(tokens) if tokens else "",
        "rate": f"{price:,.2f} {currency} per GPU-hour" if price else "",
        "currency": currency,
    }


def missing_text(panels: Sequence[Panel], rows: Sequence[SweepRow]) -> str:
    """One line naming the panels left out and the flags that fill them (or saying that no
    point has a layout); empty when every panel is drawn."""
    if not any(row.status in SOLVED for row in rows):
        return "No point has a layout that fits: the table below says why for each."
    missing = [p for p in panels if not drawn(p, rows)]
    if not missing:
        return ""
    parts = [
        f"{p.title.split(' {')[0]} (needs {' and '.join(p.needs)})"
        if p.needs
        else p.title.split(" {")[0]
        for p in missing
    ]
    return "Not drawn: " + "; ".join(parts) + "."


SeriesKey = tuple[str, int]


def series(rows: Sequence[SweepRow]) -> dict[SeriesKey, list[int]]:
    """Row indices per series (GPU type, sequence length), in first-seen order."""
    out: dict[SeriesKey, list[int]] = {}
    for i, row in enumerate(rows):
        out.setdefault((row.gpu, row.seq_len), []).append(i)
    return out


def series_names(keys: Sequence[SeriesKey]) -> dict[SeriesKey, str]:
    """Legend names: the GPU type, with the sequence length when the sweep has several."""
    gpus = {g for g, _ in keys}
    seqs = {s for _, s in keys}
    out = {}
    for gpu, seq in keys:
        parts = [gpu] if len(gpus) > 1 or len(seqs) == 1 else []
        if len(seqs) > 1:
            parts.append(f"seq {seq:,}")
        out[(gpu, seq)] = ", ".join(parts)
    return out


def layout_label(row: SweepRow) -> str:
    """The row's layout as ``Layout.text()`` writes it, or its status."""
    if row.status not in SOLVED:
        return row.status
    values = {axis.layout_attr: getattr(row, axis.layout_attr) for axis in AXES}
    sizes = {
        axis.layout_attr: int(values[axis.layout_attr]) for axis in AXES if axis.kind == "size"
    }
    return Layout(**{**values, **sizes}).text()
