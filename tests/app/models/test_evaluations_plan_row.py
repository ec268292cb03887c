"""The evaluation's "current plan" row is scored only when it differs from what is listed already."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gradscope.app.models.evaluations import Evaluations
from gradscope.app.models.feedback import Feedback
from gradscope.rules.plan import Plan, PlanEntry


class _Scored(Exception):
    def __init__(self, plan) -> None:
        self.plan = plan


def _plan_scored(monkeypatch, plan: Plan, method_name: str, methods: list[str]) -> tuple:
    import gradscope.app.evaluation.run as run

    def settings(methods, metrics, plan, **options):
        raise _Scored(plan)

    monkeypatch.setattr(run, "evaluation_settings", settings)
    said: list[str] = []
    feedback = Feedback()
    feedback.status_changed.connect(said.append)
    document = SimpleNamespace(engine=object())
    editor = SimpleNamespace(plan=plan, method_name=method_name)
    evaluations = Evaluations(document, editor, SimpleNamespace(), None, feedback)
    with pytest.raises(_Scored) as got:
        evaluations.start("data", "out", methods=methods, metrics=["pointing"], with_plan=True)
    return got.value.plan, said


@pytest.mark.parametrize(
    ("plan", "method_name"),
    [
        (Plan(), "gradient"),  # the plain gradient: the "gradient" row already
        (Plan(entries=(PlanEntry("*", "identity"),)), "custom plan"),  # identity everywhere is the gradient too
        (Plan(entries=(PlanEntry("type:ReLU", "guided_backprop"),)), "guided_backprop"),  # the preset is listed
    ],
)
def test_a_plan_equal_to_a_listed_method_is_not_scored_twice(monkeypatch, plan, method_name):
    scored, said = _plan_scored(monkeypatch, plan, method_name, ["gradient", "guided_backprop"])
    assert scored is None and any("scored once" in s for s in said)


def test_an_edited_plan_is_scored_under_its_own_label(monkeypatch):
    plan = Plan(entries=(PlanEntry("conv1", "zero"),))
    scored, said = _plan_scored(monkeypatch, plan, "custom plan", ["gradient", "guided_backprop"])
    assert scored is not None and scored.name == "plan: zero on conv1" and scored.entries == plan.entries
    assert not any("scored once" in s for s in said)
