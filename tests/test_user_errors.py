"""Every user mistake through the API or the Session is a typed GradscopeError with one clear line (the CLI
prints it and exits 2, the GUI shows it in a dialog), never a raw Python traceback; and a refused value leaves
the Session's state as it was."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gradscope.api import explain, open_engine
from gradscope.app.session import Session
from gradscope.app.work.worker import InlineExecutor
from gradscope.core.errors import GradscopeError, ImageLoadError, PlanError, TargetError
from gradscope.core.targets import Target
from gradscope.io.demo import demo_image_paths, demo_model_path
from gradscope.rules.plan import Plan


@pytest.fixture(scope="module")
def engine():
    return open_engine(demo_model_path())


@pytest.fixture(scope="module")
def image():
    return str(demo_image_paths()[0])


API_CASES = {
    "image: 1-D array": dict(image=np.zeros(10)),
    "image: empty": dict(image=np.zeros((0, 0, 3), np.uint8)),
    "image: NaN": dict(image=np.full((8, 8, 3), np.nan, np.float32)),
    "image: strings": dict(image=np.array([["a", "b"]])),
    "target: a word": dict(target="cat"),
    "target: 3.7": dict(target=3.7),
    "target: out of range": dict(target=10**6),
    "target: negative": dict(target=-1),
    "target: unknown node": dict(target=Target(kind="neuron", node="nope", neuron=(0,))),
    "layer: unknown": dict(layer="nope"),
    "preprocessing: unknown": dict(preprocessing="nope"),
    "reduction: unknown": dict(reduction="nope"),
    "method: unknown": dict(method="nope"),
    "method options: unknown": dict(method_options={"bogus": 1}),
    "smoothgrad: noise not a number": dict(method="smoothgrad", method_options={"noise": "x"}),
    "smoothgrad: no samples": dict(method="smoothgrad", method_options={"samples": 0}),
    "integrated gradients: no steps": dict(method="integrated_gradients", method_options={"steps": 0}),
    "plan: not a Plan": dict(method=None, plan="guided"),
    "plan: unknown node": dict(method=None, plan=Plan().with_entry("nope", "zero")),
}


@pytest.mark.parametrize("case", list(API_CASES))
def test_api_user_errors_are_typed(engine, image, case):
    kwargs = {"image": image, **API_CASES[case]}
    with pytest.raises(GradscopeError) as err:
        explain(engine, kwargs.pop("image"), **kwargs)
    assert "\n" not in str(err.value) and str(err.value)


def test_a_class_index_written_as_text_is_read_as_a_number(engine, image):
    assert explain(engine, image, target="2").target.index == 2
    assert Target(index=np.int64(1)).index == 1 and Target(index=2.0).index == 2
    with pytest.raises(TargetError):
        Target(index=True)


def test_explanation_view_options_are_checked(engine, image, tmp_path):
    ex = explain(engine, image)
    for options in ({"bogus": 1}, {"cmap": "nope"}, {"alpha": 2}, {"normalization": "nope"}):
        with pytest.raises(GradscopeError):
            ex.render(**options)
    with pytest.raises(GradscopeError):
        ex.save(image)  # never over an input


@pytest.fixture(scope="module")
def shared_session(image):
    s = Session(InlineExecutor())
    s.open_model(demo_model_path())
    s.fed.open(image)
    s.dialogs = []
    s.feedback.error_raised.connect(lambda title, message, exc: s.dialogs.append(exc))
    return s


@pytest.fixture
def session(shared_session):
    """One session for these tests (opening the model is the slow part): each test must leave it as it was."""
    shared_session.dialogs.clear()
    return shared_session


SESSION_REFUSED = {
    "set_view: unknown colormap": lambda s: s.viewing.set(colormap="nope"),
    "set_view: alpha 5": lambda s: s.viewing.set(alpha=5),
    "set_view: unknown field": lambda s: s.viewing.set(bogus=1),
    "set_view: unknown read-out node": lambda s: s.viewing.set(readout_node="nope"),
    "set_view: unknown reduction": lambda s: s.viewing.set(reduction="nope"),
    "remove_entry: not an index": lambda s: s.editor.remove_entry("a"),
    "top_k: not a number": lambda s: s.results.top_k("a"),
    "signal: unknown node": lambda s: s.signal("nope"),
}


@pytest.mark.parametrize("case", list(SESSION_REFUSED))
def test_session_refuses_bad_values_with_a_typed_error_and_keeps_its_state(session, case, tmp_path):
    view, plan = session.view, session.plan
    with pytest.raises(GradscopeError):
        SESSION_REFUSED[case](session)
    assert session.view == view and session.plan == plan
    session.exports.overlay(tmp_path / "still_exports.png")  # nothing poisoned the state


SESSION_REPORTED = {
    "set_image: 1-D": (lambda s: s.fed.set_image(np.zeros(3)), ImageLoadError),
    "set_image: NaN": (lambda s: s.fed.set_image(np.full((8, 8, 3), np.nan)), ImageLoadError),
    "set_target_class: a word": (lambda s: s.targeting.set_class("cat"), TargetError),
    "set_target_class: out of range": (lambda s: s.targeting.set_class(10**6), TargetError),
    "add_rule: bad parameter": (lambda s: s.editor.add_rule("*", "scale", {"factor": "x"}), PlanError),
    "apply_method: bad option": (lambda s: s.editor.apply_method("smoothgrad", samples=-3), PlanError),
}


@pytest.mark.parametrize("case", list(SESSION_REPORTED))
def test_session_reports_bad_input_in_a_dialog_with_a_typed_error(session, case):
    action, kind = SESSION_REPORTED[case]
    image, target, plan = session.fed.image, session.target, session.plan
    action(session)
    assert session.dialogs and isinstance(session.dialogs[-1], kind)
    assert session.fed.image is image and session.target == target and session.plan == plan


def test_a_session_file_with_a_bad_view_is_refused_before_anything_changes(tmp_path, session):
    path = tmp_path / "bad.gradscope.json"
    path.write_text(json.dumps({"schema": 1, "model": str(demo_model_path()), "view": {"colormap": "nope"}}))
    view = session.view
    assert not session.load(path)
    assert session.dialogs and "colormap" in str(session.dialogs[-1]) and session.view == view
