"""Activation and attribution patching (RULES_SPEC §10): how a metric moves when one node's value at one position
(a token, or a grid cell of an image) is replaced by its value on a corrupted input, measured exactly (one forward
per patch, batched, reusing what lies below the node) or estimated from one backward pass (AtP, AtP*)."""

from gradscope.engine.patching.components import COMPONENTS, blocks, component_nodes
from gradscope.engine.patching.metric import METRICS, Metric
from gradscope.engine.patching.run import patch_effects

__all__ = ["COMPONENTS", "METRICS", "Metric", "blocks", "component_nodes", "patch_effects"]
