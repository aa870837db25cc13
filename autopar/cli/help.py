"""Command help that teaches (issue 24): options in groups, then worked examples.

Each option names its group with typer's ``rich_help_panel`` (``Model``, ``Cluster``,
``Training``, ``Stack``, ``Search``, ``Layout``, ``Output``). autopar prints help with click's
plain formatter (``rich_markup_mode=None`` keeps usage errors in click's one-block format and
costs no ``rich`` import), which ignores the panels, so ``GroupedCommand`` writes one section per
panel itself and its ``epilog`` verbatim under "Examples" (click would re-wrap it into one
paragraph). Every example is a command line that parses (``tests/test_help.py``).
"""

from __future__ import annotations

import inspect

from typer.core import TyperCommand, TyperOption

PANELS: tuple[str, ...] = ("Model", "Cluster", "Training", "Stack", "Search", "Layout", "Output")
"""The option groups in the order help lists them."""
OTHER = "Other"
"""Options without a group (``--help``); a command none of whose options has a group lists
them under "Options", as click does."""

MODEL, CLUSTER, TRAINING, STACK, SEARCH, LAYOUT, OUTPUT = PANELS


class GroupedCommand(TyperCommand):
    """A typer command whose plain-text help groups its options by ``rich_help_panel`` and ends
    with its examples (``epilog``), line for line."""

    def format_options(self, ctx, formatter) -> None:
        arguments: list[tuple[str, str]] = []
        groups: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
                continue
            groups.setdefault(panel_of(param), []).append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        extra = sorted(set(groups) - {*PANELS, OTHER})  # a group a command adds: before Output
        plain = set(groups) == {OTHER}  # a command without groups: click's one "Options" list
        for name in (*PANELS[:-1], *extra, OUTPUT, OTHER):
            if name in groups:
                with formatter.section("Options" if plain else name):
                    formatter.write_dl(groups[name])

    def format_epilog(self, ctx, formatter) -> None:
        if not self.epilog:
            return
        with formatter.section("Examples"):
            indent = " " * formatter.current_indent
            for line in inspect.cleandoc(self.epilog).splitlines():
                formatter.write(f"{indent}{line}\n" if line else "\n")


def panel_of(param) -> str:
    """The help group of a click parameter (typer keeps ``rich_help_panel`` on its options)."""
    return (param.rich_help_panel if isinstance(param, TyperOption) else None) or OTHER


EXAMPLES: dict[str, str] = {
    "solve": """
        autopar solve --gpus 1024 --model llama-70b
        autopar solve --gpus 1024 --model llama-70b --seq-len 8192 --global-batch 1024 --top 5
        autopar solve --gpus 512 --model ./config.json --gpu h200 --precision fp8 --tp 8
        autopar solve --gpus 64 --model llama-70b --stack megatron-bridge-25.09 --format megatron
        autopar solve --gpus 1024 --model llama-70b --format json -o plan.json
    """,
    "evaluate": """
        autopar evaluate --gpus 1024 --model llama-70b --tp 8 --pp 4 --vpp 5
        autopar evaluate --gpus 1024 --model llama-70b --seq-len 8192 --tp 4 --pp 2 --cp 2 \\
            --recompute selective --zero 1
        autopar evaluate --gpus 8 --model llama-8b --pp 2 --stage-layers 15,17 --format megatron
    """,
    "sweep": """
        autopar sweep --model llama-70b --gpus 256,512,1024,2048 --train-tokens 15e12 \\
            --gpu-hour-cost 2.5
        autopar sweep --model llama-70b --gpus 256,512,1024,2048 --gpu h100,h200 \\
            --train-tokens 15e12 --gpu-hour-cost 2.5 --jobs 2 --format html -o plan.html
        autopar sweep --model llama-8b --gpus 8,16,32 --seq-len 4096,8192 --format csv
    """,
    "models": """
        autopar models
        autopar models --show llama-70b > my-model.yaml
    """,
    "gpus": """
        autopar gpus
        autopar gpus --show h100 > my-gpu.yaml
    """,
    "stacks": """
        autopar stacks
        autopar stacks --show megatron-bridge-25.09
    """,
    "calibrate": """
        autopar calibrate logs/*.log --output profile.yaml
        autopar calibrate --compare --profile profile.yaml logs/*.log
        autopar solve --gpus 1024 --model llama-70b --comm-profile profile.yaml
    """,
    "bench comm": """
        autopar bench comm --output comm.log --nproc 2
    """,
    "bench gemm": """
        autopar bench gemm --hidden 8192 --ffn 28672 --heads 64 --kv-heads 8 --vocab 128256 \\
            --tp 8 --profile profile.yaml
    """,
    "schema": """
        autopar schema solve > solve.schema.json
        autopar schema evaluate
    """,
}
"""The example block of each command (``--help`` prints it after the options)."""
