"""The failure-model options of the commands that build a problem (issue 22): the cluster's
failure rate, restart time and checkpoint bandwidth (``autopar.inputs.reliability``; a cluster
file's ``gpu_mtbf_hours``, ``restart_s``, ``checkpoint_gb_per_s`` are the defaults they
override) and, for ``solve`` and ``evaluate``, the run's tokens and price (days to train and
cost with and without failures); ``solve``'s ``--objective``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated

import typer

from autopar.cli.help import TRAINING
from autopar.cli.options import with_option_group

FAILURES = "Failures"
"""The help group of these options (``autopar.cli.help``: a group a command adds)."""

RELIABILITY_OPTIONS: tuple[tuple[str, str, str], ...] = (
    # keyword, flag, help
    (
        "gpu_mtbf_hours",
        "--gpu-mtbf-hours",
        "Hours between job-stopping failures per GPU (default 50,677: Llama 3's 419 "
        "unexpected interruptions in 54 days on 16,384 H100s).",
    ),
    (
        "restart_s",
        "--restart-s",
        "Seconds from a failure to training again: re-scheduling, start-up, loading the "
        "checkpoint (default 600).",
    ),
    (
        "checkpoint_gb_per_s",
        "--checkpoint-gb-per-s",
        "Checkpoint write bandwidth per server, GB/s, shared by its GPUs (default 0.122 per "
        "GPU: Llama 3's 2 TB/s for 16,384 GPUs).",
    ),
)
RUN_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("train_tokens", "--train-tokens", "Tokens to train on (15e12): days to train."),
    ("gpu_hour_cost", "--gpu-hour-cost", "Price of one GPU-hour: the cost of the run."),
)

Objective = Annotated[
    str,
    typer.Option(
        "--objective",
        help="step-time (fastest step) or goodput (least expected time per useful step under "
        "failures: checkpoints, lost work and restarts included).",
        rich_help_panel=FAILURES,
    ),
]


def _parameter(keyword: str, flag: str, help_text: str, panel: str = FAILURES) -> inspect.Parameter:
    return inspect.Parameter(
        keyword,
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            float | None, typer.Option(flag, help=help_text, rich_help_panel=panel)
        ],
    )


def with_failure_options(*, run: bool = True) -> Callable:
    """Give a command function, which takes ``failure_options``, the options above (with
    ``run``, the run's tokens and price too), the given ones as ``make_problem`` keywords."""
    extra = [_parameter(*item) for item in RELIABILITY_OPTIONS]
    extra += [_parameter(*item, panel=TRAINING) for item in (RUN_OPTIONS if run else ())]
    return lambda func: with_option_group(func, extra, "failure_options", given_only=True)
