"""The Qt-free high-level API, one module per front-door function (``import gradscope as gs`` names them all):
open a model, explain an input or a generation, check and evaluate methods, draw the graph.

Everything the CLI does goes through here, and the GUI's worker uses the same pieces.
"""

from gradscope.api.evaluation import evaluate, sanity
from gradscope.api.explanation import Explanation, explain
from gradscope.api.generation import GenerationExplanation, explain_generation
from gradscope.api.graph_picture import GraphPicture, graph
from gradscope.api.inputs import model_input, open_engine, resolve_method
from gradscope.core.targets import Target  # what the functions take, importable from here as from gradscope
from gradscope.rules.plan import Plan

__all__ = [
    "Explanation",
    "GenerationExplanation",
    "GraphPicture",
    "Plan",
    "Target",
    "evaluate",
    "explain",
    "explain_generation",
    "graph",
    "model_input",
    "open_engine",
    "resolve_method",
    "sanity",
]
