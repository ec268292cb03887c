"""The rule editor's choice for a newly selected node: the rule the plan gives it, else the true gradient; the
rules made for that kind of node listed first."""

from __future__ import annotations

from PySide6.QtCore import Qt

from gradscope.qt.inspector import DEFAULT_RULES, rule_groups
from gradscope.rules.base import Rule, available_rules


def _open(window, qtbot, wait_idle, model_file):
    window.open_model(str(model_file))
    wait_idle(window)
    qtbot.waitUntil(lambda: window.session.catalog.ready, timeout=60_000)
    return window.session, window.inspector.rule_editor


def _narrow(cls) -> bool:
    """Independent of the editor: the rule replaces Rule.applies_to (it is meant for some nodes only)."""
    return "applies_to" in {k for klass in cls.__mro__ if klass is not Rule for k in vars(klass)}


def test_a_node_without_a_rule_starts_on_the_true_gradient(window, qtbot, wait_idle, model_file):
    s, editor = _open(window, qtbot, wait_idle, model_file)
    rules = available_rules()
    for node_id in ("c1:pre", "c1", "c2", "gap", "out"):
        s.selection.select(node_id)
        assert editor.rule_combo.currentText() == DEFAULT_RULES[0], node_id  # not "clip", the first by name
        assert "true gradient" in editor.description.text().lower()
        node = s.graph.node(node_id)
        names = editor.rule_names()
        assert sorted(names) == sorted(rules)  # every rule is offered, once
        fits = [rules[n].applies_to(node) for n in names]
        assert fits == sorted(fits, reverse=True), (node_id, names)  # the ones that apply come first
        specific = [rules[n].applies_to(node) and _narrow(rules[n]) for n in names]
        assert specific == sorted(specific, reverse=True), (node_id, names)  # node-specific ones before those
        assert names.index("identity") < names.index("true_gradient") < names.index("zero")
    s.selection.select("c1")
    names = editor.rule_names()
    for name in ("guided_backprop", "deconvnet", "backward_as"):
        if name in rules:  # registered by the ReLU-family / substitute modules
            assert names.index(name) < names.index("identity"), names
    if "guided_backprop" in rules and "deconvnet" in rules:
        assert names.index("guided_backprop") < names.index("deconvnet")
    s.selection.select("out")
    names = editor.rule_names()
    for name in ("mwp", "lrp_epsilon"):
        if name in rules and rules[name].applies_to(s.graph.node("out")):
            assert names.index(name) < names.index("identity"), names
    if "guided_backprop" in rules:
        assert names.index("guided_backprop") > names.index("zero")  # not for a Dense node: listed last


def test_group_headers_cannot_be_chosen(window, qtbot, wait_idle, model_file):
    s, editor = _open(window, qtbot, wait_idle, model_file)
    s.selection.select("c2")
    combo = editor.rule_combo
    headers = [i for i in range(combo.count()) if combo.itemText(i) not in available_rules()]
    assert headers and all(combo.itemText(i).startswith("—") for i in headers)
    assert all(not combo.model().item(i).flags() & Qt.ItemFlag.ItemIsEnabled for i in headers)
    editor.select_rule(combo.itemText(headers[0]))  # ignored: a header is a label
    assert combo.currentText() == "identity"
    assert [g for g, names in rule_groups(available_rules(), None)] == [None]


def test_a_node_shows_the_rule_the_plan_gives_it(window, qtbot, wait_idle, model_file):
    s, editor = _open(window, qtbot, wait_idle, model_file)
    s.editor.add_rule("type:Conv2D", "scale", {"factor": 2.5})  # by type: no entry names the node itself
    s.editor.add_rule("c1", "zero")
    wait_idle(window)
    s.selection.select("c1:pre")
    assert editor.rule_combo.currentText() == "scale"
    assert float(editor.params.editors["factor"][1].text()) == 2.5
    s.selection.select("c1")
    assert editor.rule_combo.currentText() == "zero"
    s.selection.select("gap")  # no rule: back to the true gradient, not the previous node's choice
    assert editor.rule_combo.currentText() == "identity"
    s.selection.select("c2")
    editor.select_rule("clip")  # the user picks a rule and applies it to this node
    qtbot.mouseClick(editor.apply_node, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: s.jobs.busy is None and s.result is not None and "c2" in s.result.rules, timeout=60_000)
    assert s.editor.rule_for("c2") == "clip" and editor.rule_combo.currentText() == "clip"
    s.selection.select("c1:pre")
    s.selection.select("c2")
    assert editor.rule_combo.currentText() == "clip"
    window.undo_action.trigger()  # the plan no longer gives c2 clip: the editor follows
    assert editor.rule_combo.currentText() == "scale"


def _at(widget, window):
    return widget.mapTo(window, widget.rect().topLeft())


def test_the_buttons_stay_put_whatever_the_rules_description_and_parameters(window, qtbot, wait_idle, model_file):
    """Issue 51: Apply to node, Remove, Undo and Redo moved 14-28 px with the rule's description (a click landed
    on empty space, or on Remove after Undo)."""
    s, editor = _open(window, qtbot, wait_idle, model_file)
    table = window.inspector.plan_table
    s.selection.select("c2")
    rules = available_rules()
    widths = sorted(rules, key=lambda n: len(rules[n].describe()))
    import dataclasses

    fields = {
        n: len(dataclasses.fields(rules[n].Params)) if dataclasses.is_dataclass(rules[n].Params) else 0 for n in rules
    }
    chosen = {widths[0], widths[-1], max(fields, key=fields.get), min(fields, key=fields.get)}
    places = set()
    for name in chosen:
        editor.select_rule(name)
        qtbot.wait(20)  # the layout settles
        places.add(
            tuple(
                (_at(b, window).x(), _at(b, window).y())
                for b in (editor.apply_node, table.remove, table.undo, table.redo)
            )
        )
        assert editor.description.toolTip() == editor.description.text()  # the whole text, when cut
    assert len(places) == 1, places


def test_a_combo_box_takes_the_wheel_only_once_focused(window, qtbot, wait_idle, model_file):
    from PySide6.QtCore import QPoint, QPointF
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication

    _open(window, qtbot, wait_idle, model_file)
    combo = window.inspector.methods.combo
    before = combo.currentIndex()

    def wheel():
        centre = QPointF(combo.rect().center())
        event = QWheelEvent(
            centre,
            QPointF(combo.mapToGlobal(centre.toPoint())),
            QPoint(0, 0),
            QPoint(0, -120),
            Qt.MouseButton.NoButton,
            Qt.KeyboardModifier.NoModifier,
            Qt.ScrollPhase.NoScrollPhase,
            False,
        )
        QApplication.sendEvent(combo, event)

    window.graph_view.setFocus()
    wheel()
    assert combo.currentIndex() == before and not combo.hasFocus()  # scrolled past: nothing chosen
    combo.setFocus()
    qtbot.waitUntil(combo.hasFocus)
    wheel()
    assert combo.currentIndex() != before  # a focused combo turns as ever
