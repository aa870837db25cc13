"""Regenerate the consumer field lists the tests check emitted configs against, where the
consumer does not install on a CPU-only Python 3.11 machine (run by hand, not by pytest).

- Megatron-LM: its argparse parser (``megatron/training/arguments.py add_megatron_arguments``)
  from a checkout of https://github.com/NVIDIA/Megatron-LM; main needs Python 3.12's
  ``typing.override``, shimmed here. ``python vendor.py megatron /path/to/Megatron-LM COMMIT DATE``
- torchtitan 0.2.x: the dataclass fields of ``torchtitan/config/job_config.py`` (0.3 replaced the
  TOML job config, and one venv holds one torchtitan). ``python vendor.py torchtitan WHEEL_DIR``
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

HERE = Path(__file__).parent


def _dataclass_fields(path: Path) -> dict[str, list[str]]:
    """class name -> annotated field names (own fields only), read with ``ast``."""
    tree = ast.parse(path.read_text())
    out: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names = [
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            ]
            out[node.name] = names
    return out


def megatron(repo: str, commit: str, date: str) -> None:
    import typing

    import typing_extensions

    typing.override = typing_extensions.override
    sys.path.insert(0, repo)
    from megatron.training import arguments

    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    flags = {}
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--"):
                choices = None
                if action.choices:
                    choices = [getattr(c, "name", c) for c in action.choices]
                nargs = 0 if action.nargs == 0 else (1 if action.nargs is None else action.nargs)
                flags[option] = {"dest": action.dest, "nargs": nargs, "choices": choices}
    data = {
        "source": "https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/training/arguments.py",
        "commit": commit,
        "date": date,
        "flags": flags,
    }
    (HERE / "megatron-lm-arguments.json").write_text(json.dumps(data, indent=1, sort_keys=True))


def torchtitan(wheel_dir: str) -> None:
    fields = _dataclass_fields(Path(wheel_dir) / "torchtitan/config/job_config.py")
    sections = {k: v for k, v in fields.items() if k != "JobConfig"}
    job = fields["JobConfig"]
    by_section = {}
    for name in job:  # JobConfig field name -> its class (same name, capitalized words)
        cls = "".join(part.capitalize() for part in name.split("_"))
        match = {k.lower(): k for k in sections}.get(cls.lower())
        if match:
            by_section[name] = sections[match]
    data = {
        "source": "https://pypi.org/project/torchtitan/0.2.2/ torchtitan/config/job_config.py",
        "version": "0.2.2",
        "date": "2026-11-30",
        "sections": by_section,
    }
    (HERE / "torchtitan-0.2.2-job-config.json").write_text(json.dumps(data, indent=1))


CLASSES = ("TrainingConfig", "CheckpointConfig", "GPTDatasetConfig", "DatasetProvider",
           "DataloaderConfig", "ConfigContainer", "CommOverlapConfig")  # fmt: skip


if __name__ == "__main__":
    {"megatron": megatron, "torchtitan": torchtitan}[sys.argv[1]](*sys.argv[2:])
