"""Nothing runs Python the user did not choose in this action: a session file's custom-objects file needs
consent, rule plugins are listed without being imported and never replace a built-in rule."""

from __future__ import annotations

import json
import sys
from importlib.metadata import EntryPoint

import pytest

from gradscope.app.files.session_files import session_code_files
from gradscope.app.session import Session
from gradscope.app.work.worker import InlineExecutor
from gradscope.core.errors import RuleError
from gradscope.io.demo import demo_model_path
from gradscope.rules import base


def _session_file(tmp_path, code_file):
    path = tmp_path / "shared.gradscope.json"
    path.write_text(json.dumps({"schema": 1, "model": str(demo_model_path()), "custom_objects": str(code_file)}))
    return path


def test_a_session_file_does_not_run_its_custom_objects_file_without_consent(tmp_path):
    marker = tmp_path / "ran"
    code = tmp_path / "layers.py"
    code.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    shared = _session_file(tmp_path, code)
    assert session_code_files(shared) == [str(code)]  # what the GUI shows before asking
    s = Session(InlineExecutor())
    messages = []
    s.feedback.status_changed.connect(messages.append)
    assert s.load(shared)
    assert not marker.exists()  # not imported
    assert s.graph is not None  # the demo model needs no custom objects: it opened anyway
    assert any("was not run" in m for m in messages)
    t = Session(InlineExecutor())
    assert t.load(shared, allow_code=True)
    assert marker.exists()  # the user's explicit choice


def test_a_session_whose_model_fails_does_not_restyle_the_next_model(tmp_path):
    path = tmp_path / "gone.gradscope.json"
    path.write_text(
        json.dumps(
            {
                "schema": 1,
                "model": str(tmp_path / "missing.keras"),
                "view": {"colormap": "gray"},
                "plan": {"entries": [{"select": "*", "rule": "zero"}]},
            }
        )
    )
    s = Session(InlineExecutor())
    errors = []
    s.feedback.error_raised.connect(lambda *a: errors.append(a))
    s.load(path)
    assert errors and s.graph is None
    s.open_model(demo_model_path())
    assert s.graph is not None and s.view.colormap != "gray" and not s.plan.entries


@pytest.fixture
def fake_plugin(monkeypatch, tmp_path):
    """An installed package's entry point, as importlib.metadata reports it."""
    module = tmp_path / "evil_rules.py"
    module.write_text(
        "from gradscope.rules.base import Rule, register_rule\n"
        "open(__file__ + '.imported', 'w').write('x')\n"
        "@register_rule('guided_backprop', replace=True)\n"
        "class Blank(Rule):\n"
        "    def backward(self, ctx, dys):\n"
        "        return [0 * x for x in ctx.inputs]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = EntryPoint(name="evil", value="evil_rules", group="gradscope.rules")
    import importlib.metadata as md

    real = md.entry_points
    monkeypatch.setattr(md, "entry_points", lambda **kw: [ep] if kw.get("group") == "gradscope.rules" else real(**kw))
    yield module
    sys.modules.pop("evil_rules", None)


def test_plugins_are_listed_without_being_imported(fake_plugin):
    plugins = base.rule_plugins()
    assert [p.name for p in plugins] == ["evil"] and plugins[0].module == "evil_rules"
    base.available_rules()  # first use of the registry imports the built-ins only
    assert "evil_rules" not in sys.modules
    assert not fake_plugin.with_name(fake_plugin.name + ".imported").exists()


def test_a_plugin_cannot_replace_a_builtin_rule(fake_plugin):
    builtin = base.get_rule_class("guided_backprop")
    with pytest.raises(RuleError, match=r"plugin evil .*guided_backprop.*builtin"):
        base.load_rule_plugins()
    assert base.get_rule_class("guided_backprop") is builtin
