"""``autopar evaluate``: score one given layout."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from autopar.cli import options as o
from autopar.cli.errors import guarded
from autopar.cli.failure_options import with_failure_options
from autopar.cli.help import EXAMPLES, LAYOUT, SEARCH, GroupedCommand
from autopar.cli.progress import working
from autopar.cli.render import (
    WHY_FORMATS,
    format_targets,
    implied_by_format,
    render_estimate,
    write_formats,
)
from autopar.inputs.problem import DEFAULT_SEQ_LEN


def register(app: typer.Typer) -> None:
    @app.command("evaluate", cls=GroupedCommand, epilog=EXAMPLES["evaluate"])
    @guarded
    @with_failure_options()
    @o.with_stack_options
    @o.with_axis_options("evaluate")
    def evaluate(
        model: o.Model,
        gpus: o.Gpus,
        gpu: o.Gpu = None,
        gpus_per_node: o.GpusPerNode = None,
        cluster: o.Cluster = None,
        comm_profile: o.CommProfile = None,
        global_batch: o.GlobalBatch = None,
        global_batch_tokens: o.GlobalBatchTokens = None,
        seq_len: o.SeqLen = DEFAULT_SEQ_LEN,
        precision: o.Precision = "bf16",
        framework: o.Framework = None,
        stack_options: dict | None = None,
        failure_options: dict | None = None,
        cost_model: o.CostModelOpt = None,
        uneven_pipeline: o.UnevenPipeline = True,
        pipeline_plan: o.PipelinePlan = "uniform",
        stage_layers: o.StageLayers = None,
        stage_recompute: o.StageRecompute = None,
        sequence_parallel: Annotated[
            bool | None,
            typer.Option(
                "--sequence-parallel/--no-sequence-parallel",
                help="Default: on when tp > 1.",
                rich_help_panel=LAYOUT,
            ),
        ] = None,
        time_limit: Annotated[
            float,
            typer.Option(
                help="Seconds to look for the optimum this layout is measured against "
                "(0: do not look).",
                rich_help_panel=SEARCH,
            ),
        ] = 10.0,
        format: o.Format = "table",
        output: o.Output = None,
        **layout_values: object,
    ) -> None:
        """Predict step time, throughput, MFU and per-GPU memory of one layout."""
        from autopar import api

        started = time.perf_counter()  # --time-limit covers the whole command
        targets = format_targets(format, output)
        framework, stack_options, implied = implied_by_format(
            [fmt for fmt, _ in targets], framework, stack_options
        )
        api.check_solve_options(top=1, time_limit=time_limit, num_workers=None)
        with working("evaluating"):  # a spinner on a terminal once it runs past 1 s
            problem = api.make_problem(
                **o.common(locals()),
                sequence_parallel=sequence_parallel,
                uneven_pipeline=uneven_pipeline,
            )
            if stage_layers is not None or stage_recompute is not None:
                pipeline_plan = "per-stage"
            layout = api.layout_of(problem, pipeline_plan=pipeline_plan, **layout_values)
            plan = None
            if pipeline_plan == "per-stage":
                plan = api.plan_of(
                    problem, layout, stage_layers=stage_layers, stage_recompute=stage_recompute
                )
            result = api.evaluate_problem(problem, layout, cost_model=cost_model, plan=plan)
            why = any(fmt in WHY_FORMATS for fmt, _ in targets)
            searched = why and plan is None and time_limit > 0
            optimum = None
            if searched:
                left = max(0.0, time_limit - (time.perf_counter() - started))
                optimum = api.optimum_of(problem, result, time_limit=left, cost_model=cost_model)
        texts = [
            render_estimate(
                result, fmt, problem=problem, optimum=optimum, optimum_searched=searched
            )
            for fmt, _ in targets
        ]
        write_formats(targets, texts, result, problem, implied)
