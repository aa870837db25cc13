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
from autopar.cli.progress import working
from autopar.cli.render import (
    LAUNCHERS,
    WHY_FORMATS,
    format_targets,
    implied_by_format,
    render_solve,
    write_formats,
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
        pipeline_schedule: Annotated[
            str | None,
            typer.Option(
                help="Allowed pipeline schedules, e.g. zb-v,dualpipe-v, or any (every one the "
                "framework ships); default 1f1b (interleaved with VPP).",
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
        uneven_pipeline: o.UnevenPipeline = True,
        pipeline_plan: o.PipelinePlan = "uniform",
        top: Annotated[
            int, typer.Option(help="How many best layouts to report.", rich_help_panel=OUTPUT)
        ] = 5,
        prefer: Annotated[
            str,
            typer.Option(
                help="Among layouts tied within the cost model's error band: fastest (the "
                "fastest prediction first, ties marked) or headroom (ties first, those within "
                "85% of the memory, fastest first).",
                rich_help_panel=OUTPUT,
            ),
        ] = "fastest",
        time_limit: Annotated[
            float | None,
            typer.Option(
                help="Seconds for the whole command; default: sized from the problem (10 s plus "
                "0.2 ms per layout), and scoring the uniform space always finishes.",
                rich_help_panel=SEARCH,
            ),
        ] = None,
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
        targets = format_targets(format, output)
        framework, stack_options, implied = implied_by_format(
            [fmt for fmt, _ in targets], framework, stack_options
        )
        api.check_solve_options(top=top, time_limit=time_limit, num_workers=num_workers)
        api.check_objective(objective, pipeline_plan)
        for fmt, _ in targets:
            check_fallback_flags(fmt, fallback_nodes, emit_fallback, LAUNCHERS, pipeline_plan)
        pins, limits = o.pins_and_limits(axis_values)
        with working("solving"):  # a spinner on a terminal once it runs past 1 s
            problem = api.make_problem(
                **o.common(locals()),
                **pins,
                limits=limits,
                recompute=recompute,
                zero=zero,
                pipeline_schedule=pipeline_schedule,
                sequence_parallel=sequence_parallel,
                interleaving=interleaving,
                context_parallel=context_parallel,
                expert_parallel=expert_parallel,
                tp_within_node=tp_within_node,
                uneven_pipeline=uneven_pipeline,
            )
            if fallback_nodes is not None:
                from autopar.sweeps.fallbacks import check_fallback_options

                check_fallback_options(problem, fallback_nodes, batch_tolerance)
            result = api.solve_problem(
                problem,
                top=top,
                time_limit=None
                if time_limit is None
                else max(0.0, time_limit - (time.perf_counter() - started)),
                num_workers=num_workers,
                cost_model=cost_model,
                pipeline_plan=pipeline_plan,
                alternatives=any(fmt in WHY_FORMATS for fmt, _ in targets),  # "why this layout"
                objective=objective,
                prefer=prefer,
            )
            code = 0
            formats = [fmt for fmt, _ in targets]
            if fallback_nodes is not None and result.layouts:
                options = dict(lost_servers=fallback_nodes, batch_tolerance=batch_tolerance,
                               objective=objective, cost_model=cost_model,
                               num_workers=num_workers, emit=emit_fallback)  # fmt: skip
                if time_limit is not None:  # else the fallbacks' own default
                    options["time_limit"] = max(0.0, time_limit - (time.perf_counter() - started))
                texts, code = solve_with_fallbacks(result, problem, options, formats)
            else:
                texts = [render_solve(result, fmt, problem=problem) for fmt in formats]
        best = result.best if result.layouts else None
        write_formats(targets, texts, best, problem, implied)
        if code:
            raise typer.Exit(EXIT_INFEASIBLE)
        if result.status in ("infeasible", "unknown"):
            explanation = result.explanation or Explanation(summary="no layout found")
            if targets[0][0] == "table":
                families = [f.family for f in explanation.families]
                binds = f"binding: {', '.join(families)}" if families else "no layout found"
                line = f"{binds} (explanation above)"
            else:
                line = explanation.summary
            typer.echo(f"autopar: {result.status}: {one_line(line)}", err=True)
            raise typer.Exit(EXIT_INFEASIBLE)
