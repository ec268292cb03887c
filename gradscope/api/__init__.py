"""The Qt-free high-level API, one module per front-door function (``import gradscope as gs`` names them all):
open a model, explain an input or a generation, check and evaluate methods, patch activations, draw the graph.

Everything the CLI does goes through here, and the GUI's worker uses the same pieces.
"""

from gradscope.api.evaluation import evaluate, sanity
from gradscope.api.explanation import Explanation, explain
from gradscope.api.generation import GenerationExplanation, explain_generation
from gradscope.api.graph_picture import GraphPicture, graph
from gradscope.api.inputs import model_input, open_engine, resolve_method
from gradscope.api.patching import patch

# What the functions take and give, importable from here as they were from the single module this package was.
from gradscope.core.results import BackwardResult
from gradscope.core.targets import Target
from gradscope.io.model_inputs import ModelInput
from gradscope.rules.methods import Method, build_method
from gradscope.rules.plan import Plan

__all__ = [
    "BackwardResult",
    "Explanation",
    "GenerationExplanation",
    "GraphPicture",
    "Method",
    "ModelInput",
    "Plan",
    "Target",
    "build_method",
    "evaluate",
    "explain",
    "explain_generation",
    "graph",
    "model_input",
    "open_engine",
    "patch",
    "resolve_method",
    "sanity",
]
