"""Long prompts (issue 50 item 5): from ``Engine.long_input_tokens`` tokens on, the live sweep keeps no per-node
tapes and ``mode="auto"`` stays live (a whole-plan trace holds every tensor of the pass at once), with the same
results: the identity plan equals a plain tape, and AttnLRP equals the sweep that kept its tapes. The threshold is
lowered to 4 tokens here; ``benchmarks/bench_language_model.py --long 2048`` measures the memory."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.core.targets import Target
from gradscope.engine.backward.live import _Recorded
from gradscope.engine.backward.runner import Engine
from gradscope.rules.methods import build_method
from gradscope.rules.plan import Plan
from tests.engine.backward.language_models import feed, tape_embedding_gradient, tiny_causal_lm

pytest.importorskip("keras_hub")

IDS = [5, 17, 3, 9, 12, 1, 7, 2, 30, 4]


@pytest.fixture(scope="module", params=["llama3", "gemma3"])
def model(request):
    model = tiny_causal_lm(request.param)
    model(feed(IDS))
    return model


def _engine(model, long_from: int) -> Engine:
    engine = Engine(model)
    engine.long_input_tokens = long_from
    return engine


def _embedding(engine: Engine) -> str:
    return next(n.id for n in engine.graph.nodes if n.op_type == "ReversibleEmbedding")


def test_a_long_prompt_keeps_no_tapes_and_its_gradient_equals_the_tape(model):
    engine = _engine(model, 4)
    inputs = feed(IDS)
    xs = [inputs[i] for i in engine.graph.input_ids]
    assert engine.is_long_input(engine._as_inputs(xs))
    token = int(np.argmax(model(inputs).numpy()[0, -1]))
    result = engine.backward(xs, Target(kind="token", index=token), Plan(), capture=[_embedding(engine)])
    assert result.meta["mode"] == "live"
    assert not any(isinstance(t, _Recorded) for t in engine.live._forward.tapes.values())
    reference = tape_embedding_gradient(model, inputs, len(IDS) - 1, token)
    got = result.node_grads[_embedding(engine)]
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-6 * np.abs(reference).max())


def test_attnlrp_on_a_long_prompt_equals_the_sweep_with_tapes_and_is_never_traced_whole(model):
    inputs = feed(IDS)
    short, long = _engine(model, 10_000), _engine(model, 4)
    xs = [inputs[i] for i in long.graph.input_ids]
    target = Target(kind="token")
    plan = build_method("attnlrp", long.graph).plan
    expected = short.backward(xs, target, plan, capture="all", mode="live")
    assert any(isinstance(t, _Recorded) for t in short.live._forward.tapes.values())  # the short one keeps tapes
    for _ in range(2):  # the second time too: "auto" would trace a plan it has seen
        got = long.backward(xs, target, plan, capture="all")
        assert got.meta["mode"] == "live"
        for node in (_embedding(long), long.graph.output_ids[0]):
            want = expected.node_grads[node]
            np.testing.assert_allclose(got.node_grads[node], want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    assert long.compile(xs, target, plan) is False  # the background step compiles kernels only
    assert long.trace_count == 0
