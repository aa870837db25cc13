"""Execute notebooks/capacity_planning.ipynb top to bottom (GitHub issue 7).

Runs with cwd = notebooks/ and the installed ``python3`` kernel of this environment (ipykernel
must be installed; nothing is installed here). Takes about a minute on two cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# one worker executes the notebook once for the module's tests (tests/conftest.py)
pytestmark = pytest.mark.xdist_group("notebook")
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOK = NOTEBOOKS / "capacity_planning.ipynb"


@pytest.fixture(scope="module")
def executed():
    # imported here, not at collection: every worker collects this module, one executes it
    import nbclient
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
        # once every cell ran and its outputs are in, the kernel's process group is killed,
        # not asked to shut down: its interpreter teardown took 0.6-2.5 s of wall (nbclient
        # then polls every 0.1 s) and nothing reads what it would do
        shutdown_kernel="immediate",
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    return nb


def _outputs(nb):
    return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]


def test_runs_without_errors(executed):
    errors = [o for o in _outputs(executed) if o.get("output_type") == "error"]
    assert not errors, errors[0].get("evalue") if errors else ""


def test_has_plots_and_tables(executed):
    outputs = _outputs(executed)
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    tables = [o for o in outputs if "text/html" in o.get("data", {})]
    assert len(images) >= 4
    assert len(tables) >= 3


def test_every_point_solved(executed):
    text = "".join(
        o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in _outputs(executed)
    )
    assert "notebook run time" in text
    for status in ("unknown", "infeasible", "model_invalid"):
        assert status not in text


def test_profile_is_committed():
    profile = NOTEBOOKS / "data" / "h100_comm_profile.yaml"
    assert profile.is_file()
    assert "all_reduce" in profile.read_text()
