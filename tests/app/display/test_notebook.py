"""The example notebook run by a real Jupyter kernel (nbclient), as a notebook user runs it: every result shows
itself as HTML with what it should say, nothing fails; each HTML output rendered by headless Chromium is drawn."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.app.display.browser import assert_drawn, screenshot

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).parents[3] / "docs" / "examples" / "gradscope_in_a_notebook.ipynb"

# what each code cell's HTML must hold, in order (the first cell only imports)
EXPECTED = [
    None,
    ("execute_result", ["data:image/jpeg;base64,", "guided_backprop", "class "]),
    ("execute_result", ["<svg", "mean |g|", "<title>"]),
    ("execute_result", ["Sanity checks for gradient", "Conservation", "Finite differences"]),
    ("execute_result", ['class="strip"', 'dir="auto"', "tiny_text", "score "]),
    ("execute_result", ['class="strip"', "attnlrp", "next token"]),
    ("execute_result", ['class="matrix"', "p = ", "generated tokens"]),
    ("display_data", ["first NaN/Inf", "Gradient flow in training", "mean |g| of every node"]),
    ("execute_result", ["first NaN/Inf", "Gradient flow in training"]),
    ("execute_result", ["Evaluation", "pointing", "deletion", "bootstrap interval", "data:image/png;base64,"]),
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Run in a folder of its own (it names only ``demo:`` files), by a kernel that captures what C++ writes to
    fd 2 as Jupyter shows it (ipykernel does not where it sees pytest's PYTEST_CURRENT_TEST: TensorFlow's
    start-up log reached users' notebooks while this test saw nothing)."""
    import os

    from jupyter_client.kernelspec import NATIVE_KERNEL_NAME

    nb = nbformat.read(NOTEBOOK, as_version=4)
    folder = tmp_path_factory.mktemp("notebook")
    client = nbclient.NotebookClient(
        nb,
        timeout=600,
        kernel_name=NATIVE_KERNEL_NAME,  # ipykernel of this interpreter (sys.executable)
        resources={"metadata": {"path": str(folder)}},
    )
    pytest_test = os.environ.pop("PYTEST_CURRENT_TEST", None)
    try:
        client.execute()
    finally:
        if pytest_test is not None:
            os.environ["PYTEST_CURRENT_TEST"] = pytest_test
    return nb


def test_the_notebook_is_run_with_this_interpreter():
    from jupyter_client.kernelspec import NATIVE_KERNEL_NAME, KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(NATIVE_KERNEL_NAME)
    assert Path(spec.argv[0]).resolve() == Path(sys.executable).resolve() or spec.argv[0] == "python"


def test_every_result_shows_itself_as_html(executed):
    cells = [c for c in executed.cells if c.cell_type == "code"]
    assert len(cells) == len(EXPECTED)
    for cell, expected in zip(cells, EXPECTED):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, cell.source
        printed = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        assert printed == "", printed[-2000:]  # no warning, no log line: only the results
        if expected is None:
            continue
        kind, words = expected
        shown = [o for o in cell.outputs if o.output_type == kind and "text/html" in o.get("data", {})]
        assert len(shown) == 1, (cell.source, [o.output_type for o in cell.outputs])
        html = shown[0]["data"]["text/html"]
        assert html.startswith('<div class="gs">'), html[:200]
        for word in words:
            assert word in html, (word, cell.source)
        assert "<script" not in html and not re.search(r'(src|href)="https?:', html)  # stands alone
        plain = shown[0]["data"]["text/plain"]  # what a plain console prints: one line, not every array
        assert "\n" not in plain.strip() and len(plain) < 300, plain[:300]
        assert len(html) < 100_000, (cell.source, len(html))  # a 64x64 map was a 512 px, 330 KB PNG


def test_the_live_monitor_ended_on_the_final_drawing(executed):
    """The live output is one display updated in place; its last drawing is the finished log (not 'updating')."""
    cell = [c for c in executed.cells if c.cell_type == "code"][7]
    (shown,) = [o for o in cell.outputs if o.output_type == "display_data"]
    html = shown["data"]["text/html"]
    assert "updating while fit runs" not in html
    assert re.search(r"first NaN/Inf: step \d+", html)


def test_the_outputs_are_drawn_in_a_browser(executed, tmp_path):
    """Every HTML output on one page (one browser start), each drawn: the page's height grows with each output and
    the screenshot is not blank."""
    from gradscope.app.display.html import page

    outputs = [
        o["data"]["text/html"]
        for cell in executed.cells
        if cell.cell_type == "code"
        for o in cell.outputs
        if "text/html" in o.get("data", {})
    ]
    assert len(outputs) == len(EXPECTED) - 1
    path = tmp_path / "outputs.html"
    path.write_text(page("the notebook's outputs", "".join(outputs)), encoding="utf-8")
    pixels = screenshot(path, tmp_path / "outputs.png", 1280, 7000)
    assert_drawn(pixels)
    drawn_rows = np.flatnonzero((pixels < 250).any(axis=(1, 2)))
    assert drawn_rows[-1] > 5000, "the outputs fill the page: none is empty"
