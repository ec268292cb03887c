"""What a rule sees of its node: the node's own forward output and true VJP are reused, not recomputed, where
that is exact (``RuleContext.at_forward``/``has_own``, ``LinearOp.forward_vjp``), and give what a tape over
the node's call gives; on a text model with an Embedding and on keras_hub's GPT-2 the live presets that use
them equal the whole compiled plan (the CNN fixtures: ``test_live.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gradscope.backend import keras, tf
from gradscope.core.targets import Target
from gradscope.engine.backward.context import RuleContext
from gradscope.engine.backward.runner import Engine
from gradscope.rules.builtin.linear_ops import LinearOp, layer_op
from gradscope.rules.methods import build_method
from gradscope.rules.plan import Plan


def _dense_context(true_vjp: bool) -> tuple[RuleContext, keras.layers.Dense]:
    keras.utils.set_random_seed(0)
    layer = keras.layers.Dense(3)
    x = tf.constant(np.random.default_rng(0).normal(size=(2, 4)).astype("float32"))
    y = layer(x)
    ws = [v.value for v in layer.variables]

    def forward(xs, ws_):
        w, b = ws_
        out = tf.matmul(xs[0], w)
        return [out if b is None else out + b]

    vjp = (lambda ws_, dys: [tf.matmul(dys[0], ws_[0], transpose_b=True)]) if true_vjp else None
    node = SimpleNamespace(id="d", op_type="Dense")
    return RuleContext(node, layer, [x], [y], ws, ["kernel", "bias"], forward, None, vjp), layer


def _tape_vjp(ctx: RuleContext, weights: dict, dy) -> np.ndarray:
    x = tf.identity(ctx.inputs[0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        z = ctx.forward([x], weights)[0]
    return tape.gradient(z, x, output_gradients=dy).numpy()


def test_at_its_own_weights_the_forward_output_is_reused_and_nothing_runs_again():
    for true_vjp in (True, False):
        ctx, _ = _dense_context(true_vjp)
        op = layer_op(ctx)

        def never(x, w):
            raise AssertionError("the node ran again")

        shortcut = LinearOp(never, op.kernels, op.bias_name, op.bias, node=ctx)
        z, vjp = shortcut.forward_vjp(ctx.inputs[0], shortcut.weights(shortcut.kernels, shortcut.bias))
        assert z is ctx.outputs[0]
        dy = tf.ones_like(z)
        if true_vjp:  # the lowered VJP: the node's call is not run (``never`` would raise)
            np.testing.assert_allclose(vjp(dy).numpy(), _tape_vjp(ctx, {}, dy), rtol=1e-6)


def test_other_weights_or_another_input_run_the_node_and_match_the_tape():
    ctx, _ = _dense_context(True)
    op = layer_op(ctx)
    wp = op.weights(op.clamped(+1))  # W+, bias dropped
    dy = tf.constant(np.random.default_rng(1).normal(size=(2, 3)).astype("float32"))
    assert not ctx.has_own(wp) and ctx.has_own({}) and ctx.has_own({"kernel": ctx.weights["kernel"]})
    z, vjp = op.forward_vjp(ctx.inputs[0], wp)
    np.testing.assert_allclose(z.numpy(), ctx.forward(None, wp)[0].numpy(), rtol=1e-6)
    np.testing.assert_allclose(vjp(dy).numpy(), _tape_vjp(ctx, wp, dy), rtol=1e-6)
    other = ctx.inputs[0] * 2.0  # not the forward input: recomputed on a tape
    assert not ctx.at_forward(other)
    z2, vjp2 = op.forward_vjp(other, op.weights(op.kernels, op.bias))
    np.testing.assert_allclose(z2.numpy(), 2.0 * ctx.outputs[0].numpy() - op.bias.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(vjp2(dy).numpy(), _tape_vjp(ctx, {}, dy), rtol=1e-6)


def _live_and_compiled(engine, xs, target, preset, *, prepare: bool = False) -> None:
    """Live equals the whole plan; with ``prepare``, again once the preset's block kernels are compiled."""
    from tests.engine.backward.test_live import assert_same

    plan = build_method(preset, engine.graph).plan
    live = engine.backward(xs, target, plan, capture="all", mode="live")
    compiled = engine.backward(xs, target, plan, capture="all", mode="compiled")
    assert_same(live, compiled, engine.stat_nodes)
    if prepare:
        assert engine.prepare(plan, target) > 0
        engine.backward(xs, target, Plan(), mode="live")  # away and back: the preset's blocks recompute
        blocks = engine.backward(xs, target, plan, capture="all", mode="live")
        assert blocks.meta["compiled_nodes"] > 0
        assert_same(blocks, compiled, engine.stat_nodes)


@pytest.mark.parametrize("preset", ["lrp_epsilon", "mwp", "attnlrp"])
def test_layer_wise_presets_live_equal_the_whole_plan_on_a_text_model_with_an_embedding(preset):
    """Lowered Dense layers on (batch, tokens, width): the reused forward output and lowered VJP (W+ for MWP)."""
    from tests.engine.backward.test_segments import text_blocks

    engine = Engine(text_blocks())
    ids = np.random.default_rng(2).integers(0, 40, (2, 10))
    _live_and_compiled(engine, ids, Target(index=1), preset)


def test_attnlrp_live_equals_the_whole_plan_on_keras_hub_gpt2():
    pytest.importorskip("keras_hub")
    from tests.engine.backward.language_models import feed, tiny_causal_lm

    engine = Engine(tiny_causal_lm("gpt2"))
    inputs = feed([5, 17, 3, 9, 12, 1, 7, 2])
    xs = [inputs[i] for i in engine.graph.input_ids]
    _live_and_compiled(engine, xs, Target(kind="token", index=11), "attnlrp", prepare=True)
