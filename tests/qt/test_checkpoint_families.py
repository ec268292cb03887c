"""Every causal-LM family keras_hub 0.32 converts opens in the window from its Hugging Face folder and explains
its next token by AttnLRP (issue 50): the folder's tokenizer reads the typed words where it has one, the method's
rules land on the model, the token strip shows one finite score per token. Slow (eleven models, 75 s): ``pytest -m
slow``; the Llama folder runs in the default suite (``test_language_panel.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradscope.io.checkpoints import has_tokenizer

pytest.importorskip("keras_hub")
pytest.importorskip("safetensors")

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
FAMILIES = sorted(p.name for p in HF.iterdir() if p.is_dir())


@pytest.mark.slow
def test_every_family_opens_in_the_window_and_explains_by_attnlrp(window, qtbot, wait_idle):
    assert len(FAMILIES) == 11, FAMILIES
    s = window.session
    for family in FAMILIES:
        folder = str(HF / family)
        window.open_path(folder)
        qtbot.waitUntil(lambda f=folder: s.document.path == f and s.graph is not None, timeout=120_000)
        words = has_tokenizer(HF / family)  # Llama 3, Qwen 2, GPT-2 carry one; the others are fed token ids
        if words:
            qtbot.waitUntil(lambda: s.fed.vocab is not None and not s.fed.loading_vocab, timeout=60_000)
        s.fed.set_typed("the cat sat on the mat" if words else "5 17 3 9 12 1 7")
        wait_idle(window)
        assert s.editor.apply_method("attnlrp"), family
        wait_idle(window)
        qtbot.waitUntil(lambda: s.result is not None and bool(s.result.rules), timeout=60_000)
        fed = s.fed.fed
        assert fed is not None and fed.kind == "tokens" and len(fed.ids) >= 6, family
        assert not words or "cat" in "".join(fed.tokens), family
        scores = s.overlay().saliency
        assert scores.shape == (len(fed.ids),) and np.isfinite(scores).all() and np.abs(scores).max() > 0, family
        assert "attention_lrp" in set(s.result.rules.values()), (family, set(s.result.rules.values()))
        panel = window.overlay.positions_panel
        assert panel.isVisible() and panel.finder.isVisible() and len(panel.finder._labels) == len(fed.ids)
