"""A sweep as one self-contained HTML page a planner can send (plotly, its JavaScript inlined).

From the top: what was planned (model, GPUs and their memory, sequence, batch, precision, stack,
cost model, training size and price, the autopar release), a line naming any chart left out and
the flag that fills it, the charts (``autopar.sweeps.charts``), then the table of chosen layouts
(``autopar.sweeps.report.COLUMNS``), which scrolls inside its box rather than widening the page.
Needs the ``html`` extra (plotly).
"""

from __future__ import annotations

import html

from autopar.sweeps.charts import figure, require_plotly
from autopar.sweeps.inputs import SweepInputs
from autopar.sweeps.report import (
    PANELS,
    cell,
    missing_text,
    shown_columns,
    title_values,
    value_of,
)
from autopar.sweeps.run import SweepResult

__all__ = ["require_plotly", "sweep_html"]

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px 24px;color:#222}
h1{font-size:1.5em;margin:0 0 8px}
table.inputs{border-collapse:collapse;margin:4px 0 12px}
table.inputs th{text-align:left;padding:1px 12px 1px 0;font-weight:600;vertical-align:top}
table.inputs td{padding:1px 0}
p.missing{background:#fff6e0;border-left:4px solid #E69F00;padding:6px 10px;margin:8px 0}
div.table-scroll{overflow-x:auto;max-width:100%}
table#layouts{border-collapse:collapse;font-size:13px}
#layouts th,#layouts td{padding:2px 6px;text-align:right;white-space:nowrap}
#layouts th{border-bottom:1px solid #999}
#layouts td.wide{text-align:left;white-space:normal;min-width:24em}
#layouts th.wide{text-align:left}
#layouts tr.no-layout td{color:#8a1c1c}
footer{color:#666;font-size:12px;margin-top:12px}
"""


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 1e4 else f"{value:g}"


def _inputs_rows(inputs: SweepInputs) -> list[tuple[str, str]]:
    """What the page header says was planned, one (label, text) per line."""
    gpus = ", ".join(
        f"{g.label} ({g.name}: {g.usable_gib:.1f} GiB usable"
        + (
            f" of {g.memory_gib:.1f} GiB, {g.reserve_gib:.1f} GiB kept free"
            if g.reserve_gib
            else ""
        )
        + ")"
        for g in inputs.gpus
    )
    batches = "; ".join(
        f"seq {b.seq_len:,}: {b.sequences:,} sequences ({b.tokens:,} tokens) per step"
        for b in inputs.batches
    )
    precision = inputs.precision + (f" ({inputs.fp8_recipe} scaling)" if inputs.fp8_recipe else "")
    values = title_values(inputs)
    return [
        ("Model", f"{inputs.model} ({inputs.parameters / 1e9:,.1f}B parameters)"),
        ("GPUs", gpus),
        ("GPU counts", ", ".join(f"{n:,}" for n in inputs.gpu_counts)),
        ("Sequence and batch", batches),
        ("Precision", f"{precision}, gradients {inputs.grad_precision}"),
        ("Stack", f"{inputs.stack} ({inputs.framework} rules)"),
        ("Cost model", inputs.cost_model),
        ("Training", values["train_tokens"] or "not given (--train-tokens)"),
        ("Price", values["rate"] or "not given (--gpu-hour-cost)"),
        ("autopar", inputs.version),
    ]


def _header(result: SweepResult, title: str | None) -> str:
    inputs = result.inputs
    if inputs is None:
        return f"<h1>{html.escape(title or 'autopar sweep')}</h1>"
    heading = title or f"{inputs.model}: capacity plan"
    rows = "".join(
        f"<tr><th>{html.escape(label)}</th><td>{html.escape(text)}</td></tr>"
        for label, text in _inputs_rows(inputs)
    )
    return f'<h1>{html.escape(heading)}</h1><table class="inputs">{rows}</table>'


def _table(result: SweepResult) -> str:
    columns = shown_columns(result.rows)
    values = title_values(result.inputs)
    head = "".join(
        f"<th{' class=wide' if c.wide else ''}>{html.escape(c.title.format(**values))}</th>"
        for c in columns
    )
    body = []
    for row in result.rows:
        cells = "".join(
            f"<td{' class=wide' if c.wide else ''}>"
            f"{html.escape(cell(value_of(c.key, row), c.fmt))}</td>"
            for c in columns
        )
        marked = "" if row.reason is None else ' class="no-layout"'
        body.append(f"<tr{marked}>{cells}</tr>")
    return (
        '<div class="table-scroll"><table id="layouts">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
    )


def _banner(result: SweepResult) -> str:
    """A partial sweep says so first (issue 24, finding 9)."""
    if not result.partial:
        return ""
    text = f"Partial report: {result.partial_reason}; rows interrupted or failed have no answer."
    return f'<p class="partial" role="alert"><strong>{html.escape(text)}</strong></p>'


def sweep_html(result: SweepResult, *, title: str | None = None) -> str:
    """The page: what was planned, the charts (plotly.js inlined, no network needed) and the
    layout table."""
    charts = figure(result).to_html(
        include_plotlyjs=True,
        full_html=False,
        div_id="charts",
        config={"responsive": True, "displaylogo": False},
    )
    missing = missing_text(PANELS, result.rows)
    note = f'<p class="missing">{html.escape(missing)}</p>' if missing else ""
    version = f"autopar {result.inputs.version}" if result.inputs else "autopar"
    page_title = title or (f"{result.inputs.model} capacity plan" if result.inputs else "sweep")
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(page_title)}</title><style>{STYLE}</style></head><body>"
        f"{_header(result, title)}{_banner(result)}{note}{charts}"
        f"<h2>Chosen layouts</h2>{_table(result)}"
        f"<footer>{html.escape(version)}: predictions of the cost model named above; each "
        "point is the fastest layout that fits.</footer></body></html>"
    )
