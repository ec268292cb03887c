"""Gradient diagnostics, one import away: path diagnostics (``gradscope.engine.paths``: where gradients stop
and which op cuts the path) and gradient flow (``gradscope.engine.flow``: per-layer statistics and flags)."""

from gradscope.engine.flow import FlowReport, FlowRow, FlowThresholds, WeightFlow, dead_unit_fraction, gradient_flow
from gradscope.engine.paths import CUT_KINDS, Cut, DiagnosisReport, VariableDiagnosis, diagnose_model

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
