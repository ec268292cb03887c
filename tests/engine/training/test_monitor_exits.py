"""GradientMonitor lets go on every exit (issue 35): an exception or Ctrl-C mid-fit, a log write that fails (a
full disk: the file-size limit stands in for it), a second monitor in one fit; and its logs do not mislead: two
runs in one folder, damaged records, a model with no trainable weights, NaN weights before the first step."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gradscope.backend import keras
from gradscope.cli import main
from gradscope.core.errors import GradscopeError
from gradscope.engine.training.event_log import MonitorWarning
from gradscope.engine.training.monitor import GradientMonitor
from gradscope.engine.training.report import report_text, training_alerts
from gradscope.io.training_events import masked_crc, read_training_log
from tests.engine.training.test_monitor import compiled
from tests.engine.training.test_plan_model import batch, mlp

ROOT = Path(__file__).resolve().parents[3]


class Interrupt(keras.callbacks.Callback):
    """Ctrl-C after ``at`` steps, as the user's key press arrives in fit's loop."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.at:
            raise KeyboardInterrupt


def _events_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("events.out.tfevents.*"))


def test_after_ctrl_c_a_plain_fit_runs_keras_own_step_and_writes_nothing(tmp_path):
    x, y = batch()
    model = compiled(mlp())
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, epochs=2, batch_size=4, verbose=0, callbacks=[GradientMonitor(tmp_path, every=1), Interrupt(2)])
    assert getattr(model.train_function, "gradscope_monitor", None) is not None  # Keras skipped on_train_end
    model.fit(x, y, epochs=2, batch_size=4, verbose=0)
    assert getattr(model.train_function, "gradscope_monitor", None) is None  # the plain fit put Keras' step back
    size = _events_size(tmp_path)  # the interrupted run's records, flushed when the monitor let go
    model.fit(x, y, epochs=2, batch_size=4, verbose=0)
    assert _events_size(tmp_path) == size and int(model.optimizer.iterations) == 10
    assert read_training_log(tmp_path).steps == [0, 1]


def test_the_same_monitor_after_an_exception_monitors_its_next_fit(tmp_path):
    x, y = batch()
    model = compiled(mlp())
    monitor = GradientMonitor(tmp_path, every=1)
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, epochs=1, batch_size=4, verbose=0, callbacks=[monitor, Interrupt(1)])
    model.fit(x, y, epochs=1, batch_size=4, verbose=0, callbacks=[monitor])
    assert read_training_log(tmp_path).steps == [0, 1, 2]  # continued: 1 step, then 2 (8 samples / 4)
    assert getattr(model.train_function, "gradscope_monitor", None) is None


def test_two_monitors_in_one_fit_are_refused_and_neither_stays(tmp_path):
    x, y = batch()
    model = compiled(mlp())
    with pytest.raises(GradscopeError, match="Two GradientMonitors in one fit"):
        model.fit(
            x, y, epochs=1, verbose=0, callbacks=[GradientMonitor(tmp_path / "a"), GradientMonitor(tmp_path / "b")]
        )
    assert getattr(model.train_function, "gradscope_monitor", None) is None
    model.fit(x, y, epochs=1, verbose=0)  # plain fit afterwards: Keras' own step
    assert int(model.optimizer.iterations) == 1


def test_a_model_without_trainable_weights_says_there_is_nothing_to_record(tmp_path, capsys):
    model = compiled(mlp())
    model.trainable = False
    model.compile(optimizer="sgd", loss="mse")
    x, y = batch()
    with pytest.warns(MonitorWarning, match="no trainable weights"):
        model.fit(x, y, epochs=2, verbose=0, callbacks=[GradientMonitor(tmp_path)])
    log = read_training_log(tmp_path)
    assert log.records == [] and "no trainable weights" in log.failure
    assert main(["train-report", str(tmp_path)]) == 2
    assert "Nothing recorded: the model has no trainable weights" in capsys.readouterr().out


