"""Qt-free TensorFlow work, by capability. ``backward``: running a model node by node and its backward pass under
a plan (the live path and the whole-plan path); ``diagnostics``: where gradients stop and how they flow;
``training``: the monitor of ``fit`` and its report; ``evaluation``: maps of many images and their scores.
``backward`` imports no other engine package; diagnostics builds on it; training and evaluation build on both
and never import each other (import-linter contracts in pyproject.toml)."""
