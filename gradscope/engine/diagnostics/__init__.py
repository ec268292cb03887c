"""Diagnostics: where gradients stop and which op cuts the path (``paths``), per-layer gradient flow and its flags
(``flow``), sanity checks of a rule or plan (``sanity``). May import engine.backward; no other engine package."""

from gradscope.engine.diagnostics.flow import (
    FlowReport,
    FlowRow,
    FlowThresholds,
    WeightFlow,
    dead_unit_fraction,
    gradient_flow,
)
from gradscope.engine.diagnostics.paths import CUT_KINDS, Cut, DiagnosisReport, VariableDiagnosis, diagnose_model

__all__ = [
    "CUT_KINDS",
    "Cut",
    "DiagnosisReport",
    "FlowReport",
    "FlowRow",
    "FlowThresholds",
    "VariableDiagnosis",
    "WeightFlow",
    "dead_unit_fraction",
    "diagnose_model",
    "gradient_flow",
]
