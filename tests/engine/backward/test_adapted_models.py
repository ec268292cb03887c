"""Language models as users adapt them (issue 50): quantized to int8 (``model.quantize``) and with LoRA adapters
(``backbone.enable_lora``). The identity plan is the tape's gradient on the adapted model itself; AttnLRP on a
LoRA model equals AttnLRP on the same model with the adapters merged into its kernels (LoRA changes a linear
layer's weights, never its rule); the training monitor on a LoRA fine-tune records the adapters, the only weights
that train."""

from __future__ import annotations

import numpy as np
import pytest

import gradscope.api as gs
from gradscope.core.targets import Target
from tests.engine.backward.language_models import feed, tape_embedding_gradient, tiny_causal_lm

keras_hub = pytest.importorskip("keras_hub")

IDS = np.array([3, 9, 4, 17, 5, 11])
TOKEN = 7


def _identity_gradient(engine) -> np.ndarray:
    node = engine.graph.embedding_of(engine.graph.token_input).id
    arrays = list(gs.model_input(engine, IDS).arrays)
    return engine.backward(arrays, Target(kind="token", index=TOKEN), None, capture=[node], stats=False).node_grads[
        node
    ][0]


def _attnlrp(engine) -> np.ndarray:
    return gs.explain(engine, IDS, method="attnlrp", target=Target(kind="token", index=TOKEN)).saliency


def _with_adapters(seed: int = 0):
    """A tiny Llama 3 with rank-4 adapters whose B is not zero (fresh adapters change nothing)."""
    lm = tiny_causal_lm("llama3", seed=seed)
    lm.backbone.enable_lora(4)
    rng = np.random.default_rng(seed)
    for w in lm.weights:
        if "lora_kernel_b" in w.path:
            w.assign(rng.normal(0, 0.2, w.shape).astype("float32"))
    return lm


def test_an_int8_model_and_its_saved_file_have_the_tapes_gradient(tmp_path):
    lm = tiny_causal_lm("llama3")
    lm.quantize("int8")
    want = tape_embedding_gradient(lm, feed(IDS), len(IDS) - 1, TOKEN)[0]
    path = tmp_path / "int8.keras"
    lm.save(path)
    for model in (lm, path):
        engine = gs.open_engine(model)
        np.testing.assert_allclose(_identity_gradient(engine), want, atol=1e-5 * np.abs(want).max(), rtol=0)
        saliency = _attnlrp(engine)
        assert np.isfinite(saliency).all() and np.abs(saliency).max() > 0


def test_lora_attnlrp_equals_attnlrp_with_the_adapters_merged():
    lm = _with_adapters()
    want = tape_embedding_gradient(lm, feed(IDS), len(IDS) - 1, TOKEN)[0]
    engine = gs.open_engine(lm)
    np.testing.assert_allclose(_identity_gradient(engine), want, atol=1e-5 * np.abs(want).max(), rtol=0)
    merged = tiny_causal_lm("llama3", seed=1)  # other random weights: every kernel is overwritten below
    # Keras' kernel property of a LoRA layer is W + (alpha / r) A B; the adapters' own variables come after
    lora_kernels = {
        id(layer._kernel): layer.kernel for layer in lm._flatten_layers() if getattr(layer, "lora_enabled", False)
    }
    own = [w for w in lm.weights if "lora_kernel" not in w.path]
    assert len(own) == len(merged.weights) and len(lora_kernels) == 4  # query and value of each block
    for a, b in zip(own, merged.weights):
        assert a.shape == b.shape
        b.assign(lora_kernels.get(id(a), a))
    np.testing.assert_allclose(np.asarray(merged(feed(IDS))), np.asarray(lm(feed(IDS))), atol=1e-5)
    got, reference = _attnlrp(engine), _attnlrp(gs.open_engine(merged))
    np.testing.assert_allclose(got, reference, atol=1e-5 * np.abs(reference).max(), rtol=0)
    assert np.abs(got - _attnlrp(gs.open_engine(tiny_causal_lm("llama3")))).max() > 1e-3  # the adapters matter


def test_the_monitor_records_the_adapters_of_a_lora_fine_tune(tmp_path):
    from gradscope.backend import keras
    from gradscope.engine.training.monitor import GradientMonitor
    from gradscope.io.training_events import read_training_log

    lm = _with_adapters()
    lm.compile(optimizer=keras.optimizers.SGD(0.01), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, 64, (8, 6)), "padding_mask": np.ones((8, 6), "int32")}
    y = rng.integers(0, 64, (8, 6))
    lm.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[GradientMonitor(tmp_path, every=1)])
    log = read_training_log(tmp_path)
    names = [w.path for w in log.weights]
    adapters = [i for i, n in enumerate(names) if "lora_kernel" in n]
    assert adapters and len(adapters) == len(names)  # only the adapters train
    norms = log.record(0).weight_column("grad_norm")[adapters]
    assert np.isfinite(norms).all() and (norms > 0).mean() > 0.5  # an A whose B was zero gets none: not all
