"""Megatron-LM's own ``parse_args`` + ``validate_args`` + ``core_transformer_config_from_args``
on the ``--format megatron`` output for every preset x layout x stack case of
tests/test_emit_consumers.py
(run by hand with a Megatron-LM checkout; CI checks the vendored flag list and megatron-core's
``TransformerConfig`` instead, as Megatron-LM's training package does not install from PyPI).

    python tests/data/consumers/megatron_validate.py /path/to/Megatron-LM
"""

from __future__ import annotations

import os
import shlex
import sys
import typing
from collections import Counter
from pathlib import Path

import typing_extensions

typing.override = typing_extensions.override  # Megatron-LM main needs Python 3.12's
REPO = Path(__file__).resolve().parents[3]
sys.path[:0] = [sys.argv[1], str(REPO)]


def main() -> None:
    import torch

    torch.cuda.get_device_properties = lambda *a, **k: type("P", (), {"major": 9, "minor": 0})()
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.transformer import transformer_config
    from megatron.training import arguments

    # as on a machine with Transformer Engine (CUDA): its probes answer "present, recent"
    transformer_config.is_te_min_version = lambda *a, **k: True
    rope_utils.fused_apply_rotary_pos_emb = lambda *a, **k: None
    from autopar.errors import InputError
    from megatron.training.argument_utils import core_transformer_config_from_args

    import autopar
    from autopar import emit
    from tests.test_emit_consumers import PRESETS, _cases, _problem, layouts

    outcomes: Counter = Counter()
    for name in PRESETS:
        model = autopar.make_problem(model=name, gpus=8, global_batch=8).model
        for case_label, lay, (precision, stack) in (
            (label, lay, case) for label, lay in layouts(model).items() for case in _cases(label)
        ):
            problem = _problem(name, lay, precision, stack)
            try:
                line = emit.megatron_args(lay, problem)
            except InputError:
                outcomes["refused by autopar"] += 1
                continue
            os.environ["WORLD_SIZE"] = str(lay.tp * lay.pp * lay.dp * lay.cp)
            os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1" if lay.zero < 2 else "8"
            sys.argv = ["pretrain_gpt.py", *shlex.split(line)]
            try:
                args = arguments.parse_args()
                arguments.validate_args(args)
                config = core_transformer_config_from_args(args)
                assert config.tensor_model_parallel_size == lay.tp
                assert args.data_parallel_size == lay.dp, (args.data_parallel_size, lay.dp)
                outcomes["accepted"] += 1
            except (AssertionError, ValueError, RuntimeError, TypeError, SystemExit) as error:
                outcomes["rejected"] += 1
                print(f"{name} {case_label} {precision} {stack}: {type(error).__name__}: {error}")
    print(dict(outcomes))


if __name__ == "__main__":
    main()
