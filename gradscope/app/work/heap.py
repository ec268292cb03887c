"""Python's garbage collector around a loaded model.

A full (generation 2) collection walks every container object in the process: with TensorFlow and ResNet50
loaded, ~360k of them, 0.18 s on this 2-core machine, and the allocations of a first map made one happen in
the middle of it (measured: ``benchmarks/bench_engine.py --latency``, first result 0.70-0.80 s with it,
0.53-0.57 s without). Once a model is loaded its objects live as long as it is open, so they are moved to
the permanent generation (``gc.freeze``: microseconds); later collections walk only what was made since.
A replaced model's objects are frozen too: ``release_replaced`` unfreezes, collects and freezes again once
the new model's first map is shown. It runs on the GUI thread: a full collection finalises any garbage, Qt
objects included, and one on the worker hung against Qt painting (seen in a GUI test: the worker in
``gc.collect``, the GUI thread inside Qt calling a graphics item's ``boundingRect``, neither moving on).
``freeze`` runs no finalisers and is safe anywhere. (The Qt-free API leaves the user's collector alone.)
"""

from __future__ import annotations

import gc


def settle_after_load() -> None:
    """Exclude everything alive now (the just-loaded model) from later full collections."""
    gc.freeze()


def release_replaced() -> None:
    """Let the collector free a replaced model (its objects were frozen with it), then settle again. On the
    thread that owns the Qt objects (the GUI's), never the worker."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