def test_a_full_disk_stops_recording_with_one_warning_and_fit_goes_on(tmp_path):
    """RLIMIT_FSIZE makes every write past the limit fail (EFBIG), as a full disk fails them (ENOSPC). Before,
    the step's flush failed inside fit: Keras took the error for the end of the data and silently trained one
    step an epoch (or `Could not flush events file` killed it); every later plain fit failed the same way."""
    script = textwrap.dedent(
        f"""
        import resource, signal, warnings
        import numpy as np
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        from gradscope.backend import keras
        from gradscope.engine.training.monitor import GradientMonitor
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
        m.compile("sgd", "mse")
        x, y = np.random.rand(256, 8).astype("float32"), np.random.rand(256, 3).astype("float32")
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
        monitor = GradientMonitor({str(tmp_path / "log")!r}, every=1)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            m.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[monitor])
        said = [str(w.message) for w in seen if "GradientMonitor" in str(w.message)]
        print("WARNINGS", len(said), said[0].replace(chr(10), " ") if said else "")
        print("STEPS", int(m.optimizer.iterations))
        m.fit(x, y, batch_size=8, epochs=1, verbose=0)
        print("PLAIN", int(m.optimizer.iterations))
        """
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert lines["STEPS"] == "96" and lines["PLAIN"] == "128"  # every step trained, then the plain fit too
    assert lines["WARNINGS"].startswith("1 ") and "recording stopped, training goes on" in lines["WARNINGS"]
    log = read_training_log(tmp_path / "log")
    assert 0 < len(log.steps) < 96 and log.steps == list(range(len(log.steps)))  # what was written stays readable


def test_two_runs_in_one_folder_are_kept_apart_and_named(tmp_path, capsys):
    x, y = batch()
    for seed in (1, 2):
        keras.utils.set_random_seed(seed)
        compiled(mlp()).fit(x, y, epochs=3, batch_size=4, verbose=0, callbacks=[GradientMonitor(tmp_path, every=1)])
    log = read_training_log(tmp_path)
    assert len(log.runs) == 2 and log.run_id == log.runs[-1].id and [r.records for r in log.runs] == [6, 6]
    text = report_text(log, training_alerts(log))
    assert "This folder holds 2 runs" in text and f"Showing run {log.run_id}, the latest" in text
    first = log.runs[0].id
    assert read_training_log(tmp_path, run=first[:6]).run_id == first
    assert main(["train-report", str(tmp_path), "--run", "nope"]) == 2
    assert "No run 'nope'" in capsys.readouterr().err


def _event_file(folder: Path) -> Path:
    (path,) = folder.glob("events.out.tfevents.*")
    return path


def _record_offsets(data: bytes) -> list[int]:
    offsets, pos = [], 0
    while pos + 12 <= len(data):
        offsets.append(pos)
        pos += 12 + struct.unpack_from("<Q", data, pos)[0] + 4
    return offsets


def test_damaged_records_are_named_and_skipped_never_read_as_data(tmp_path, capsys):
    x, y = batch()
    compiled(mlp()).fit(x, y, epochs=3, batch_size=4, verbose=0, callbacks=[GradientMonitor(tmp_path, every=1)])
    path = _event_file(tmp_path)
    data = bytearray(path.read_bytes())
    clean = read_training_log(tmp_path)
    # a record of a step's matrix changed without its checksum: it used to be read as a NaN alert (exit 1)
    target = next(o for o in _record_offsets(bytes(data)) if b"gradscope/loss" in data[o : o + 200])
    length = struct.unpack_from("<Q", data, target)[0]
    body = target + 12
    data[body + length - 3] ^= 0xFF
    path.write_bytes(bytes(data))
    log = read_training_log(tmp_path)
    assert len(log.problems) == 1 and "fails its checksum" in log.problems[0]
    assert all(r.finite for r in log.records) and len(log.records) == len(clean.records) - 1
    assert main(["train-report", str(tmp_path)]) == 0
    assert "fails its checksum; skipped" in capsys.readouterr().out
    # a flipped byte in a length: the rest of the file cannot be found, and says so
    data[target + 3] ^= 0x01
    path.write_bytes(bytes(data))
    log = read_training_log(tmp_path)
    assert any("damaged length" in p for p in log.problems) and len(log.records) < len(clean.records)
    assert masked_crc(b"") == 0xA282EAD8  # TFRecord's mask on the CRC32C of nothing (0)


def test_nan_weights_before_the_first_step_are_not_blamed_on_an_update(tmp_path):
    x, y = batch()
    model = compiled(mlp())
    bias = model.get_layer("h1").bias
    # Inf, not NaN: oneDNN's fused ReLU (on CPUs where TensorFlow enables it) turns a NaN into 0
    bias.assign(np.where(np.arange(bias.shape[0]) == 1, np.inf, bias.numpy()).astype("float32"))
    model.fit(x, y, epochs=1, batch_size=8, verbose=0, callbacks=[GradientMonitor(tmp_path, every=1)])
    (alert,) = [a for a in training_alerts(read_training_log(tmp_path)) if a.kind == "nonfinite"]
    assert alert.first_step == 0 and "before training began" in alert.detail and "step before" not in alert.detail


def test_a_step_that_was_not_recorded_is_one_line(tmp_path, capsys):
    x, y = batch()
    compiled(mlp()).fit(x, y, epochs=3, batch_size=4, verbose=0, callbacks=[GradientMonitor(tmp_path, every=2)])
    for step in ("99999", "-1", "1"):
        assert main(["train-report", str(tmp_path), "--step", step]) == 2
        err = capsys.readouterr().err
        assert f"Step {step} was not recorded" in err and "recorded steps: 0, 2, 4" in err


def test_every_is_named_when_it_is_not_a_count():
    for bad in (float("nan"), float("inf"), 2.5, "10", None, True):
        with pytest.raises(GradscopeError, match="every must be a whole number"):
            GradientMonitor("unused", every=bad)
    with pytest.raises(GradscopeError, match="histograms must be"):
        GradientMonitor("unused", histograms=-1)


def test_every_past_what_the_step_counter_holds_is_refused_at_once():
    with pytest.raises(GradscopeError, match="every must be at most"):
        GradientMonitor("unused", every=2**63)


def test_a_log_folder_that_exists_but_cannot_be_written_is_one_line(tmp_path):
    """/proc/driver exists and refuses new files even to root (a chmod would not stop root)."""
    if not Path("/proc/driver").is_dir():
        pytest.skip("no read-only folder to try (not Linux)")
    x, y = batch()
    with pytest.raises(GradscopeError, match="Cannot write the log in /proc/driver"):
        compiled(mlp()).fit(x, y, epochs=1, verbose=0, callbacks=[GradientMonitor("/proc/driver")])


def _interrupted_fit(tmp_path: Path, in_step: bool) -> None:
    """A monitored fit (every step recorded) stopped by Ctrl-C at its 7th step: inside the train step (where a
    key press lands in a real fit: the step is where the time goes) or in a callback after the 6th."""
    x, y = batch()
    monitor = GradientMonitor(tmp_path, every=1)

    class CtrlC(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 6 and in_step:

                def interrupted(iterator):
                    raise KeyboardInterrupt

                monitor._train_function = interrupted

        def on_train_batch_end(self, batch, logs=None):
            if batch == 5 and not in_step:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        compiled(mlp()).fit(x, y, epochs=2, batch_size=1, verbose=0, callbacks=[monitor, CtrlC()])


def test_the_records_of_a_fit_interrupted_in_its_step_are_on_disk_when_fit_raises(tmp_path, capsys):
    _interrupted_fit(tmp_path, in_step=True)
    assert read_training_log(tmp_path).steps == [0, 1, 2, 3, 4, 5]  # no later fit, no exit of the process
    assert main(["train-report", str(tmp_path)]) == 0
    assert "6 records (every 1 steps), steps 0..5" in capsys.readouterr().out


def test_the_records_of_a_fit_interrupted_elsewhere_reach_the_disk_within_a_second(tmp_path):
    """Ctrl-C outside the step (in a callback): no step follows, the timer writes them; the wait is bounded."""
    import time

    started = time.monotonic()
    _interrupted_fit(tmp_path, in_step=False)
    while read_training_log(tmp_path).steps != [0, 1, 2, 3, 4, 5] and time.monotonic() - started < 10:
        time.sleep(0.05)
    assert read_training_log(tmp_path).steps == [0, 1, 2, 3, 4, 5]
