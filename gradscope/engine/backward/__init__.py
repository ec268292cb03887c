"""The backward pass under a plan: the Keras graph walk, node calls (lowered where plain), kernels, the live
sweep, the whole-plan runner (``Engine``), rule contexts, statistics, canonizers, loss targets and the methods
built from several passes. May import core, backend, rules, render; no other engine package."""
