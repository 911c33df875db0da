"""docs/notebook.ipynb runs top to bottom in a Jupyter kernel (nbclient), and its study shows
its table as Markdown and its plot as a PNG image; a plain matplotlib figure made outside
pyplot (negative control) shows no image."""

from __future__ import annotations

import base64
import sys

import nbclient
import nbformat

from conftest import ROOT

NOTEBOOK = ROOT / "docs" / "notebook.ipynb"


def test_the_committed_notebook_holds_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


def test_the_notebook_runs_and_displays_its_table_and_plot(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(
        "import sys\nfrom matplotlib.figure import Figure\nprint(sys.executable)\nFigure().subplots()"))
    client = nbclient.NotebookClient(notebook, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    outputs = [cell.outputs for cell in notebook.cells if cell.cell_type == "code"]
    results = [output for cell in outputs for output in cell if output.output_type == "execute_result"]
    table = next(output.data["text/markdown"] for output in results if "| scheme |" in output.data.get("text/markdown", ""))
    assert "| pre-ln |" in table and "| shared-norm |" in table
    study_plot = outputs[-2]
    images = [output.data["image/png"] for output in study_plot if "image/png" in output.get("data", {})]
    assert len(images) == 1 and base64.b64decode(images[0])[:8] == b"\x89PNG\r\n\x1a\n"
    control = outputs[-1]
    assert sys.executable in "".join(output.get("text", "") for output in control)  # this environment's kernel
    assert not any("image/png" in output.get("data", {}) for output in control)
