"""Activation and attribution patching (issue 59), each method against an independent reference: a forward with the
node's value replaced by hand in Keras (exact), the tape's gradient (AtP's definition), transformers' own modules
with forward hooks in float64 (tests/data/hf/*_patching.npz, scripts/patching_reference.py), and a case built to
saturate attention (AtP* against exact where AtP misses)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gradscope.api as gs
from gradscope.backend import keras, tf
from gradscope.core.errors import GraphError, InputError, TargetError
from gradscope.core.patching import agreement
from gradscope.engine.patching import blocks, patch_effects
from gradscope.engine.patching.attribution import graddrop
from tests.engine.fixtures import residual
from tests.io.test_checkpoint_folders import FAMILIES

pytest.importorskip("keras_hub")

HF = Path(__file__).resolve().parents[2] / "data" / "hf"
#: keras_hub's Mistral converter stores the token embedding in float16 (its logits are 1.3e-3 off torch's already).
TOLERANCE = {"mistral": 3e-3}
CLEAN = [5, 9, 12, 30, 44, 7, 21, 3]
CORRUPT = [5, 9, 12, 31, 44, 7, 21, 3]  # differs at position 3


def feed(engine, ids):
    return [
        np.array([ids]) if i.endswith("token_ids") else np.ones((1, len(ids)), "int32") for i in engine.graph.input_ids
    ]


@pytest.fixture(scope="module")
def llama():
    return gs.open_engine(HF / "llama")


@pytest.mark.parametrize("family", FAMILIES)
def test_exact_and_atp_equal_transformers_with_forward_hooks(family):
    """Every family's residual stream, attention and MLP outputs, each position, against torch in float64."""
    ref = np.load(HF / f"{family}_patching.npz")
    engine = gs.open_engine(HF / family)
    target = gs.Target(kind="token", index=int(ref["token"]))
    scale = np.abs(ref["exact"]).max()
    for method in ("exact", "atp"):
        r = patch_effects(engine, feed(engine, ref["clean"].tolist()), feed(engine, ref["corrupt"].tolist()), target,
                          components=("resid", "attn", "mlp"), method=method)  # fmt: skip
        got = np.stack([r.by_component[c] for c in ("resid", "attn", "mlp")])
        np.testing.assert_allclose(got, ref[method], atol=TOLERANCE.get(family, 1e-4) * scale, rtol=0)
    assert r.clean_value == pytest.approx(float(ref["clean_value"]), abs=TOLERANCE.get(family, 1e-5) * 10)


def test_what_holds_by_construction(llama):
    r = patch_effects(
        llama, feed(llama, CLEAN), feed(llama, CORRUPT), components=("resid", "attn", "mlp"), method="exact"
    )
    for effects in r.by_component.values():
        assert not effects[:, :3].any()  # a causal model: before the first difference nothing can change
    assert r.by_component["resid"][-1, -1] == pytest.approx(r.corrupt_value - r.clean_value, abs=1e-5)
    atp = patch_effects(llama, feed(llama, CLEAN), feed(llama, CORRUPT), components=("resid",), method="atp")
    assert not atp.effects[:, :3].any()


def _hand_forward(engine, ids, block=None, position=None, value=None):
    """The keras_hub model called layer by layer (its own layers, not gradscope's walk), the residual stream after
    ``block`` replaced at ``position`` by ``value``: returns (the logits after the last position, each block's
    output)."""
    model = engine.model
    backbone = model.backbone
    x = backbone.token_embedding(np.array([ids]))
    mask = np.ones((1, len(ids)), "int32")
    outputs = []
    for k, layer in enumerate(backbone.transformer_layers):
        x = layer(x, decoder_padding_mask=mask)
        if k == block:
            x = tf.concat([x[:, :position], value[None, None], x[:, position + 1 :]], axis=1)
        outputs.append(x)
    logits = backbone.token_embedding(backbone.layer_norm(x), reverse=True)
    return logits[0, -1], outputs


def test_exact_equals_a_forward_with_the_value_replaced_by_hand(llama):
    clean_logits, clean_blocks = _hand_forward(llama, CLEAN)
    _, corrupt_blocks = _hand_forward(llama, CORRUPT)
    token = int(tf.argmax(clean_logits))
    r = patch_effects(llama, feed(llama, CLEAN), feed(llama, CORRUPT), components=("resid",), method="exact")
    for block in range(len(clean_blocks)):
        for position in (3, 5, 7):
            logits, _ = _hand_forward(llama, CLEAN, block, position, corrupt_blocks[block][0, position])
            want = float(logits[token] - clean_logits[token])
            assert r.effects[block, position] == pytest.approx(want, abs=1e-5)


