"""``autopar solve``: the provably fastest layout, the runners-up, and the solver status."""

from __future__ import annotations

from typing import Annotated

import typer

from autopar import api
from autopar.cli import options as o
from autopar.cli.errors import EXIT_INFEASIBLE, guarded
from autopar.cli.output import emit
from autopar.cli.render import render_solve
from autopar.emit import EMITTERS

Pin = Annotated[int | None, typer.Option(help="Pin this dimension.")]
Limit = Annotated[int | None, typer.Option(help="Upper limit for this dimension.")]


def register(app: typer.Typer) -> None:
    @app.command("solve")
    @guarded
    def solve(
        model: o.Model,
        gpus: o.Gpus,
        gpu: o.Gpu = None,
        gpus_per_node: o.GpusPerNode = None,
        cluster: o.Cluster = None,
        comm_profile: o.CommProfile = None,
        global_batch: o.GlobalBatch = None,
        global_batch_tokens: o.GlobalBatchTokens = None,
        seq_len: o.SeqLen = api.DEFAULT_SEQ_LEN,
        precision: o.Precision = "bf16",
        grad_precision: o.GradPrecision = "fp32",
        framework: o.Framework = "megatron",
        cost_model: o.CostModelOpt = None,
        tp: Pin = None,
        pp: Pin = None,
        cp: Pin = None,
        ep: Pin = None,
        etp: Pin = None,
        vpp: Pin = None,
        dp: Pin = None,
        mbs: Pin = None,
        grad_accum: Pin = None,
        max_tp: Limit = None,
        max_pp: Limit = None,
        max_cp: Limit = None,
        max_ep: Limit = None,
        max_dp: Limit = None,
        max_vpp: Annotated[int, typer.Option(help="Largest virtual pipeline size tried.")] = 8,
        max_mbs: Annotated[int, typer.Option(help="Largest micro-batch tried.")] = 16,
        recompute: Annotated[
            str, typer.Option(help="Allowed recompute modes: none,selective,full or any.")
        ] = "any",
        zero: Annotated[
            str | None,
            typer.Option(help="Allowed ZeRO stages, e.g. 0,1 or any (default per framework)."),
        ] = None,
        sequence_parallel: Annotated[
            bool | None,
            typer.Option(
                "--sequence-parallel/--no-sequence-parallel",
                help="Force SP on/off (default: on with TP).",
            ),
        ] = None,
        interleaving: Annotated[bool, typer.Option(help="Allow interleaved 1F1B.")] = True,
        context_parallel: Annotated[bool, typer.Option(help="Allow CP.")] = True,
        expert_parallel: Annotated[bool, typer.Option(help="Allow EP.")] = True,
        tp_within_node: Annotated[
            bool, typer.Option(help="Keep TP inside the NVLink domain.")
        ] = True,
        uneven_pipeline: o.UnevenPipeline = False,
        top: Annotated[int, typer.Option(help="How many best layouts to report.")] = 5,
        time_limit: Annotated[float, typer.Option(help="Solver time limit in seconds.")] = 10.0,
        num_workers: Annotated[int | None, typer.Option(help="CP-SAT workers.")] = None,
        format: o.Format = "table",
        output: o.Output = None,
    ) -> None:
        """Find the fastest layout that fits, proven optimal by CP-SAT."""
        limits = {
            k: v
            for k, v in (
                ("tp", max_tp),
                ("pp", max_pp),
                ("cp", max_cp),
                ("ep", max_ep),
                ("dp", max_dp),
            )
            if v is not None
        }
        common = o.common(locals())
        result = api.solve(
            **common,
            tp=tp,
            pp=pp,
            cp=cp,
            ep=ep,
            etp=etp,
            vpp=vpp,
            dp=dp,
            mbs=mbs,
            grad_accum=grad_accum,
            limits=limits,
            max_vpp=max_vpp,
            max_mbs=max_mbs,
            recompute=recompute,
            zero=zero,
            sequence_parallel=sequence_parallel,
            allow_interleaving=interleaving,
            allow_cp=context_parallel,
            allow_ep=expert_parallel,
            tp_within_node=tp_within_node,
            uneven_pipeline=uneven_pipeline,
            top=top,
            time_limit=time_limit,
            num_workers=num_workers,
            cost_model=cost_model,
        )
        problem = api.make_problem(**common) if format in EMITTERS else None
        emit(render_solve(result, format, framework=framework, problem=problem), output)
        if result.status in ("infeasible", "unknown"):
            if format == "table" and result.explanation:
                families = [f["family"] for f in result.explanation["families"]]
                binds = f"binding: {', '.join(families)}" if families else "no layout found"
                typer.echo(f"autopar: {result.status}: {binds} (explanation above)", err=True)
            raise typer.Exit(EXIT_INFEASIBLE)
