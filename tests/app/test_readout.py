"""The headline action shows its effect: the map is read at the model input by default, so a rule on the
clicked node changes it; undo and clear give back the read-out, reduction and caption with the plan."""

from __future__ import annotations

import numpy as np

from gradscope.app.rendering.view import INPUT_KEY
from gradscope.app.session import Session
from gradscope.app.work.worker import InlineExecutor
from gradscope.io.demo import demo_image_paths, demo_model_path


def _demo() -> Session:
    s = Session(InlineExecutor())
    s.open_model(demo_model_path())
    s.fed.open(demo_image_paths()[0])
    return s


def test_a_rule_on_the_clicked_node_changes_the_default_map():
    s = _demo()
    assert s.view.readout_node == INPUT_KEY and s.readout is None
    before = s.overlay().saliency.copy()
    relu = next(n.id for n in s.graph.nodes if n.activation == "relu")
    s.selection.select(relu)  # clicking a node does not move the map away from the input
    s.editor.add_rule(relu, "backward_as", {"activation": "sigmoid"})
    after = s.overlay()
    assert after.node is None and not np.allclose(after.saliency, before)
    assert "custom plan" in s.result_caption()  # a hand edit is no longer any preset's plan


def test_undo_and_clear_give_back_the_readout_of_the_plan():
    s = _demo()
    s.editor.apply_method("cmwp")
    pinned = s.view.readout_node
    assert pinned not in (None, INPUT_KEY) and s.view.reduction == "sum_clamped"
    s.editor.undo()
    assert s.plan.entries == () and s.view.readout_node == INPUT_KEY and s.view.reduction == "max_abs"
    assert s.editor.method_name == "gradient" and "cmwp" not in s.result_caption()
    s.editor.redo()
    assert s.view.readout_node == pinned and s.editor.method_name == "cmwp"
    s.editor.clear()
    assert s.view.readout_node == INPUT_KEY and s.view.reduction == "max_abs" and s.editor.method_name == "gradient"
    s.editor.apply_method("lrp_epsilon")  # signed: diverging colours, given back by undo
    assert s.view.colormap == "bwr"
    s.editor.undo()
    assert s.view.colormap == "jet" and not s.view.signed


def test_peer_methods_in_the_session():
    from gradscope.engine.backward.attribution import smoothgrad

    s = _demo()
    plain = s.result.input_grad.copy()
    s.editor.apply_method("smoothgrad", samples=4)
    assert s.result.meta.get("sampling") == "smoothgrad" and s.view.readout_node == INPUT_KEY
    expected = smoothgrad(s.document.engine, s.inputs, s.target, s.plan, samples=4)
    np.testing.assert_allclose(s.result.input_grad, expected, rtol=1e-5, atol=1e-7)
    s.editor.undo()  # back to the plain gradient
    assert "sampling" not in s.result.meta
    np.testing.assert_allclose(s.result.input_grad, plain, rtol=1e-6)
    s.editor.apply_method("grad_cam")
    assert s.view.grad_cam and s.view.readout_node not in (None, INPUT_KEY)
    m = s.overlay()
    assert m.spatial and np.all(m.saliency >= 0)  # ReLU of the weighted sum


def test_a_degenerate_map_is_named_with_its_likely_cause():
    from gradscope.app.rendering.view import degenerate_note

    assert degenerate_note(np.zeros((4, 4)), "cmwp").startswith("The map is all zero")
    assert "stabiliser" in degenerate_note(np.zeros((4, 4)), "lrp_epsilon")
    assert "NaN" in degenerate_note(np.full((2, 2), np.nan), "gradient")
    assert degenerate_note(np.eye(3), "gradient") == ""