def test_atp_equals_its_definition_with_the_tape(llama):
    _, corrupt_blocks = _hand_forward(llama, CORRUPT)
    clean_logits, _ = _hand_forward(llama, CLEAN)
    token = int(tf.argmax(clean_logits))
    backbone = llama.model.backbone
    with tf.GradientTape() as tape:
        x = backbone.token_embedding(np.array([CLEAN]))
        outs = []
        for layer in backbone.transformer_layers:
            x = layer(x, decoder_padding_mask=np.ones((1, 8), "int32"))
            outs.append(x)
        logit = backbone.token_embedding(backbone.layer_norm(x), reverse=True)[0, -1, token]
    grads = tape.gradient(logit, outs)
    want = np.stack([((c - o) * g).numpy()[0].sum(-1) for c, o, g in zip(corrupt_blocks, outs, grads)])
    r = patch_effects(llama, feed(llama, CLEAN), feed(llama, CORRUPT), components=("resid",), method="atp")
    np.testing.assert_allclose(r.effects, want, atol=1e-5)


def test_atp_star_finds_what_saturated_attention_hides_from_atp():
    """The last block's queries and keys scaled x6: its softmax saturates, so a key patch's gradient is ~0 (AtP
    misses it entirely) while the pattern really moves; AtP* recomputes the pattern exactly (QK fix)."""
    engine = gs.open_engine(HF / "llama")
    layer = engine.exec.operations[blocks(engine.graph)[-1].attn]
    for name in ("_query_dense", "_key_dense"):
        getattr(layer, name).kernel.assign(getattr(layer, name).kernel * 6.0)
    clean, corrupt = [44, 47, 68, 85, 6, 15, 74, 85], [44, 24, 68, 85, 6, 15, 74, 85]
    runs = {m: patch_effects(engine, feed(engine, clean), feed(engine, corrupt), components=("k",), method=m)
            for m in ("exact", "atp", "atp_star")}  # fmt: skip
    exact, atp, star = (runs[m].effects[-1, 1] for m in ("exact", "atp", "atp_star"))
    assert abs(exact) > 0.5
    assert abs(atp) < 1e-3 * abs(exact)  # AtP: a false negative
    assert 0.5 * abs(exact) < star < 1.5 * abs(exact)  # AtP*: a magnitude, of the right size
    assert not runs["atp_star"].signed


def test_graddrop_holds_back_one_block_at_a_time(llama):
    """GradDrop's pieces: a block held back gives its own nodes no gradient, the others a gradient; the combination
    is (1 / (L - 1)) Σ |estimate|."""
    from gradscope.engine.patching.attribution import Signals
    from gradscope.engine.patching.metric import Metric

    found = blocks(llama.graph)
    values, _ = llama._run(feed(llama, CLEAN), {})
    metric = Metric.on_clean(llama, gs.Target(), "logit", values)
    signals = Signals(llama, metric, [b.attn for b in found], [b.branches for b in found])
    for held_back in range(len(found)):
        grads = signals(feed(llama, CLEAN), held_back).grads
        assert not np.any(grads[found[held_back].attn]) and np.any(grads[found[1 - held_back].attn])
    parts = [np.array([[1.0, -2.0]]), np.array([[-3.0, 0.5]]), np.array([[0.0, 1.5]])]
    np.testing.assert_allclose(graddrop(parts), np.array([[2.0, 2.0]]))


def test_metrics_other_than_the_logit_are_measured_as_they_say(llama):
    def metric_of(ids, kind):
        logits = np.asarray(llama.model({"token_ids": np.array([ids]), "padding_mask": np.ones((1, 8), "int32")}))
        z = logits[0, -1].astype(np.float64)
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        return {"probability": p[token] - p[other], "loss": -np.log(p[token])}[kind]

    token, other = 20, 41
    for kind, target in (("probability", gs.Target(kind="token", index=token, contrast=other)),
                         ("loss", gs.Target(kind="token", index=token))):  # fmt: skip
        r = patch_effects(llama, feed(llama, CLEAN), feed(llama, CORRUPT), target, metric=kind, method="exact")
        assert r.by_component["resid"][-1, -1] == pytest.approx(
            metric_of(CORRUPT, kind) - metric_of(CLEAN, kind), abs=1e-5
        )
    with pytest.raises(TargetError, match="contrast token belongs"):
        patch_effects(llama, feed(llama, CLEAN), feed(llama, CORRUPT), gs.Target(kind="token", index=1, contrast=2),
                      metric="loss")  # fmt: skip


