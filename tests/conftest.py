"""Shared test setup: quiet TensorFlow, offscreen Qt, seeded randomness."""

import os
import threading
import time

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(autouse=True)
def no_thread_left_running():
    """Fail the test that leaves a thread running: a worker left alive beside the next test's worker ran
    TensorFlow from two threads and crashed the suite (segfault). Threads get a few seconds to finish."""
    before = set(threading.enumerate())
    yield
    new = [t for t in threading.enumerate() if t not in before]
    deadline = time.monotonic() + 5.0
    for t in new:
        t.join(max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in new if t.is_alive()]
    if alive:
        pytest.fail(f"the test left {len(alive)} thread(s) running: {', '.join(alive)} (shut its executor down)")


@pytest.fixture(autouse=True)
def nothing_left_frozen():
    """The app freezes a loaded model out of full collections (gradscope.app.work.heap); in one test process of
    hundreds of models that would keep every one of them: each test's frozen objects are released after it."""
    import gc

    yield
    gc.unfreeze()
