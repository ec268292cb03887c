"""gradscope: a visual debugger for gradients of Keras 3 models (TensorFlow backend).

Importing this package is cheap (no TensorFlow). The engine loads on first use::

    import gradscope as gs

    model = gs.load_model("model.keras")
    result = gs.explain(model, "cat.png", method="guided_backprop")
    result.save("overlay.png")
"""

from __future__ import annotations

from typing import Any

from gradscope.core.errors import GradscopeError
from gradscope.core.graph import LayerGraph, NodeSpec
from gradscope.core.results import BackwardResult, NodeStats
from gradscope.core.targets import Target
from gradscope.rules.base import Rule, available_rules, load_rule_file, register_rule, register_value
from gradscope.rules.plan import Plan, PlanEntry

__version__ = "0.1.0"

_LAZY = {
    "Engine": "gradscope.engine.backward.runner",
    "load_model": "gradscope.io.models",
    "explain": "gradscope.api",
    "Explanation": "gradscope.api",
    "open_engine": "gradscope.api",
    "read_sidecar": "gradscope.app.files.exports",
    "build_method": "gradscope.rules.methods",
    "available_methods": "gradscope.rules.methods",
    "plan_model": "gradscope.engine.training.plan_model",
    "gradient_flow": "gradscope.engine.diagnostics.flow",
    "GradientMonitor": "gradscope.engine.training.monitor",
    "evaluate": "gradscope.api",
    "sanity": "gradscope.api",
    "explain_generation": "gradscope.api",
    "graph": "gradscope.api",
    "patch": "gradscope.api",
    "PatchResult": "gradscope.core.patching",
    "read_training_log": "gradscope.io.training_events",
    "training_alerts": "gradscope.engine.training.report",
    "step_flow": "gradscope.engine.training.report",
}

__all__ = [
    "BackwardResult",
    "GradscopeError",
    "LayerGraph",
    "NodeSpec",
    "NodeStats",
    "Plan",
    "PlanEntry",
    "Rule",
    "Target",
    "available_rules",
    "load_rule_file",
    "register_rule",
    "register_value",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gradscope' has no attribute {name!r}")


def _early_in_a_kernel() -> None:
    """In a Jupyter kernel, TensorFlow now, quietly: the kernel shows what C++ writes to fd 2 as red blocks under
    the cell, and the notebook's next ``import keras`` would load TensorFlow loudly (absl's start-up lines ignore
    TF_CPP_MIN_LOG_LEVEL). A notebook loads it on its first call anyway; scripts keep ``import gradscope`` cheap.
    Where TensorFlow was imported before gradscope, its lines were already written."""
    import sys

    if "ipykernel" in sys.modules and "tensorflow" not in sys.modules:
        import contextlib

        with contextlib.suppress(GradscopeError):  # no TensorFlow, or one of the wrong version: said on first use
            import gradscope.backend  # noqa: F401 - imported for its quiet start-up


_early_in_a_kernel()
