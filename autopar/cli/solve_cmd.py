"""``autopar solve``: the provably fastest layout, the runners-up, and the solver status."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from autopar.base.errors import one_line
from autopar.cli import options as o
from autopar.cli.errors import EXIT_INFEASIBLE, guarded
from autopar.cli.failure_options import Objective, with_failure_options
from autopar.cli.fallbacks_view import (
    BatchTolerance,
    EmitFallback,
    FallbackNodes,
    check_fallback_flags,
    solve_with_fallbacks,
)
from autopar.cli.help import EXAMPLES, OUTPUT, SEARCH, GroupedCommand
from autopar.cli.output import emit
from autopar.cli.progress import working
from autopar.cli.render import (
    LAUNCHERS,
    WHY_FORMATS,
    check_format,
    framework_notes,
    implied_by_format,
    render_solve,
)
from autopar.inputs.problem import DEFAULT_SEQ_LEN
from autopar.layout.results import Explanation


def register(app: typer.Typer) -> None:
    @app.command("solve", cls=GroupedCommand, epilog=EXAMPLES["solve"])
    @guarded
    @with_failure_options()
    @o.with_stack_options
    @o.with_axis_options("solve")
    def solve(
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
        objective: Objective = "step-time",
        recompute: Annotated[
            str,
            typer.Option(
                help="Allowed recompute modes: none,selective,full or any.", rich_help_panel=SEARCH
            ),
        ] = "any",
        zero: Annotated[
            str | None,
            typer.Option(
                help="Allowed ZeRO stages, e.g. 0,1 or any (default per framework).",
                rich_help_panel=SEARCH,
            ),
        ] = None,
        sequence_parallel: Annotated[
            bool | None,
            typer.Option(
                "--sequence-parallel/--no-sequence-parallel",
                help="Force SP on/off (default: on with TP).",
                rich_help_panel=SEARCH,
            ),
        ] = None,
        interleaving: Annotated[
            bool, typer.Option(help="Allow interleaved 1F1B.", rich_help_panel=SEARCH)
        ] = True,
        context_parallel: Annotated[
            bool, typer.Option(help="Allow CP.", rich_help_panel=SEARCH)
        ] = True,
        expert_parallel: Annotated[
            bool, typer.Option(help="Allow EP.", rich_help_panel=SEARCH)
        ] = True,
        tp_within_node: Annotated[
            bool, typer.Option(help="Keep TP inside the NVLink domain.", rich_help_panel=SEARCH)
        ] = True,
        uneven_pipeline: o.UnevenPipeline = False,
        pipeline_plan: o.PipelinePlan = "uniform",
        top: Annotated[
            int, typer.Option(help="How many best layouts to report.", rich_help_panel=OUTPUT)
        ] = 5,
        time_limit: Annotated[
            float, typer.Option(help="Solver time limit in seconds.", rich_help_panel=SEARCH)
        ] = 10.0,
        num_workers: Annotated[
            int | None, typer.Option(help="CP-SAT workers.", rich_help_panel=SEARCH)
        ] = None,
        fallback_nodes: FallbackNodes = None,
        batch_tolerance: BatchTolerance = 0.0,
        emit_fallback: EmitFallback = None,
        format: o.Format = "table",
        output: o.Output = None,
        **axis_values: int | None,
    ) -> None:
        """Find the fastest layout that fits, proven optimal by CP-SAT."""
        from autopar import api  # the search floors: loaded by the commands that solve

        started = time.perf_counter()  # --time-limit covers the whole command
        check_format(format)
        framework, stack_options, implied = implied_by_format(format, framework, stack_options)
        api.check_solve_options(top=top, time_limit=time_limit, num_workers=num_workers)
        api.check_objective(objective, pipeline_plan)
        check_fallback_flags(format, fallback_nodes, emit_fallback, LAUNCHERS, pipeline_plan)
        pins, limits = o.pins_and_limits(axis_values)
        with working("solving"):  # a spinner on a terminal once it runs past 1 s
            problem = api.make_problem(
                **o.common(locals()),
                **pins,
                limits=limits,
                recompute=recompute,
                zero=zero,
                sequence_parallel=sequence_parallel,
                allow_interleaving=interleaving,
                allow_cp=context_parallel,
                allow_ep=expert_parallel,
                tp_within_node=tp_within_node,
                uneven_pipeline=uneven_pipeline,
            )
            if fallback_nodes is not None:
                from autopar.sweeps.fallbacks import check_fallback_options

                check_fallback_options(problem, fallback_nodes, batch_tolerance)
            result = api.solve_problem(
                problem,
                top=top,
                time_limit=max(0.0, time_limit - (time.perf_counter() - started)),
                num_workers=num_workers,
                cost_model=cost_model,
                pipeline_plan=pipeline_plan,
                alternatives=format in WHY_FORMATS,  # the formats that print why this layout
                objective=objective,
            )
            code = 0
            if fallback_nodes is not None and result.layouts:
                left = max(0.0, time_limit - (time.perf_counter() - started))
                options = dict(lost_servers=fallback_nodes, batch_tolerance=batch_tolerance,
                               objective=objective, cost_model=cost_model, time_limit=left,
                               num_workers=num_workers, emit=emit_fallback)  # fmt: skip
                text, code = solve_with_fallbacks(result, problem, options, format)
            else:
                text = render_solve(result, format, problem=problem)
        emit(text, output)
        if code:
            raise typer.Exit(EXIT_INFEASIBLE)
        best = result.best if result.layouts else None
        for note in framework_notes(best, format, problem, implied):
            typer.echo(note, err=True)
        if result.status in ("infeasible", "unknown"):
            explanation = result.explanation or Explanation(summary="no layout found")
            if format == "table":
                families = [f.family for f in explanation.families]
                binds = f"binding: {', '.join(families)}" if families else "no layout found"
                line = f"{binds} (explanation above)"
            else:
                line = explanation.summary
            typer.echo(f"autopar: {result.status}: {one_line(line)}", err=True)
            raise typer.Exit(EXIT_INFEASIBLE)
