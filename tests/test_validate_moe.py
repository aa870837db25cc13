"""MoE rows of the published runs (Megatron-Bridge, DGX-H100) evaluate with their published
layouts (issue 12; targets: median |error| <= 10%, max <= 25%)."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.api import make_problem
from autopar.layout.rules import layout_rules
from tests.validation import validate_published, validated

pytestmark = pytest.mark.xdist_group("validation")  # one worker validates (conftest)

H100_MEMORY_GIB = 79.6


@pytest.fixture(scope="module")
def moe_table():
    modelled, skipped = validated()
    return modelled[modelled["source"] == "mbridge_moe"], skipped


def test_every_moe_row_is_modelled_or_skipped_with_a_reason(moe_table) -> None:
    modelled, skipped = moe_table
    runs = validate_published.pd.read_csv(validate_published.DEFAULT_CSV)
    moe_ids = {
        row["id"] for _, row in runs.iterrows() if validate_published.is_mbridge_moe_row(row)
    }
    skipped_moe = skipped[skipped["id"].isin(moe_ids)]
    assert set(modelled["id"]) | set(skipped_moe["id"]) == moe_ids
    assert len(modelled) >= 18 and len(skipped_moe) <= 3
    assert all(skipped_moe["reason"].str.contains("regression|contradicts"))
    models = {
        validate_published.moe_model_name(m) for m in runs[runs["id"].isin(modelled["id"])]["model"]
    }
    assert models == set(validate_published.MBRIDGE_MOE_MODELS)


def test_moe_step_time_targets(moe_table) -> None:
    errors = np.abs(moe_table[0]["error_pct"].to_numpy())
    assert np.median(errors) <= 10.0
    assert errors.max() <= 25.0


def test_moe_layouts_fit_in_memory(moe_table) -> None:
    """Every published MoE layout fits an 80 GB H100, as it ran (with BF16 Adam moments, as
    Megatron-Bridge's MoE recipes keep them: validate_published.MBRIDGE_MOE_SWITCHES)."""
    modelled = moe_table[0]
    assert (modelled["memory_gib"] <= H100_MEMORY_GIB).all()
    assert modelled["fits"].all()


NOT_EXPRESSIBLE = ("deepseekv3",)
"""PP 8 VP 4 over 61 layers: Megatron-Bridge splits the embedding, the loss and the MTP module as
pipeline units (``--pipeline-model-parallel-layout``), which autopar's rules do not admit
(admitting them cost the DeepSeek-V3 uneven solve its proof: benchmarks/README.md)."""


def test_published_moe_layouts_are_expressible() -> None:
    """The rules admit the modelled Megatron-Bridge MoE layouts, EP across nodes included."""
    runs = validate_published.pd.read_csv(validate_published.DEFAULT_CSV)
    checked = 0
    for _, row in runs.iterrows():
        if not validate_published.is_mbridge_moe_row(row):
            continue
        case = validate_published.build_case(row, runs)
        if isinstance(case, str) or any(name in case.row_id for name in NOT_EXPRESSIBLE):
            continue
        problem = make_problem(
            model=case.model,
            gpus=case.training.num_gpus,
            seq_len=case.training.seq_len,
            global_batch=case.training.global_batch_sequences,
            uneven_pipeline=True,
        )
        grid = {k: np.array([v]) for k, v in case.layout.grid_row().items()}
        broken = [r.text for r in layout_rules(problem) if not r.check(grid).all()]
        assert broken == [], (case.row_id, broken)
        checked += 1
    assert checked >= 18
