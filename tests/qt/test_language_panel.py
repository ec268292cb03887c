"""A language model in the window (issue 37): the next token explained with its probability, the top five to
choose from, a contrast and a position; Generate shows the matrix, and a row opens that token's map."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QPoint, Qt

pytest.importorskip("keras_hub")

LLAMA = Path(__file__).resolve().parents[1] / "data" / "lxt" / "llama.keras"
PROMPT = "2 61 66 86 57 75 80 24"


def test_the_window_explains_next_tokens_and_generations(window, qtbot, wait_idle):
    s = window.session
    window.open_model(str(LLAMA))
    qtbot.waitUntil(lambda: s.graph is not None and s.graph.is_language_model, timeout=120_000)
    s.fed.set_typed(PROMPT)
    wait_idle(window)
    panel = window.overlay.language_panel
    qtbot.waitUntil(lambda: panel.isVisible() and panel.next_token.count() == 6, timeout=60_000)
    top = s.results.top_k(5)
    assert s.target.kind in ("class", "token") and int(s.result.target_indices[0]) == top[0][0]
    assert f"p = {top[0][1]:.3f}" in panel.summary.text() and "after position 7" in panel.summary.text()
    assert abs(sum(p for _, p in top) - sum(p for _, p in top)) == 0 and top[0][1] >= top[1][1]

    # the explained token is not offered as its own contrast (choosing it failed in the backward: issue 51)
    offered = [panel.contrast.itemData(i) for i in range(panel.contrast.count())]
    assert top[0][0] not in offered and offered[1:] == [t for t, _ in top[1:]]
    panel.next_token.setCurrentIndex(2)  # the second most likely token, rather than the first, at position 4
    panel._on_target_chosen()
    qtbot.waitUntil(lambda: s.target.index == top[1][0], timeout=10_000)
    wait_idle(window)
    qtbot.waitUntil(lambda: panel.contrast.findData(top[0][0]) > 0, timeout=10_000)  # now it is a contrast
    assert panel.contrast.findData(top[1][0]) < 0
    panel.contrast.setCurrentIndex(panel.contrast.findData(top[0][0]))
    panel.position.setValue(4)
    panel._on_target_chosen()
    qtbot.waitUntil(lambda: s.target.kind == "token" and s.target.position == 4, timeout=10_000)
    wait_idle(window)
    assert s.target.index == top[1][0] and s.target.contrast == top[0][0]
    assert f"rather than {top[0][0]}" in panel.summary.text()  # the pair is named, as the CLI names it
    assert window.overlay.target.currentText().endswith(f"rather than {top[0][0]}")
    scores = s.overlay().saliency
    assert np.all(scores[5:] == 0) and np.abs(scores[:5]).max() > 0  # causal: the positions after 4 play no part

    panel.steps.setValue(3)
    panel.generate_button.click()
    qtbot.waitUntil(lambda: s.results.generation is not None and s.jobs.busy is None, timeout=120_000)
    qtbot.waitUntil(lambda: panel.matrix.rows == 3 and panel.matrix.isVisible(), timeout=10_000)
    g = s.results.generation
    assert g.matrix.shape == (3, 10) and panel.matrix.pixmap().width() > 100
    # a click on the matrix's third row (issue 51: only a list under it reacted): its map, the two generated
    # before it in the input; the map pane keeps its token layout while that map is computed
    from gradscope.render.positions import MATRIX_CELL, matrix_row_top

    y = matrix_row_top(panel.matrix.pixmap().height(), 3, 2) + MATRIX_CELL // 2
    assert panel.matrix.row_at(y) == 2 and panel.matrix.row_at(5) is None  # the column labels choose nothing
    qtbot.mouseClick(panel.matrix, Qt.MouseButton.LeftButton, pos=QPoint(40, y))
    assert panel.matrix.current == 2
    for _ in range(20):  # while it computes, never the image layout
        assert window.overlay.positions_panel.isVisible() and not window.overlay.panels_box.isVisible()
        qtbot.wait(25)
    wait_idle(window)
    qtbot.waitUntil(lambda: s.fed.fed is not None and len(s.fed.fed.ids) == 10, timeout=30_000)
    wait_idle(window)
    assert s.target.index == int(g.generated[2])
    np.testing.assert_allclose(s.overlay().saliency, g.matrix[2], rtol=1e-3, atol=1e-6)


def test_a_hugging_face_folder_opens_in_the_window_with_its_tokenizer(window, qtbot, wait_idle):
    """Dropped or passed as an argument (``open_path``), a checkpoint folder opens as a model; its tokenizer is the
    vocabulary, so typed words explain the next token, shown as the tokenizer's pieces."""
    pytest.importorskip("safetensors")
    folder = Path(__file__).resolve().parents[1] / "data" / "hf" / "llama"
    s = window.session
    window.open_path(str(folder))
    qtbot.waitUntil(lambda: s.graph is not None and s.graph.is_language_model, timeout=120_000)
    qtbot.waitUntil(lambda: s.fed.vocab is not None and not s.fed.loading_vocab, timeout=60_000)
    dialog = window.type_tokens_dialog()  # Ctrl+T: wide enough for a sentence (it was 219 x 94 px)
    qtbot.waitExposed(dialog)
    assert dialog.width() >= 560 and dialog.edit.height() >= 4 * dialog.edit.fontMetrics().lineSpacing()
    qtbot.keyClicks(dialog.edit, "the cat sat")
    qtbot.keyClick(dialog.edit, Qt.Key.Key_Return)  # Enter takes it
    assert not dialog.isVisible()
    wait_idle(window)
    qtbot.waitUntil(lambda: s.fed.fed is not None and s.fed.fed.kind == "tokens", timeout=30_000)
    assert s.fed.fed.tokens[0] == "<|begin_of_text|>" and "cat" in "".join(s.fed.fed.tokens)
    assert s.document.path == str(folder) and "llama3_causal_lm" in window.graph_pane.title.text()


