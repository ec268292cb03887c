"""Export a plan as a Python training script: the script runs, loads the model and wraps it with
``plan_model``, and the wrapper's gradient is the one the debugger showed for that plan."""

from __future__ import annotations

import runpy

import numpy as np
import pytest

from gradscope.app.files.exports import ExportError, write_plan_snippet
from gradscope.cli import main
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.io.models import load_model
from gradscope.rules.plan import Plan
from tests.engine.fixtures import tape_input_gradient, tiny_cnn

RULE_FILE = """
from gradscope.rules.base import Rule, register_rule
import dataclasses

@register_rule("snippet_half")
class Half(Rule):
    @dataclasses.dataclass
    class Params:
        pass

    def backward(self, ctx, dys):
        return [0.5 * g for g in ctx.vjp(dys)]
"""


def test_the_exported_script_trains_with_the_plan_the_debugger_showed(tmp_path):
    rules = tmp_path / "my_rules.py"
    rules.write_text(RULE_FILE)
    from gradscope.rules.base import load_rule_file

    load_rule_file(rules)
    model_file = tmp_path / "tiny.keras"
    tiny_cnn(seed=3).save(model_file)
    plan = Plan(name="fix").with_entry("c1", "guided_backprop").with_entry("c2", "snippet_half")
    script = write_plan_snippet(tmp_path / "train", plan, model_file)
    assert script.suffix == ".py"
    assert f"load_rule_file({str(rules)!r})" in script.read_text()
    namespace = runpy.run_path(str(script), run_name="not_main")
    assert namespace["PLAN"] == plan
    x = np.random.default_rng(0).normal(size=(2, 12, 12, 3)).astype("float32")
    planned, model = namespace["planned"], namespace["model"]
    np.testing.assert_allclose(planned(x), model(x), atol=1e-6)  # the forward pass is the model's
    got, plain = tape_input_gradient(planned, x, 1), tape_input_gradient(model, x, 1)
    assert not np.allclose(got, plain, rtol=1e-3, atol=0)  # the backward pass is the plan's ...
    engine = Engine(load_model(model_file), strip_softmax=False)  # ... as the debugger computes it
    np.testing.assert_allclose(got, engine.backward(x, Target(index=1), plan).input_grad, rtol=1e-5, atol=1e-9)


def test_cli_snippet_refuses_unknown_nodes_and_never_overwrites_the_model(tmp_path, capsys):
    plan = tmp_path / "p.json"
    plan.write_text('{"entries": [{"select": "nope", "rule": "zero"}]}')
    assert main(["snippet", "--plan", str(plan), "--out", str(tmp_path / "t.py")]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["snippet", "--method", "guided_backprop", "--out", str(tmp_path / "g.py")]) == 0
    assert "guided_backprop" in (tmp_path / "g.py").read_text()
    with pytest.raises(ExportError):
        write_plan_snippet(tmp_path / "m.py", Plan(), tmp_path / "m.py")
