"""The Patching view in a real (offscreen) window (issue 59): a corrupted input typed beside the clean one, the heat
map of a Hugging Face folder's blocks x positions drawn as the export draws it, a click on a cell patches that
value exactly as a plan entry (the output shown is the patched model's, Ctrl+Z undoes it), and an image model's
grid cells on the node selected in the graph."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from gradscope.app.files.patches import patch_picture
from gradscope.io.demo import demo_image_paths, demo_model_path

pytest.importorskip("keras_hub")

HF = Path(__file__).resolve().parents[1] / "data" / "hf"


def test_a_language_model_patched_from_the_window(window, qtbot, wait_idle):
    s = window.session
    window.open_path(str(HF / "gpt2"))
    qtbot.waitUntil(lambda: s.graph is not None, timeout=120_000)
    assert s.fed.set_typed("the cat sat on the mat")
    wait_idle(window)
    action = next(
        a for a in window.findChildren(type(window.undo_action)) if a.text() == "Patch against a corrupted input…"
    )
    action.trigger()
    assert window.patching_dock.isVisible() and action.shortcut().toString() == "Ctrl+Shift+P"
    panel = window.patching
    next(b for b in panel.findChildren(type(panel.run_button)) if b.text() == "From the input").click()
    assert panel.corrupt.text() == "the cat sat on the mat"  # to change a token or two
    panel.corrupt.setText("the cat sat in the mat")
    for name in ("attn", "mlp"):
        panel.components[name].setChecked(True)
    panel.compare.setChecked(True)
    panel.run_button.click()
    qtbot.waitUntil(lambda: s.patching.result is not None, timeout=120_000)
    result = s.patching.result
    assert list(result.by_component) == ["resid", "attn", "mlp"] and result.by_component["resid"].shape == (2, 11)
    assert result.units == list(s.fed.labels)  # the tokens shown are the columns
    shown = panel.picture.pixmap().toImage()
    assert (shown.width(), shown.height()) == patch_picture(result).shape[1::-1]  # the picture the export writes
    assert "correlation with exact" in panel.status.text()
    if os.environ.get("GRADSCOPE_SHOTS"):
        window.grab().save(os.path.join(os.environ["GRADSCOPE_SHOTS"], "patching.png"))

    # a click on the cell where the inputs differ, last block's residual stream: patched exactly, as a plan entry
    layout = panel.picture.layout_
    y = layout.tops["resid"] + layout.cell * 1 + layout.cell // 2
    x = layout.left + layout.cell * 10 + layout.cell // 2
    assert layout.cell_at(x, y) == ("resid", 1, 10)
    panel.patch_cell(*layout.cell_at(x, y))
    entry = s.plan.entries[-1]
    assert (entry.select, entry.rule, entry.params) == (result.nodes["resid"][1], "patch_value",
                                                        {"source": "input", "positions": [10]})  # fmt: skip
    qtbot.waitUntil(
        lambda: s.jobs.busy is None and s.result is not None and not s.results.is_stale(s.plan), timeout=60_000
    )
    # patching the last block's output at the last position makes the model's output the corrupted input's
    token = int(result.sidecar["index"])
    assert s.result.logits[0, -1, token] == pytest.approx(result.corrupt_value, abs=1e-4)
    assert "with the plan's values: logit of" in panel.effect.text()
    s.editor.undo()
    assert not s.plan.entries


def test_an_image_model_patches_grid_cells_of_the_selected_node(window, qtbot, wait_idle):
    s = window.session
    window.open_model(str(demo_model_path()))
    wait_idle(window)
    images = demo_image_paths()
    s.selection.select("conv2")
    window.patching_dock.show()
    panel = window.patching
    assert not panel.components["resid"].isEnabled() and panel.grid.isEnabled()
    assert s.patching.open(str(images[1]))
    panel.grid.setValue(4)
    panel.method.setCurrentText("exact")
    panel.run_button.click()
    qtbot.waitUntil(lambda: s.patching.result is not None, timeout=120_000)
    result = s.patching.result
    assert result.nodes == {"nodes": ["conv2"]} and result.grid == (4, 4) and result.effects.shape == (1, 16)
    cell = int(np.abs(result.effects[0]).argmax())
    panel.patch_cell("nodes", 0, cell)
    qtbot.waitUntil(
        lambda: s.jobs.busy is None and s.result is not None and not s.results.is_stale(s.plan), timeout=60_000
    )
    assert s.plan.entries[-1].params["region"]  # the cell's rows and columns at conv2
    logit = s.result.logits[0, result.sidecar["index"]]
    assert logit - s.baseline.logits[0, result.sidecar["index"]] == pytest.approx(result.effects[0, cell], abs=1e-3)
    s.fed.set_image(np.zeros((64, 64, 3), np.uint8))  # a new clean input: the result shown no longer holds
    assert s.patching.result is None and panel.picture.layout_ is None
