"""The application layer, Qt-free: the Session (``app.session``: what one window shows) composes the evented models
(``app.models``), which call the pipelines: rendering (``app.rendering``), files (``app.files``: the one export
pipeline every front end writes pictures with, session files), dataset evaluation (``app.evaluation``) and the
one worker thread (``app.work``).

It sits above the engine and below the front ends: ``core <- backend <- rules, io, render <- engine <- app <-
cli, qt, api``; inside it ``session <- models <- files, evaluation, work <- rendering`` (import-linter contracts in
pyproject.toml, run by tests/test_boundaries.py).
"""