def test_image_grid_cells_by_hand_and_atp_on_a_cnn():
    """A residual CNN: patching a grid cell of a node equals the model run on by hand from that node with the
    cell's pixels replaced; AtP equals (corrupt - clean) . the tape's gradient summed over the cell."""
    model = residual()
    engine = gs.open_engine(model)
    rng = np.random.default_rng(0)
    clean, corrupt = (rng.uniform(size=(1, 8, 8, 3)).astype("float32") for _ in range(2))
    r = patch_effects(engine, clean, corrupt, gs.Target(index=1), nodes=["add"], method="exact", grid=2, compare=True)
    assert r.grid == (2, 2) and r.units == ["0,0", "0,1", "1,0", "1,1"]
    below = keras.Model(model.input, model.get_layer("add").output)
    a_clean, a_corrupt = below(clean).numpy(), below(corrupt).numpy()

    def above(a):
        x = model.get_layer("post")(a)
        return model.get_layer("logits")(model.get_layer("gap")(x)).numpy()[0, 1]

    for cell, (rows, cols) in enumerate([(slice(0, 4), slice(0, 4)), (slice(0, 4), slice(4, 8)),
                                         (slice(4, 8), slice(0, 4)), (slice(4, 8), slice(4, 8))]):  # fmt: skip
        patched = a_clean.copy()
        patched[0, rows, cols] = a_corrupt[0, rows, cols]
        assert r.effects[0, cell] == pytest.approx(above(patched) - above(a_clean), abs=1e-5)
    a = tf.Variable(a_clean)
    with tf.GradientTape() as tape:
        value = model.get_layer("logits")(model.get_layer("gap")(model.get_layer("post")(a)))[0, 1]
    per_pixel = ((a_corrupt - a_clean) * tape.gradient(value, a).numpy())[0].sum(-1)
    atp = patch_effects(engine, clean, corrupt, gs.Target(index=1), nodes=["add"], method="atp", grid=2)
    cells = [per_pixel[:4, :4].sum(), per_pixel[:4, 4:].sum(), per_pixel[4:, :4].sum(), per_pixel[4:, 4:].sum()]
    np.testing.assert_allclose(atp.effects[0], cells, atol=1e-5)
    assert set(r.agreement) == {"nodes"} and -1 <= r.agreement["nodes"].correlation <= 1


def test_agreement_counts_what_it_says():
    exact = np.array([[1.0, -2.0, 0.001, 4.0]])
    estimate = np.array([[3.5, 2.0, -0.5, 3.0]])
    a = agreement(estimate, exact, top_k=2)
    assert a.wrong_sign == [(0, 1)]  # the 0.001 cell is below 1 % of the largest: its sign is not counted
    assert a.top_k_overlap == 0.5  # the two largest: cells 0 and 3 estimated, 3 and 1 measured
    assert a.correlation == pytest.approx(np.corrcoef(estimate.ravel(), exact.ravel())[0, 1])


def test_bad_requests_are_one_line(llama):
    with pytest.raises(InputError, match="has 8 tokens, the corrupted one 7"):
        patch_effects(llama, feed(llama, CLEAN), feed(llama, CLEAN[:-1]))
    with pytest.raises(InputError, match="one of exact, atp, atp_star"):
        patch_effects(llama, feed(llama, CLEAN), feed(llama, CORRUPT), method="acdc")
    with pytest.raises(GraphError, match="Unknown component"):
        patch_effects(llama, feed(llama, CLEAN), feed(llama, CORRUPT), components=("heads",))
    engine = gs.open_engine(residual())
    x = np.zeros((1, 8, 8, 3), "float32")
    with pytest.raises(GraphError, match="name the nodes to patch"):
        patch_effects(engine, x, x)
    with pytest.raises(GraphError, match="this model has none"):
        patch_effects(engine, x, x, nodes=["add"], method="atp_star")
