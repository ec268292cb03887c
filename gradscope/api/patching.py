"""``patch``: how a metric moves when one component's value at one position takes its value on a corrupted input
(activation patching, measured or estimated by AtP / AtP*; ``engine.patching``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gradscope.api.inputs import check_common, engine_for, model_input, vocabulary
from gradscope.core.arguments import check_argument
from gradscope.core.errors import InputError
from gradscope.core.patching import PatchResult
from gradscope.core.targets import Target


def patch(
    model: Any,
    clean: Any,
    corrupt: Any,
    *,
    target: Target | int | str | None = None,
    metric: str = "logit",
    components: str | Sequence[str] = "resid",
    nodes: Sequence[str] | None = None,
    method: str = "atp",
    grid: int = 7,
    compare: bool = False,
    vocab: Any = None,
    preprocessing: str = "unit",
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    ray: Any = None,
    safe_mode: bool = True,
) -> PatchResult:
    """Patching effects of ``corrupt`` on ``clean`` (anything ``explain`` takes: text, token ids, an image; the two
    must align: as many tokens, the same size). ``target``: what is measured (a class, a ``Target(kind="token",
    index=A, contrast=B)``: the logit difference; default the clean input's top class or next token); ``metric``:
    "logit", "probability" or "loss". ``components`` of every transformer block ("resid", "attn", "mlp", "q",
    "k", "v"; comma-separated or a list), or ``nodes`` by id (any model: an image's ``grid`` x ``grid`` cells).
    ``method``: "exact", "atp", "atp_star"; ``compare``: the exact effects too, and the estimate's agreement.
    ``ray``: a ``gradscope.app.evaluation.on_ray.RayOptions``: the exact rows on a Ray cluster (``model`` a path:
    every worker loads it).
    Returns a ``PatchResult``: ``.effects`` (blocks, positions), a dict by component when there are several."""
    from gradscope.engine.patching import patch_effects

    check_common(vocab=vocab, target=target, safe_mode=safe_mode)
    check_argument("metric", metric, (str,), "'logit', 'probability' or 'loss'")
    check_argument("method", method, (str,), "'exact', 'atp' or 'atp_star'")
    check_argument("compare", compare, (bool,), "True or False")
    engine = engine_for(model, safe_mode=safe_mode)
    vocab = vocabulary(vocab, model, clean)
    fed = [model_input(engine, source, vocab=vocab, preprocessing=preprocessing) for source in (clean, corrupt)]
    if fed[0].kind != fed[1].kind:
        raise InputError(f"The clean input is {fed[0].kind}, the corrupted one {fed[1].kind}: give two of one kind.")
    xs = [engine.checked_inputs(list(f.arrays)) for f in fed]
    if isinstance(target, str):
        target = Target.parse(target)
    elif not isinstance(target, Target):
        target = Target(index=target)  # type: ignore[arg-type]
    names = [c.strip() for c in components.split(",") if c.strip()] if isinstance(components, str) else components
    decode = vocab.decode if vocab is not None else None
    if ray is not None:
        import dataclasses

        from gradscope.app.patching.on_ray import patch_on_ray

        if not isinstance(model, (str, Path)) and not getattr(ray, "model", ""):
            raise InputError("Patching on Ray loads the model in every worker: pass the model's file.")
        options = ray if getattr(ray, "model", "") else dataclasses.replace(ray, model=str(model), safe_mode=safe_mode)
        result = patch_on_ray(options, engine, xs[0], xs[1], target, metric=metric, components=tuple(names),
                              nodes=list(nodes) if nodes else None, method=method, grid=grid, compare=compare,
                              labels=fed[0].labels or None, decode=decode, progress=progress)  # fmt: skip
        return _described(result, engine, model, fed)
    result = patch_effects(
        engine, xs[0], xs[1], target, metric=metric, components=tuple(names), nodes=nodes, method=method, grid=grid,
        compare=compare, labels=fed[0].labels or None, decode=decode, progress=progress, should_stop=should_stop,
    )  # fmt: skip
    return _described(result, engine, model, fed)


def _described(result: PatchResult, engine: Any, model: Any, fed: list) -> PatchResult:
    result.sidecar.update(
        model=getattr(engine.model, "name", "model"),
        model_file=str(model) if isinstance(model, (str, Path)) else None,
        clean=fed[0].source,
        corrupt=fed[1].source,
    )
    return result
