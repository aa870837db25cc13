"""``autopar models``, ``autopar gpus`` and ``autopar stacks``: list presets, show one as editable
YAML."""

from __future__ import annotations

from typing import Annotated

import typer

from autopar.cli.errors import guarded
from autopar.cli.help import EXAMPLES, GroupedCommand
from autopar.inputs.echo import parameter_count
from autopar.inputs.loading import (
    load_gpu,
    load_model,
    load_stack,
    preset_aliases,
    preset_names,
    preset_text,
)
from autopar.inputs.specs import GIB
from autopar.inputs.stack import DEFAULT_STACK, SWITCHES


def _params(count: int) -> str:
    return f"{count / 1e12:.2f}T" if count >= 1e12 else f"{count / 1e9:.1f}B"


def models_table(names: list[str]) -> str:
    """One row per model preset: its parameter count (``autopar.inputs.echo.parameter_count``),
    shape, MLP, dense or MoE, and the aliases it answers to (``--model llama-70b``)."""
    header = ["model", "params", "layers", "hidden", "heads/kv", "ffn", "vocab", "mlp", "kind",
              "aliases"]  # fmt: skip
    rows = [header]
    for name in names:
        m = load_model(name)
        kind = f"MoE {m.num_experts}x top-{m.experts_per_token}" if m.is_moe else "dense"
        if m.layer_summary:
            kind += f" ({m.layer_summary})"
        rows.append([
            name, _params(parameter_count(m)), str(m.num_layers), str(m.hidden_size),
            f"{m.num_attention_heads}/{m.num_kv_heads}", str(m.ffn_hidden_size),
            str(m.vocab_size), m.mlp_kind, kind, ", ".join(preset_aliases("models", name)) or "-",
        ])  # fmt: skip
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    numeric = {1, 2, 3, 5, 6}
    return "\n".join(
        "  ".join(
            v.rjust(w) if c in numeric else v.ljust(w)
            for c, (v, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    )


def _gpu_line(name: str) -> str:
    g = load_gpu(name)
    fp8 = f"{g.peak_fp8_flop_per_s / 1e12:6.0f}" if g.peak_fp8_flop_per_s else "     -"
    return (
        f"{name:<12} {g.memory_bytes / GIB:6.1f} GiB  bf16 {g.peak_bf16_flop_per_s / 1e12:6.0f}"
        f"  fp8 {fp8} TFLOP/s  HBM {g.hbm_bytes_per_s / 1e12:4.2f} TB/s  "
        f"NVLink {g.nvlink_bytes_per_s / 1e9:4.0f} GB/s  NIC {g.nic_bytes_per_s / 1e9:3.0f} GB/s"
        f"  {g.gpus_per_node} per node"
    )


def _switch_cell(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def stacks_table(names: list[str]) -> str:
    """Every switch (``autopar.inputs.stack.SWITCHES``) against every preset: one row per
    switch, one column per stack, the default stack marked, then each stack's description."""
    specs = [load_stack(name) for name in names]
    header = ["switch", *(f"{n}*" if n == DEFAULT_STACK else n for n in names)]
    rows = [header] + [
        [item.label, *(_switch_cell(getattr(spec, item.name)) for spec in specs)]
        for item in SWITCHES
    ]
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    lines = [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    lines.append("")
    lines += [
        f"{name}{' (default)' if name == DEFAULT_STACK else ''}: {spec.description}"
        for name, spec in zip(names, specs, strict=True)
    ]
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    @app.command("models", cls=GroupedCommand, epilog=EXAMPLES["models"])
    @guarded
    def models(
        show: Annotated[
            str | None, typer.Option("--show", help="Print this preset as YAML.")
        ] = None,
    ) -> None:
        """List model presets (parameters, shape, aliases), or print one (--show NAME) as YAML."""
        if show:
            typer.echo(preset_text("models", show), nl=False)
            return
        typer.echo(models_table(preset_names("models")))

    @app.command("gpus", cls=GroupedCommand, epilog=EXAMPLES["gpus"])
    @guarded
    def gpus(
        show: Annotated[
            str | None, typer.Option("--show", help="Print this preset as YAML.")
        ] = None,
    ) -> None:
        """List GPU presets (datasheet figures), or print one (--show NAME) as YAML."""
        if show:
            typer.echo(preset_text("gpus", show), nl=False)
            return
        for name in preset_names("gpus"):
            typer.echo(_gpu_line(name))

    @app.command("stacks", cls=GroupedCommand, epilog=EXAMPLES["stacks"])
    @guarded
    def stacks(
        show: Annotated[
            str | None, typer.Option("--show", help="Print this preset as YAML.")
        ] = None,
    ) -> None:
        """List training-stack presets (overlaps, FP8 recipe, gradient dtype), or print one."""
        if show:
            typer.echo(preset_text("stacks", show), nl=False)
            return
        typer.echo(stacks_table(preset_names("stacks")))
