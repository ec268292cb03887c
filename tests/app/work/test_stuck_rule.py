"""A rule that never returns does not wedge the app: Cancel interrupts it, or abandons it. An abandoned rule
keeps the one TensorFlow thread (no second thread ever runs TensorFlow beside it: that crashed the process);
computations are refused with a clear message until it returns, and then work again."""

from __future__ import annotations

import threading
import time

import numpy as np

from gradscope.app.session import Session
from gradscope.app.work.worker import ThreadExecutor
from gradscope.rules.base import Rule, register_rule
from gradscope.rules.plan import Plan
from tests.engine.fixtures import tiny_cnn

started = threading.Event()
never = threading.Event()  # never set: waiting on it blocks in C, where no exception can reach


@register_rule("_loops_forever", replace=True)
class LoopsForever(Rule):
    def backward(self, ctx, grad_outputs):
        started.set()
        while True:
            pass


@register_rule("_blocks_forever", replace=True)
class BlocksForever(Rule):
    def backward(self, ctx, grad_outputs):
        started.set()
        never.wait()
        return list(grad_outputs)


def _session():
    s = Session(ThreadExecutor())
    s.set_model(tiny_cnn())
    assert s.jobs.executor.wait_idle(120)
    s.fed.set_image(np.full((12, 12, 3), 90, np.uint8))
    assert s.jobs.executor.wait_idle(120) and s.result is not None
    messages: list[str] = []
    s.feedback.status_changed.connect(messages.append)
    return s, messages


def _stuck(s, rule):
    started.clear()
    s.editor.add_rule("c1", rule)
    assert started.wait(60)  # the rule is running on the worker
    time.sleep(0.1)


def _still_works(s):
    s.editor.set_plan(Plan().with_entry("c1", "scale", {"factor": 2.0}))
    assert s.jobs.executor.wait_idle(120)
    assert s.result is not None and s.result.rules == {"c1": "scale"} and s.jobs.busy is None


def test_a_rule_looping_in_python_is_interrupted():
    s, messages = _session()
    try:
        _stuck(s, "_loops_forever")
        s.cancel(grace=10.0)
        assert s.jobs.executor.abandoned == 0 and s.jobs.busy is None
        assert "left behind" not in messages[-1]
        _still_works(s)
    finally:
        s.jobs.executor.shutdown()


def _worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gradscope-worker" and t.is_alive()]


def test_a_rule_blocked_in_c_is_abandoned_and_no_second_thread_runs_tensorflow():
    s, messages = _session()
    errors: list[str] = []
    s.feedback.error_raised.connect(lambda *a: errors.append(" ".join(str(x) for x in a)))
    try:
        engine = s.document.engine
        threads = _worker_threads()
        _stuck(s, "_blocks_forever")
        t0 = time.monotonic()
        s.cancel(grace=0.5)
        assert time.monotonic() - t0 < 5
        assert s.jobs.executor.abandoned == 1 and "restart gradscope" in messages[-1] and s.jobs.busy is None
        assert _worker_threads() == threads  # the same single thread, still inside the rule

        s.editor.set_plan(Plan().with_entry("c1", "scale", {"factor": 3.0}))  # refused at once, with the reason
        assert s.jobs.executor.wait_idle(10)
        assert errors and "did not stop" in errors[-1] and s.jobs.busy is None

        never.set()  # the rule returns: the same thread carries on, and the user is told
        assert s.jobs.executor.wait_running(30)
        s.jobs.executor.wait_idle(10)
        assert "computes again" in messages[-1]
        _still_works(s)
        assert s.document.engine is engine and _worker_threads() == threads
    finally:
        never.set()
        s.jobs.executor.shutdown(timeout=10)
        never.clear()


def test_a_rule_file_that_loops_at_import_is_loaded_off_the_gui_thread_and_cancelled(tmp_path):
    """File > Load rule file with a top-level ``while True``: the caller returns at once (the window stays
    responsive), the worker shows it busy, and Cancel interrupts the import; the rules work afterwards."""
    s, messages = _session()
    errors: list[str] = []
    s.feedback.error_raised.connect(lambda *a: errors.append(" ".join(str(x) for x in a)))
    loops = tmp_path / "loops.py"
    loops.write_text("import threading\nthreading.Event()  # imported\nwhile True:\n    pass\n")
    try:
        t0 = time.monotonic()
        s.catalog.load_file(loops)
        assert time.monotonic() - t0 < 1.0  # nothing of the file ran on the caller's thread
        deadline = time.monotonic() + 30
        while s.jobs.busy is None or "loops.py" not in s.jobs.busy:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.2)  # inside the loop now
        s.cancel(grace=10.0)
        assert s.jobs.executor.abandoned == 0 and s.jobs.busy is None and not errors
        _still_works(s)
    finally:
        s.jobs.executor.shutdown()
