"""A sweep as one self-contained HTML page a planner can send (plotly, its JavaScript inlined).

Five charts against GPU count, one trace per GPU type and sequence length: tokens/s per GPU,
MFU, days to train, cost, and the best layout's per-GPU memory by part (stacked bars); then the
table of chosen layouts. Needs the ``html`` extra (plotly).
"""

from __future__ import annotations

import html
import math
from typing import Any

from autopar.base.errors import InputError
from autopar.sweeps.run import EXTRA_HINT, SweepResult, SweepRow

_CHARTS = (
    # (row attribute, title, axis title)
    ("tokens_per_s_per_gpu", "Throughput per GPU", "tokens/s per GPU"),
    ("mfu", "Model FLOPs utilisation", "MFU"),
    ("days_to_train", "Time to train", "days"),
    ("cost", "Cost to train", "cost"),
)
_LAYOUT_COLUMNS = (
    "gpus", "gpu", "seq_len", "status", "tp", "pp", "vpp", "cp", "dp", "ep",
    "etp", "mbs", "grad_accum", "recompute", "zero", "step_time_s",
    "tokens_per_s_per_gpu", "mfu", "memory_gib", "days_to_train", "cost",
)  # fmt: skip


def require_plotly():
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        raise InputError(f"needs plotly: {EXTRA_HINT['plotly']}", source="--format html") from None
    return go, make_subplots


def _series(result: SweepResult) -> dict[str, list[int]]:
    """Row indices per (GPU type, sequence length), the traces of each chart."""
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(result.rows):
        groups.setdefault(f"{row.gpu}, seq {row.seq_len}", []).append(i)
    return groups


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def _figure(result: SweepResult):
    go, make_subplots = require_plotly()
    titles = [title for _, title, _ in _CHARTS] + ["Memory per GPU (best layout)"]
    fig = make_subplots(rows=3, cols=2, subplot_titles=titles, vertical_spacing=0.09)
    for k, (attr, _, axis) in enumerate(_CHARTS):
        row, col = divmod(k, 2)
        for name, idx in _series(result).items():
            rows = [result.rows[i] for i in idx]
            fig.add_trace(
                go.Scatter(
                    x=[r.gpus for r in rows],
                    y=[_finite(getattr(r, attr)) for r in rows],
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=k == 0,
                    hovertext=[_layout_label(r) for r in rows],
                ),
                row=row + 1,
                col=col + 1,
            )
        fig.update_xaxes(title_text="GPUs", type="log", row=row + 1, col=col + 1)
        fig.update_yaxes(title_text=axis, row=row + 1, col=col + 1)
    _memory_bars(go, fig, result)
    fig.update_layout(height=1100, barmode="stack", title="autopar capacity plan")
    return fig


def _memory_bars(go, fig, result: SweepResult) -> None:
    labels = [f"{r.gpus} {r.gpu} s{r.seq_len}" for r in result.rows]
    parts = sorted({p for m in result.memory_gib if m for p in m})
    for part in parts:
        values = [(m or {}).get(part) for m in result.memory_gib]
        fig.add_trace(go.Bar(x=labels, y=values, name=f"{part} GiB"), row=3, col=1)
    fig.update_yaxes(title_text="GiB", row=3, col=1)


def _layout_label(row: SweepRow) -> str:
    if row.status not in ("optimal", "feasible"):
        return row.status
    return (
        f"TP{row.tp:.0f} PP{row.pp:.0f} VPP{row.vpp:.0f} CP{row.cp:.0f} DP{row.dp:.0f} "
        f"EP{row.ep:.0f} mbs{row.mbs:.0f} {row.recompute} ZeRO-{row.zero:.0f}"
    )


def _cell(value: Any) -> str:
    value = _finite(value)
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return html.escape(str(value))


def _table(result: SweepResult) -> str:
    head = "".join(f"<th>{c}</th>" for c in _LAYOUT_COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(getattr(r, c))}</td>" for c in _LAYOUT_COLUMNS) + "</tr>"
        for r in result.rows
    )
    return f'<table id="layouts"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _banner(result: SweepResult) -> str:
    """A partial sweep says so first (issue 24, finding 9)."""
    if not result.partial:
        return ""
    text = f"Partial report: {result.partial_reason}; rows interrupted or failed have no answer."
    return f'<p class="partial" role="alert"><strong>{html.escape(text)}</strong></p>'


def sweep_html(result: SweepResult, *, title: str = "autopar sweep") -> str:
    """The page: charts (plotly.js inlined, no network needed) and the layout table."""
    fig = _figure(result)
    charts = fig.to_html(include_plotlyjs=True, full_html=False, div_id="charts")
    style = "body{font-family:sans-serif} td,th{padding:2px 6px;text-align:right}"
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>{_banner(result)}"
        f"{charts}"
        f"<h2>Chosen layouts</h2>{_table(result)}</body></html>"
    )
