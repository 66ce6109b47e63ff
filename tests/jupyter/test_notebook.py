"""examples/notebooks/ringlet_tour.ipynb runs from top to bottom against the built package, with
nbclient: no cell may error, each checked cell must report what it shows, and the engines must be
gone afterwards. The repository keeps the notebook without outputs."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from ipp_processes import wait_until_gone

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebooks" / "ringlet_tour.ipynb"


def text_of(cell) -> str:
    """Everything a cell printed or displayed as text."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.append(output.data.get("text/plain", ""))
    return "".join(parts)


def tagged(notebook, tag: str):
    cells = [c for c in notebook.cells if tag in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"the notebook has {len(cells)} cells tagged {tag!r}"
    return cells[0]


def test_the_notebook_is_kept_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    workdir = tmp_path_factory.mktemp("tour")
    # A kernel of this very Python (the venv with the freshly built ringlet), whatever other
    # "python3" kernels the machine's Jupyter paths may hold.
    kernels = tmp_path_factory.mktemp("jupyter") / "kernels" / "ringlet-test"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "ringlet test", "language": "python",
    }))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_PATH", str(kernels.parents[1]))
        client = NotebookClient(notebook, timeout=300, kernel_name="ringlet-test",
                                resources={"metadata": {"path": str(workdir)}})
        client.execute()  # raises CellExecutionError, with the cell and traceback, on any error
    return notebook


def test_every_dtype_matches_numpy_on_every_rank(executed):
    text = text_of(tagged(executed, "check-allreduce"))
    assert "allreduce matches NumPy for every dtype on every rank: float32, float64, float16, " \
           "bfloat16, int32, int64" in text, text


def test_explain_renders_a_table_with_one_choice(executed):
    cell = tagged(executed, "check-explain")
    html = "".join(o.data.get("text/html", "") for o in cell.outputs if "data" in o)
    assert html.count("<table>") == 1 and html.count(">chosen<") == 1, html
    assert "choice:" in html and "calibrated" in html


def test_the_benchmark_shows_a_table_and_a_plot(executed):
    cell = tagged(executed, "check-benchmark")
    kinds = [kind for o in cell.outputs if "data" in o for kind in o.data]
    assert "text/html" in kinds and "image/png" in kinds, kinds
    table = next(o.data["text/html"] for o in cell.outputs if "text/html" in o.get("data", {}))
    assert "auto / mpi" in table and table.count("<tr>") == 5  # a header and four sizes


def test_the_mismatch_is_reported_from_every_rank_and_the_ranks_stay_in_step(executed):
    text = text_of(tagged(executed, "check-mismatch"))
    assert "mismatched_allreduce failed on 2 ranks:" in text, text
    assert "ranks 0, 1: MismatchError: ranks disagree" in text, text
    assert "still in step: True" in text, text


def test_training_lowers_the_loss_and_keeps_the_ranks_identical(executed):
    cell = tagged(executed, "check-training")
    text = text_of(cell)
    found = re.search(r"loss fell from ([\d.]+) to ([\d.]+); weights identical on every rank: "
                      r"True", text)
    assert found, text
    assert float(found[2]) < 0.5 * float(found[1])
    assert any("image/png" in o.get("data", {}) for o in cell.outputs)


def test_stopping_leaves_no_engine_or_controller_behind(executed):
    assert "engines still running after stop: 0" in text_of(tagged(executed, "check-stop"))
    cluster_id = re.search(r"cluster (\S+): 2 engines", text_of(tagged(executed, "start")))
    assert cluster_id, text_of(tagged(executed, "start"))
    assert wait_until_gone(cluster_id[1]) == []
