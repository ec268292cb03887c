"""The application layer, Qt-free: the Session (what one window shows), its jobs on the worker thread, undo
history, session files and the one export pipeline every front end (GUI, CLI, API) writes pictures with.

It sits above the engine and below the front ends: ``core <- backend <- rules, io, render <- engine <- app <-
cli, qt, api`` (enforced by import-linter contracts in pyproject.toml, run by tests/test_boundaries.py).
"""