def test_a_long_prompt_strip_finds_tokens_and_steps_through_the_top_ones(window, qtbot, wait_idle):
    """Issue 50 item 5: a strip of a thousand tokens wraps into many lines; the finder frames a token found by its
    text (Enter: next, Shift+Enter: previous) or by its score (Top), scrolls it into view, and Esc clears it. An
    export is the strip without the frame."""
    s = window.session
    window.open_model(str(LLAMA))
    qtbot.waitUntil(lambda: s.graph is not None and s.graph.is_language_model, timeout=120_000)
    ids = [(7 * k) % 90 + 2 for k in range(1000)]  # a long prompt: the engine keeps no tapes (LONG_INPUT_TOKENS)
    s.fed.set_typed(" ".join(map(str, ids)))
    wait_idle(window)
    panel = window.overlay.positions_panel
    finder = panel.finder
    qtbot.waitUntil(lambda: finder.isVisible() and len(finder._labels) == 1000, timeout=60_000)
    scores = s.overlay().saliency
    assert "1,000 tokens" in finder.status.text() and s.result.meta["mode"] == "live"
    area = window.overlay_scroll
    bar = area.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0, timeout=5_000)  # the strip is taller than the pane
    order = np.argsort(-np.abs(scores), kind="stable")
    for rank in range(3):
        assert finder.next_top() == order[rank] and panel.framed == order[rank]
        assert f"#{rank + 1} by size" in finder.status.text()
        _assert_in_view(panel, area, order[rank])
    exported = panel.pixmap().toImage()
    assert exported != panel.picture.pixmap().toImage()  # the frame is on screen, not in what is exported
    s.viewing.set(colormap="viridis")  # a new picture of the same tokens keeps the frame, where it was
    assert panel.framed == order[2] and panel.pixmap().toImage() != panel.picture.pixmap().toImage()

    finder.field.setText("61")
    qtbot.keyClick(finder.field, Qt.Key.Key_Return)
    first = panel.framed
    assert "61" in finder._labels[first]
    _assert_in_view(panel, area, first)
    qtbot.keyClick(finder.field, Qt.Key.Key_Return)
    second = panel.framed
    assert second != first and "61" in finder._labels[second]
    qtbot.keyClick(finder.field, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert panel.framed == first
    finder.field.setText("nowhere")
    qtbot.keyClick(finder.field, Qt.Key.Key_Return)
    assert "No token holds 'nowhere'" in finder.status.text() and panel.framed == first
    qtbot.keyClick(finder.field, Qt.Key.Key_Escape)
    assert panel.framed is None and finder.field.text() == ""
    assert panel.picture.pixmap().toImage() == panel.pixmap().toImage()
    finder.next_top()
    s.fed.set_typed(" ".join(map(str, ids[:600])))  # another input: no frame on its strip
    wait_idle(window)
    qtbot.waitUntil(lambda: len(finder._labels) == 600, timeout=60_000)
    assert panel.framed is None and "600 tokens" in finder.status.text()


def _assert_in_view(panel, area, index: int) -> None:
    from gradscope.render.positions import token_boxes

    _, y, _, _ = token_boxes(panel._labels, panel.pixmap().width())[0][index]
    top = panel.picture.mapTo(area.widget(), QPoint(0, y)).y()
    seen = area.verticalScrollBar().value()
    assert seen <= top <= seen + area.viewport().height() - 10, (index, top, seen)
