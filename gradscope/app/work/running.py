"""A run of the current plan, as a worker job: the baseline (plain gradient, reused while model, input and
target stay), the plan's result, the sampling methods' average, and the status line that reports it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gradscope.app.rendering.summaries import with_input_stats
from gradscope.core.results import BackwardResult
from gradscope.engine.backward.attribution import with_sampled_input
from gradscope.rules.plan import Plan


@dataclass
class RunOutput:
    """What a run job hands back (worker -> owner's thread)."""

    result: BackwardResult
    baseline: BackwardResult
    baseline_key: tuple
    seconds: float
    retraced: bool
    plan: Plan
    method: str
    readout: dict[str, Any]  # the view's read-out fields the run was asked with (they belong to its plan)


def run_job(
    engine: Any,
    x: Any,
    target: Any,
    plan: Plan,
    sampling: tuple[str, dict[str, Any]] | None,
    baseline: BackwardResult | None,
    shown: list[str],
    alternate: Callable[[], Any] | None = None,
) -> Callable[[Any], tuple[BackwardResult, BackwardResult, float, bool]]:
    """The job ``fn(token) -> (result, baseline, seconds, retraced)``; ``baseline``: the one already computed
    for this model, input and target (None: compute it); ``shown``: nodes a view reads at once, copied to
    numpy on the worker; ``alternate()``: the other input the plan's value rules read (the corrupted input)."""

    def job(token: Any) -> tuple[BackwardResult, BackwardResult, float, bool]:
        t0 = time.perf_counter()
        traces = engine.trace_count
        base = baseline
        if base is None:
            token.report("Baseline (plain gradient)...")
            base = with_input_stats(engine.backward(x, target, Plan(), capture="all"))
            token.check()
        result = base
        if plan.entries and not plan.is_identity:
            token.report(f"Running the plan ({len(plan.entries)} entries)...")
            other = alternate() if alternate is not None else None
            result = with_input_stats(engine.backward(x, target, plan, capture="all", alternate=other))
        if sampling is not None:
            token.report(f"{sampling[0]}: averaging the input gradient over copies...")
            result = with_input_stats(with_sampled_input(engine, x, target, plan, result, sampling, token))
        for res in (result, base):
            for node in shown:
                if node in res.node_grads:
                    res.node_grads[node], res.node_values.get(node)
        return result, base, time.perf_counter() - t0, engine.trace_count != traces

    return job


def run_status(out: RunOutput) -> str:
    """The status line of a finished run: time, how it ran (live / traced / compiled), rules, warnings."""
    mode = out.result.meta.get("mode", "compiled")
    how = {
        "live": f"live, {out.result.meta.get('recomputed_nodes', 0)} node(s) recomputed",
        "compiled": "traced" if out.retraced else "compiled",
    }.get(mode, mode)
    warnings = out.result.warnings()
    return f"Gradients in {out.seconds:.2f} s ({how}); {len(out.result.rules)} node(s) with rules" + (
        f". Warning: {'; '.join(warnings)}." if warnings else ""
    )


def sampling_of(method: str | None, graph: Any) -> tuple[str, dict[str, Any]] | None:
    """The sampling of a restored session's method preset (SmoothGrad, IG), with its default options."""
    from gradscope.rules.methods import available_methods, build_method

    if not method or method not in available_methods():
        return None
    try:
        m = build_method(method, graph)
    except Exception:  # noqa: BLE001 - a preset that does not fit this model simply has no sampling
        return None
    return (m.sampling, dict(m.options)) if m.sampling else None


# Presets the idle background step prepares (``background_job``), in this order: a transformer's first, then a
# CNN's. Each costs seconds of tracing once per model and input shape; a preset that changes nothing here is skipped.
PREPARED_PRESETS = ("attnlrp", "cp_lrp", "guided_backprop", "lrp_epsilon", "mwp")


def background_job(
    engine: Any, x: Any, target: Any, plan: Plan, presets: tuple[str, ...] | None = None
) -> Callable[[Any], int]:
    """The job the Session runs once a live answer is shown: compile that plan (its kernels and the whole plan,
    so the next edit and the next image are fast), then ``prepare_presets`` (default: ``PREPARED_PRESETS``). A
    newer run cancels it (between nodes); it never changes what is shown. Returns how many presets it prepared."""

    def job(token: Any) -> int:
        engine.compile(x, target, plan, should_stop=lambda: token.cancelled)
        return prepare_presets(engine, target, PREPARED_PRESETS if presets is None else presets, token)

    return job


def prepare_presets(engine: Any, target: Any, presets: tuple[str, ...], token: Any) -> int:
    """Compile the block kernels of each of ``presets`` that changes this model (``Engine.prepare``), so a preset
    picked for the first time answers at block-kernel speed. Returns how many it prepared."""
    from gradscope.rules.methods import build_method

    prepared = 0
    for name in presets:
        try:
            method = build_method(name, engine.graph)
        except Exception:  # noqa: BLE001 - a preset that does not fit this model is not prepared
            continue
        if method.changed and not method.warnings and method.sampling is None:
            token.check()
            engine.prepare(method.plan, target, should_stop=lambda: token.cancelled)
            prepared += 1
    return prepared


def generation_job(
    engine: Any, fed: Any, steps: int, plan: Plan, vocab: Any, times_input: bool = True
) -> Callable[[Any], tuple]:
    """The job ``fn(token) -> (Generation, labels)``: ``steps`` tokens decoded greedily after the typed prompt and
    each attributed under ``plan`` (``engine.backward.generation``), progress in the busy label."""
    from gradscope.engine.backward.attribution import token_readout
    from gradscope.engine.backward.generation import attribute_generation

    graph = engine.graph
    masks = [i for i, kind in graph.token_companions.items() if kind == "mask"]
    real = int(fed.arrays[graph.input_ids.index(masks[0])].sum()) if masks else len(fed.ids)

    def job(token: Any) -> tuple:
        rules = [r.rule.name for r in plan.resolve(graph).rules.values()]
        readout = token_readout(rules, times_input=times_input)

        def progress(done: int, total: int) -> None:
            token.check()
            token.report(f"Generating: token {done} of {total}…")

        g = attribute_generation(engine, fed.ids[:real], steps, plan, readout=readout, progress=progress)
        labels = tuple(vocab.decode(g.tokens) if vocab is not None else (str(i) for i in g.tokens.tolist()))
        return g, labels

    return job
