"""The rules a plan can use, as a small evented model: the built-in ones (imported on the worker, since they
import TensorFlow) and those the user loads from a rule file or from installed plugins (code: only on the
user's explicit choice).

Owns: ``ready`` (the built-in rules are imported).
Emits: ``changed(names of newly loaded rules)`` (``[]`` when the built-in ones became available).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradscope.app.models.feedback import Feedback
from gradscope.app.models.jobs import Jobs
from gradscope.core.events import Signal


class RuleCatalog:
    def __init__(self, jobs: Jobs, feedback: Feedback) -> None:
        self._jobs = jobs
        self._feedback = feedback
        self.ready = False
        self.changed = Signal("rules_changed")  # (names of newly loaded rules)

    def start(self) -> None:
        """Import TensorFlow and the built-in rules on the worker, so the window shows at once; the rule lists
        fill in (``changed``) when it is done. Jobs submitted meanwhile queue behind it."""
        if self.ready:
            return

        def warm_up(token: Any) -> list[str]:
            token.report("Starting TensorFlow...")
            import gradscope.engine.backward.runner  # noqa: F401
            from gradscope.rules.base import available_rules

            return list(available_rules())

        self._jobs.submit("warmup", "Starting TensorFlow...", warm_up, lambda names: self.mark_ready())

    def mark_ready(self) -> None:
        """The built-in rules are imported (by the warm-up, or by a model load on the worker)."""
        if not self.ready:
            self.ready = True
            self.changed.emit([])

    def load_file(self, path: str | Path) -> None:
        """Import a user's rule file (it is code: only files the user chose) on the worker: its top-level code
        may loop or wait, and the window must stay responsive and its Cancel must stop it. ``changed`` says
        which rules it added."""
        from gradscope.rules.base import load_rule_file

        name = Path(path).name
        self._load("rule_file", f"Loading rules from {name}…", lambda token: load_rule_file(path), f"from {name}")

    def load_plugins(self) -> None:
        """Import the rule plugins installed packages offer (the user's explicit choice), on the worker."""
        from gradscope.rules.base import load_rule_plugins

        self._load("rule_plugins", "Loading rule plugins…", lambda token: load_rule_plugins(), "from the plugins")

    def _load(self, kind: str, label: str, load: Any, where: str) -> None:
        def done(names: list[str]) -> None:
            self.changed.emit(names)
            self._feedback.say(f"Loaded rule(s) {', '.join(names) or '(none new)'} {where}")

        self._jobs.submit(kind, label, load, done)
