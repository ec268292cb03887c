"""A/B comparison: pin a result as B, change the plan, compare maps and per-node agreement; swap; export."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gradscope.app.rendering.comparison import compare, node_cosines
from gradscope.app.rendering.view import ViewSettings
from gradscope.app.session import Session
from gradscope.app.work.worker import InlineExecutor
from tests.engine.fixtures import tiny_cnn


@pytest.fixture
def session():
    s = Session(InlineExecutor())
    s.set_model(tiny_cnn(seed=4))
    s.fed.set_image(np.random.default_rng(1).uniform(0, 1, (12, 12, 3)))
    return s


def test_the_same_signal_compares_as_identical_and_a_scaled_one_only_in_norm():
    signal = np.random.default_rng(0).normal(size=(6, 6, 3)).astype("float32")
    same = compare(signal, 3.0 * signal, None, ViewSettings(), None, ("a", "b"))
    assert same.map_cosine == pytest.approx(1.0)
    assert np.all(same.difference == same.difference[0, 0])  # zero everywhere: one colour
    other = compare(signal, -signal, None, ViewSettings(reduction="sum"), None, ("a", "b"))
    assert other.map_cosine == pytest.approx(-1.0)


def test_pin_change_the_plan_compare_and_swap(session, tmp_path):
    s = session
    assert s.ab.pin()
    events = []
    s.ab.changed.connect(events.append)
    s.editor.add_rule("c2", "scale", {"factor": 2.0})  # every signal below c2 doubles: same directions
    comparison = s.comparison()
    assert comparison.a_label == "custom plan" and comparison.b_label == "gradient"
    assert comparison.map_cosine == pytest.approx(1.0, abs=1e-6)
    assert comparison.norm_ratio["c1"] == pytest.approx(2.0, rel=1e-5)  # below the rule
    assert comparison.norm_ratio["out:pre"] == pytest.approx(1.0, rel=1e-5)  # above it (the logits)
    assert s.ab.node_cosine["c1"] == pytest.approx(1.0, abs=1e-6) and events  # computed on the worker
    path = s.exports.comparison(tmp_path / "ab")
    side = json.loads(path.with_suffix(".json").read_text())
    # the 12 x 12 maps are smoothed up to 512 px as the overlay export smooths them (issue 51: blocky)
    from PIL import Image

    row = np.asarray(Image.open(path).convert("RGB"))[300, 8 : 8 + 512].astype(int)
    steps = np.abs(np.diff(row, axis=0)).sum(axis=1)
    assert (steps > 0).sum() > 100  # nearest-neighbour changes colour at the 11 cell borders only
    assert side["compare"]["b_method"] == "gradient" and side["plan"]["entries"]
    assert s.swap_compare()  # B's plan (no rules) is current again; the scaled plan is pinned
    assert not s.plan.entries and s.ab.pinned.plan.entries
    assert s.comparison().norm_ratio["c1"] == pytest.approx(0.5, rel=1e-5)
    s.editor.undo()  # the swap is an ordinary plan edit
    assert s.plan.entries


def test_a_new_input_ends_the_comparison(session):
    s = session
    s.ab.pin()
    s.fed.set_image(np.zeros((12, 12, 3)))
    assert s.ab.pinned is None and s.comparison() is None


def test_node_cosines_of_opposite_signals():
    class R:
        def __init__(self, grads):
            self.node_grads = grads

    a = {"n": np.array([1.0, 2.0]), "m": np.array([1.0, 0.0])}
    b = {"n": np.array([-2.0, -4.0]), "m": np.array([0.0, 1.0])}
    got = node_cosines(R(a), R(b))
    assert got["n"] == pytest.approx(-1.0) and got["m"] == pytest.approx(0.0)
