"""TrainingWatch (the Training view's model) without Qt: open a log, follow it as it grows, select a cell, find
the checkpoint saved before a step; a folder without a log is one clear error."""

from __future__ import annotations

import pytest

from gradscope.app.models.jobs import Jobs
from gradscope.app.models.training_watch import TrainingWatch
from gradscope.app.work.worker import InlineExecutor
from tests.app.models.test_models import Told, events_of
from tests.engine.training.test_monitor import _demo


@pytest.fixture(scope="module")
def blowup_log(tmp_path_factory):
    folder = tmp_path_factory.mktemp("blowup")
    _demo("blowup", folder, epochs=1, images=256, every=2)
    return folder


def watch_of() -> tuple[TrainingWatch, Told]:
    told = Told()
    return TrainingWatch(Jobs(InlineExecutor(), told.feedback), told.feedback), told


def test_open_select_and_checkpoint(blowup_log):
    watch, told = watch_of()
    changed = events_of(watch.changed)
    watch.open(blowup_log)
    assert len(changed) == 1 and watch.log.records
    assert watch.alerts[0].kind == "nonfinite"
    assert f"first NaN/Inf at step {watch.alerts[0].first_step}" in told.said[-1]
    assert (watch.step, watch.node) == (watch.alerts[0].first_step, watch.alerts[0].node)  # opened at the alert
    selected = events_of(watch.selected)
    node = watch.log.nodes[0].id
    watch.select(0, node)
    assert selected == [(0, node)]
    assert [r.node for r in watch.flow.rows] == [n.id for n in watch.log.nodes]
    assert watch.histogram is not None and watch.histogram[:, 2].sum() > 0  # histograms at step 0
    watch.select(2)  # the node stays; step 2 is not a histogram step (every 10th record)
    assert watch.node == node and watch.histogram is None

    checkpoints = watch.checkpoints()
    assert checkpoints and all(c.path.endswith(".keras") for c in checkpoints)
    last = watch.log.steps[-1]
    found = watch.checkpoint_for(last)
    assert found is not None and found.after_step < last
    assert [c.after_step for c in checkpoints] == [1, 3, 5, 7]  # saved every 2 steps (batch 2, 4, ...)
    assert watch.checkpoint_for(0) is None  # nothing was saved before the first step ran
    assert watch.checkpoint_for(6).after_step == 5
    assert watch.checkpoint_for(12345) is None  # not a recorded step


def test_refresh_reads_only_what_was_appended(blowup_log, tmp_path):
    (events,) = blowup_log.glob("events.out.tfevents.*")
    data = events.read_bytes()
    growing = tmp_path / events.name
    growing.write_bytes(data[: len(data) // 2])
    watch, _ = watch_of()
    watch.open(tmp_path)
    before = len(watch.log.records)
    changed = events_of(watch.changed)
    watch.refresh()
    assert changed == []  # nothing new: no event
    with growing.open("ab") as f:
        f.write(data[len(data) // 2 :])
    watch.refresh()
    assert len(changed) == 1 and len(watch.log.records) > before


def test_a_folder_without_a_log_is_one_clear_error(tmp_path):
    watch, told = watch_of()
    watch.open(tmp_path)
    assert watch.log is None
    assert told.errors and "no gradscope training log yet" in str(told.errors[-1])
    watch.open(tmp_path / "missing")
    assert "is not a folder" in str(told.errors[-1])
