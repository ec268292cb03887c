"""Block kernels (``engine.backward.segments``): a run of nodes whose signal enters through one tensor runs its
true backward as one compiled function once ``LiveBackward.warm`` traced it. They must give what the
node-by-node sweep gives (signals, statistics, input gradient = the plain tape gradient), leave edits correct
and recompute no more than before, and share one kernel between identical blocks. Tried on a residual CNN, a
text model with an Embedding and a keras_hub GPT-2."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import keras
from gradscope.core.errors import Cancelled
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.engine.backward.segments import MAX_STEPS, MIN_STEPS, KernelPool, find_segments
from gradscope.rules.methods import build_method
from gradscope.rules.plan import Plan
from tests.engine.backward.test_live import assert_same
from tests.engine.fixtures import _randomize_bn, sample_input, tape_input_gradient


def blocks_cnn() -> keras.Model:
    """A stem, three identical residual blocks, a strided projection block and a head (ResNet in small)."""
    keras.utils.set_random_seed(4)
    x = inputs = keras.Input((12, 12, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", name="stem")(x)
    x = keras.layers.BatchNormalization(name="stem_bn")(x)
    x = keras.layers.ReLU(name="stem_relu")(x)
    for b in range(3):
        y = keras.layers.Conv2D(8, 3, padding="same", name=f"b{b}_conv1")(x)
        y = keras.layers.BatchNormalization(name=f"b{b}_bn1")(y)
        y = keras.layers.Activation("relu", name=f"b{b}_relu1")(y)
        y = keras.layers.Conv2D(8, 3, padding="same", name=f"b{b}_conv2")(y)
        y = keras.layers.BatchNormalization(name=f"b{b}_bn2")(y)
        x = keras.layers.Activation("relu", name=f"b{b}_out")(keras.layers.Add(name=f"b{b}_add")([x, y]))
    short = keras.layers.Conv2D(16, 1, strides=2, name="p_short")(x)
    y = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu", name="p_conv1")(x)
    y = keras.layers.Conv2D(16, 3, padding="same", name="p_conv2")(y)
    x = keras.layers.ReLU(name="p_out")(keras.layers.Add(name="p_add")([short, y]))
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = keras.layers.Dense(5, name="logits")(x)
    return _randomize_bn(keras.Model(inputs, outputs))


def text_blocks() -> keras.Model:
    """Token ids -> Embedding -> three residual MLP blocks with LayerNormalization -> pooled classifier."""
    keras.utils.set_random_seed(5)
    inputs = keras.Input((10,), dtype="int32")
    x = keras.layers.Embedding(40, 8, name="embed")(inputs)
    for b in range(3):
        y = keras.layers.Dense(16, activation="gelu", name=f"t{b}_up")(x)
        y = keras.layers.Dense(8, name=f"t{b}_down")(y)
        y = keras.layers.Multiply(name=f"t{b}_gate")(
            [y, keras.layers.Dense(8, activation="sigmoid", name=f"t{b}_g")(x)]
        )
        x = keras.layers.LayerNormalization(name=f"t{b}_norm")(keras.layers.Add(name=f"t{b}_add")([x, y]))
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="logits")(x))


def _warm_pair(model, x):
    """The same model twice: one engine node by node, one with its block kernels traced."""
    plain, blocks = Engine(model), Engine(model)
    blocks.backward(x, Target(index=0), Plan(), mode="live")
    blocks.live.warm({})
    assert blocks.live._segment_kernels, "no block kernel was traced"
    return plain, blocks


@pytest.fixture(scope="module")
def cnn_pair():
    """The residual CNN, an input and its two engines (shared: every test sets the memo state it needs)."""
    model = blocks_cnn()
    x = sample_input(model, 2, seed=3)
    return (model, x, *_warm_pair(model, x))


def _check_segments_are_single_exit(engine: Engine) -> list:
    """Independently of ``find_segments``: of the tensors a segment makes, only its out key is read later."""
    steps = engine.exec.steps
    segments = find_segments(steps, [engine.logits_key, *engine.exec.output_keys])
    final = {engine.logits_key, *engine.exec.output_keys}
    previous_end = -1
    for s in segments:
        assert s.first > previous_end  # consecutive, not overlapping
        previous_end = s.last
        made = {k for step in steps[s.first : s.last + 1] for k in step.out_keys}
        read_later = {k for step in steps[s.last + 1 :] for k in step.in_keys} | final
        assert made & read_later == {s.out_key}
        assert MIN_STEPS <= len(s.node_ids) <= MAX_STEPS
    return segments


@pytest.mark.parametrize("build", [blocks_cnn, text_blocks])
def test_segments_have_one_exit_and_identical_blocks_share_a_kernel(build):
    model = build()
    engine = Engine(model)
    segments = _check_segments_are_single_exit(engine)
    assert len(segments) >= 3
    x = sample_input(model, 2, seed=1) if build is blocks_cnn else np.random.default_rng(1).integers(0, 40, (2, 10))
    engine.backward(x, Target(index=0), Plan(), mode="live")
    engine.live.warm({})
    keys = {engine.live._segment_key(s, {}) for s in segments}
    assert len(keys) < len(segments)  # the identical blocks share one
    assert set(engine.live._segment_kernels) == keys  # and every segment was traced


def test_block_kernels_give_what_the_node_by_node_sweep_gives_and_the_tape_gradient(cnn_pair):
    model, x, plain, blocks = cnn_pair
    for index in (1, 3):  # a new target: a full sweep
        a = plain.backward(x, Target(index=index), Plan(), capture="all", mode="live")
        b = blocks.backward(x, Target(index=index), Plan(), capture="all", mode="live")
        assert b.meta["recomputed_nodes"] == a.meta["recomputed_nodes"] == len(plain.stat_nodes)
        assert a.meta["compiled_nodes"] == 0 and b.meta["compiled_nodes"] >= len(plain.stat_nodes) - 6
        reference = tape_input_gradient(model, x, index)
        np.testing.assert_allclose(b.input_grad, reference, rtol=1e-5, atol=1e-6 * np.abs(reference).max())
        for n in plain.stat_nodes:
            np.testing.assert_allclose(b.node_grads[n], a.node_grads[n], rtol=1e-5, atol=1e-7)
            sa, sb = a.stats[n], b.stats[n]
            assert sa.status == sb.status, n
            np.testing.assert_allclose(
                [sb.norm, sb.mean_abs, sb.max_abs, sb.zero_fraction],
                [sa.norm, sa.mean_abs, sa.max_abs, sa.zero_fraction],
                rtol=1e-5,
                atol=1e-7,
            )


@pytest.mark.parametrize(
    "node,rule,params",
    [
        ("b2_out", "backward_as", {"activation": "sigmoid"}),
        ("b1_relu1", "guided_backprop", {}),
        ("p_out", "scale", {"factor": -0.5}),
        ("b2_bn1", "zero", {}),
    ],
)
def test_an_edit_after_warm_recomputes_as_before_and_matches_the_whole_plan(cnn_pair, node, rule, params):
    model, x, plain, blocks = cnn_pair
    target = Target(index=2)
    for engine in (plain, blocks):
        engine.backward(x, target, Plan(), mode="live")
    edit = Plan().with_entry(node, rule, params)
    a = plain.backward(x, target, edit, capture="all", mode="live")
    b = blocks.backward(x, target, edit, capture="all", mode="live")
    assert b.meta["recomputed_nodes"] == a.meta["recomputed_nodes"] < len(plain.stat_nodes)
    assert b.meta["compiled_nodes"] > 0  # the blocks below the edit ran as kernels
    assert_same(b, blocks.backward(x, target, edit, capture="all", mode="compiled"), blocks.stat_nodes)
    # back to the identity plan: the edited block and those below it again, through the kernels
    back = blocks.backward(x, target, Plan(), capture="all", mode="live")
    np.testing.assert_allclose(back.input_grad, tape_input_gradient(model, x, 2), rtol=1e-5, atol=1e-7)


def test_a_neuron_target_inside_a_block_is_still_exact(cnn_pair):
    _, x, _, blocks = cnn_pair
    target = Target(kind="neuron", node="b1_conv2", neuron=(4, 5, 2))
    assert_same(
        blocks.backward(x, target, Plan(), capture="all", mode="live"),
        blocks.backward(x, target, Plan(), capture="all", mode="compiled"),
        blocks.stat_nodes,
    )


def test_a_text_model_with_an_embedding_runs_its_blocks_as_kernels():
    model = text_blocks()
    ids = np.random.default_rng(2).integers(0, 40, (2, 10))
    plain, blocks = _warm_pair(model, ids)
    a = plain.backward(ids, Target(index=1), Plan(), capture="all", mode="live")
    b = blocks.backward(ids, Target(index=1), Plan(), capture="all", mode="live")
    assert b.meta["compiled_nodes"] >= 3 * MIN_STEPS
    for n in plain.stat_nodes:  # the kernel's graph may sum in another order: tolerance at the signal's scale
        scale = np.abs(a.node_grads[n]).max()
        np.testing.assert_allclose(b.node_grads[n], a.node_grads[n], rtol=1e-5, atol=1e-6 * scale)
    assert_same(b, blocks.backward(ids, Target(index=1), Plan(), capture="all", mode="compiled"), blocks.stat_nodes)


def test_a_keras_hub_causal_lm_runs_its_decoder_blocks_as_kernels():
    pytest.importorskip("keras_hub")
    from tests.engine.backward.language_models import feed, tape_embedding_gradient, tiny_causal_lm

    model = tiny_causal_lm("gpt2")
    inputs = feed([5, 17, 3, 9, 12, 1, 7, 2])
    engine = Engine(model)
    xs = [inputs[i] for i in engine.graph.input_ids]
    embedding = next(n.id for n in engine.graph.nodes if n.op_type == "ReversibleEmbedding")
    target = Target(kind="neuron", node=engine.graph.output_ids[0], neuron=(5, 11))
    before = engine.backward(xs, target, Plan(), capture=[embedding], mode="live")
    engine.live.warm({})
    assert engine.live._segment_kernels
    engine.backward(xs, Target(kind="neuron", node=engine.graph.output_ids[0], neuron=(4, 3)), Plan(), mode="live")
    after = engine.backward(xs, target, Plan(), capture=[embedding], mode="live")  # a full sweep, warm
    assert after.meta["compiled_nodes"] >= MIN_STEPS
    reference = tape_embedding_gradient(model, inputs, 5, 11)
    for got in (before, after):
        np.testing.assert_allclose(got.node_grads[embedding], reference, rtol=1e-4, atol=1e-6 * np.abs(reference).max())


@pytest.mark.parametrize("preset", ["guided_backprop", "mwp", "lrp_epsilon"])
def test_a_prepared_preset_runs_its_blocks_as_kernels_and_equals_the_whole_plan(cnn_pair, preset):
    model, x = cnn_pair[:2]
    engine = Engine(model)
    target = Target(index=2)
    engine.backward(x, target, Plan(), mode="live")
    plan = build_method(preset, engine.graph).plan
    assert engine.prepare(plan, target) > 0
    assert engine.prepare(plan, target) == 0  # prepared once per model and shape
    live = engine.backward(x, target, plan, capture="all", mode="live")
    assert live.meta["compiled_nodes"] >= len(engine.stat_nodes) - 6  # only the nodes outside blocks ran alone
    assert_same(live, engine.backward(x, target, plan, capture="all", mode="compiled"), engine.stat_nodes)
    # an edit on top of the preset: its block runs node by node (no kernel for that plan), the blocks below as
    # the preset's kernels, and the result is still the whole plan's
    edit = plan.with_entry("b1_conv2", "scale", {"factor": -2.0})
    after = engine.backward(x, target, edit, capture="all", mode="live")
    assert 0 < after.meta["compiled_nodes"] < after.meta["recomputed_nodes"]
    assert_same(after, engine.backward(x, target, edit, capture="all", mode="compiled"), engine.stat_nodes)


@pytest.mark.parametrize("preset", ["attnlrp", "lrp_epsilon"])
def test_a_prepared_preset_on_a_text_model_with_an_embedding_equals_the_whole_plan(preset):
    engine = Engine(text_blocks())
    ids = np.random.default_rng(2).integers(0, 40, (2, 10))
    engine.backward(ids, Target(index=1), Plan(), mode="live")
    plan = build_method(preset, engine.graph).plan
    assert engine.prepare(plan, Target(index=1)) > 0
    live = engine.backward(ids, Target(index=1), plan, capture="all", mode="live")
    assert live.meta["compiled_nodes"] >= 3 * MIN_STEPS
    assert_same(live, engine.backward(ids, Target(index=1), plan, capture="all", mode="compiled"), engine.stat_nodes)


def test_preparing_stops_inside_a_trace_and_leaves_nothing_half_done(cnn_pair):
    model, x = cnn_pair[:2]
    engine = Engine(model)
    engine.backward(x, Target(index=0), Plan(), mode="live")
    plan = build_method("mwp", engine.graph).plan
    asked = []

    def stop_at_the_fourth_question() -> bool:
        asked.append(1)
        return len(asked) >= 4

    with pytest.raises(Cancelled):
        engine.prepare(plan, Target(index=0), should_stop=stop_at_the_fourth_question)
    assert not engine.live._failed_segments  # a cancelled trace is not a failed one: it is traced next time
    done = len(engine.live._segment_kernels)
    assert engine.prepare(plan, Target(index=0)) > 0 and len(engine.live._segment_kernels) > done
    live = engine.backward(x, Target(index=0), plan, capture="all", mode="live")
    assert_same(live, engine.backward(x, Target(index=0), plan, capture="all", mode="compiled"), engine.stat_nodes)


def test_many_edits_do_not_evict_a_prepared_preset(cnn_pair):
    """Each shown edit traces a kernel for its edited block; those go out first, on their own shelf, so the idle
    step does not trace a prepared preset again after every edit (and memory stays bounded)."""
    model, x = cnn_pair[:2]
    engine = Engine(model)
    engine.live._segment_kernels = KernelPool(shown=2, prepared=64)
    target = Target(index=1)
    engine.backward(x, target, Plan(), mode="live")
    preset = build_method("guided_backprop", engine.graph).plan
    assert engine.prepare(preset, target) > 0
    prepared = len(engine.live._segment_kernels)
    for i in range(6):
        edit = Plan().with_entry(f"b{i % 3}_relu1", "scale", {"factor": 1.0 + i / 10})
        engine.backward(x, target, edit, mode="live")
        engine.live.warm(edit.resolve(engine.graph).rule_by_node)
        assert len(engine.live._segment_kernels) <= prepared + 2
    assert engine.prepare(preset, target) == 0  # still there: nothing traced again
    live = engine.backward(x, target, preset, capture="all", mode="live")
    assert_same(live, engine.backward(x, target, preset, capture="all", mode="compiled"), engine.stat_nodes)
