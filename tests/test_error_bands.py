"""Every predicted step time carries the error band of its class (issue 20): the band is drawn
from the validation residuals (``autopar/costs/error_bands.json``, written by
``benchmarks/validate_published.py --write-bands``), a class with few runs says so, and the band
shows in text, JSON (with its schema) and the sweep."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from typer.testing import CliRunner

import autopar
from autopar.cli import app
from autopar.costs import error_bands
from autopar.costs.error_bands import MIN_RUNS, error_band
from autopar.outputs.schema import schema
from tests.validation import heldout_residuals, validate_published, validated

pytestmark = pytest.mark.xdist_group("validation")  # one worker validates (conftest)


def test_the_residual_file_is_what_the_validation_gives_today() -> None:
    """The shipped bands are the current model's: rerun ``--write-bands`` after changing it."""
    modelled, _ = validated()
    fresh = json.loads(validate_published.bands_json(modelled, heldout_residuals()))["runs"]
    shipped = json.loads(
        (error_bands.resources.files("autopar.costs") / error_bands.BANDS_FILE).read_text()
    )["runs"]
    assert [r["id"] for r in fresh] == [r["id"] for r in shipped]
    for new, old in zip(fresh, shipped, strict=True):
        assert (new["generation"], new["precision"], new["moe"]) == (
            old["generation"],
            old["precision"],
            old["moe"],
        )
        assert new["abs_error"] == pytest.approx(old["abs_error"], abs=2e-3), new["id"]


def test_a_class_with_enough_runs_uses_its_own_90th_percentile() -> None:
    runs = [r for r in error_bands.residuals() if r[:3] == ("hopper", "fp8", False)]
    assert len(runs) >= MIN_RUNS
    band = error_band("hopper", "fp8", False)
    assert band.source == "own" and band.num_runs == len(runs) and not band.few_runs
    errors = np.array([r[3] for r in runs])
    assert np.mean(errors <= band.rel_error) >= 0.9  # covers 9 runs in 10
    assert band.text() == f"±{100 * band.rel_error:.0f}%, {len(runs)} published runs"


def test_a_class_with_few_runs_says_so_and_where_its_band_comes_from(monkeypatch) -> None:
    fake = (
        ("blackwell", "nvfp4", False, 0.30),
        *(("blackwell", "fp8", False, e) for e in (0.01, 0.02, 0.03, 0.04, 0.05)),
        *(("blackwell", "fp8", True, e) for e in (0.5, 0.5, 0.5, 0.5, 0.5)),
    )
    monkeypatch.setattr(error_bands, "residuals", lambda: fake)
    band = error_band("blackwell", "nvfp4", False)
    assert band.few_runs and band.num_runs == 1
    assert band.source == "blackwell dense" and band.source_runs == 6  # dense runs first
    assert band.rel_error == pytest.approx(0.30)
    assert "few runs: 1 published run of blackwell nvfp4 dense" in band.text()
    nothing = error_band("cdna4", "bf16", False)
    assert nothing.num_runs == 0 and nothing.source == "all" and nothing.source_runs == len(fake)


def test_evaluate_prints_and_returns_the_band() -> None:
    estimate = autopar.evaluate(
        model="llama-3-70b", gpus=64, gpu="gb200", seq_len=8192, global_batch=256,
        precision="fp8", tp=2, pp=4, vpp=5,
    )  # fmt: skip
    band = estimate.error_band
    assert band["class"] == "blackwell fp8 dense" and band["num_runs"] >= MIN_RUNS
    low, high = estimate.step_time_range_s
    assert low < estimate.step_time_s < high
    assert high / estimate.step_time_s == pytest.approx(1 + band["rel_error"])
    text = CliRunner().invoke(
        app,
        ["evaluate", "--gpus", "64", "--model", "llama-3-70b", "--gpu", "gb200", "--seq-len",
         "8192", "--global-batch", "256", "--precision", "fp8", "--tp", "2", "--pp", "4",
         "--vpp", "5"],
    )  # fmt: skip
    assert text.exit_code == 0, text.output
    assert f"({band['text']})" in text.output
    out = CliRunner().invoke(
        app,
        ["evaluate", "--gpus", "64", "--model", "llama-3-70b", "--gpu", "gb300", "--seq-len",
         "8192", "--global-batch", "256", "--precision", "nvfp4", "--tp", "2", "--pp", "4",
         "--vpp", "5", "--format", "json"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    jsonschema.validate(data, schema("evaluate"))
    few = [r for r in error_bands.residuals() if r[:3] == ("blackwell-ultra", "nvfp4", False)]
    assert 0 < len(few) < MIN_RUNS  # NVFP4 dense on Blackwell Ultra: too few published runs
    assert data["error_band"]["few_runs"] is True
    assert data["error_band"]["num_runs"] == len(few)


def test_sweep_rows_carry_the_band() -> None:
    plan = autopar.sweep(model="llama-3-8b", gpus=[8], gpu="h100", seq_len=4096)
    row = plan.rows[0]
    assert row.step_time_low_s < row.step_time_s < row.step_time_high_s
    assert row.error_band_runs >= MIN_RUNS and row.error_band_pct > 0
