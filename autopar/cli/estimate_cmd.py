"""``autopar evaluate``: score one given layout."""

from __future__ import annotations

from typing import Annotated

import typer

from autopar import api
from autopar.cli import options as o
from autopar.cli.errors import guarded
from autopar.cli.output import emit
from autopar.cli.render import render_estimate
from autopar.emit import EMITTERS

Size = Annotated[int, typer.Option(help="Layout dimension.")]


def register(app: typer.Typer) -> None:
    @app.command("evaluate")
    @guarded
    def evaluate(
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
        tp: Size = 1,
        pp: Size = 1,
        cp: Size = 1,
        ep: Size = 1,
        etp: Size = 1,
        vpp: Size = 1,
        mbs: Size = 1,
        recompute: Annotated[str, typer.Option(help="none, selective or full.")] = "none",
        zero: Annotated[
            int, typer.Option(help="0 none, 1 distributed optimizer, 2 +gradients, 3 +parameters.")
        ] = 1,
        uneven_pipeline: o.UnevenPipeline = False,
        sequence_parallel: Annotated[
            bool | None,
            typer.Option(
                "--sequence-parallel/--no-sequence-parallel", help="Default: on when tp > 1."
            ),
        ] = None,
        format: o.Format = "table",
        output: o.Output = None,
    ) -> None:
        """Predict step time, throughput, MFU and per-GPU memory of one layout."""
        common = o.common(locals())
        result = api.evaluate(
            **common,
            tp=tp,
            pp=pp,
            cp=cp,
            ep=ep,
            etp=etp,
            vpp=vpp,
            mbs=mbs,
            recompute=recompute,
            zero=zero,
            sequence_parallel=sequence_parallel,
            uneven_pipeline=uneven_pipeline,
            cost_model=cost_model,
        )
        problem = api.make_problem(**common) if format in EMITTERS else None
        emit(render_estimate(result, format, framework=framework, problem=problem), output)
