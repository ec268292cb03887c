"""The Patching model in a Session with an inline worker (no Qt): the corrupted input refused or taken, a run's
result, a cell as a plan entry whose run reads the corrupted input (the patched output is the corrupted one's where
the cell is the whole last position), the plan's effect in words, and a stale result dropped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradscope.app.patching.model import plan_effect, with_cell
from gradscope.app.session import Session
from gradscope.app.work.worker import InlineExecutor
from gradscope.io.demo import demo_image_paths, demo_model_path
from gradscope.rules.plan import Plan, PlanEntry
from tests.app.models.test_models import Told, events_of

pytest.importorskip("keras_hub")

HF = Path(__file__).resolve().parents[1] / "data" / "hf"


@pytest.fixture
def session():
    s = Session(InlineExecutor())
    s.open_model(HF / "llama")
    s.fed.set_typed("5 9 12 30 44 7 21 3")
    return s


def test_a_corrupted_input_is_checked_and_patched_against_the_shown_one(session):
    s = session
    told = Told()
    s.patching._feedback = told.feedback
    finished = events_of(s.patching.finished)
    assert not s.patching.set_typed("5 9 12")  # refused at once: 3 tokens against the 8 shown
    assert "has 3 tokens, the input shown 8" in told.errors[0][1] and s.patching.typed is None
    assert s.patching.set_typed("5 9 12 31 44 7 21 3")
    s.patching.run(method="exact", components=("resid", "attn"))
    result = s.patching.result
    assert finished == [(result,)] and result.by_component["resid"].shape == (2, 8)
    assert not result.by_component["resid"][:, :3].any()

    entry = s.patching.cell_entry("resid", 1, 7)
    assert entry == PlanEntry(result.nodes["resid"][1], "patch_value", {"source": "input", "positions": [7]})
    assert s.patching.cell_entry("q", 0, 3) is None  # inside an attention layer: not a plan entry
    s.editor.set_plan(with_cell(s.plan, entry))  # the run reads the corrupted input (Session passes it)
    token = result.sidecar["index"]
    assert s.result.logits[0, -1, token] == pytest.approx(result.corrupt_value, abs=1e-5)
    words = plan_effect(s.result, s.baseline, None)
    assert f"logit of {token} {result.corrupt_value:.4g}" in words and f"without: {result.clean_value:.4g}" in words
    again = with_cell(s.plan, s.patching.cell_entry("attn", 0, 4))  # one cell at a time
    assert [e.rule for e in again.entries] == ["patch_value"] and again.entries[0].select == result.nodes["attn"][0]

    s.fed.set_typed("5 9 12 30 44 7 21 4")  # another clean input: the result shown no longer holds
    assert s.patching.result is None and finished[-1] == (None,)


def test_an_image_as_the_corrupted_input():
    s = Session(InlineExecutor())
    s.open_model(demo_model_path())
    images = demo_image_paths()
    s.fed.open(images[0])
    assert s.patching.open(images[1])
    batch = s.patching.batch_for(s.graph)
    assert batch.shape == np.asarray(s.inputs).shape and not np.array_equal(batch, s.inputs)
    s.patching.run(method="atp", nodes=["conv2"], grid=2)
    assert s.patching.result.effects.shape == (1, 4)
    entry = s.patching.cell_entry("nodes", 0, 3)
    shape = s.graph.node("conv2").output_shape
    assert entry.params["region"] == [round(shape[1] / 2), round(shape[2] / 2), shape[1], shape[2]]
    assert with_cell(Plan(), entry).entries == (entry,)
