"""``sanity`` (checks of a method on one input) and ``evaluate`` (methods scored over a dataset)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gradscope.api.inputs import check_common, engine_for, inputs_of, resolve_method
from gradscope.core.resources import bundled
from gradscope.core.targets import Target
from gradscope.rules.methods import Method
from gradscope.rules.plan import Plan


def sanity(
    model: Any,
    image: Any,
    *,
    method: str | Method | None = "gradient",
    plan: Plan | None = None,
    target: Target | int | None = None,
    preprocessing: str = "unit",
    checks: tuple[str, ...] = ("conservation", "randomisation", "finite_differences"),
    tolerance: float = 0.05,
    safe_mode: bool = True,
) -> Any:
    """Sanity checks of a method or plan on one image (``gradscope.engine.diagnostics.sanity``): layer-wise
    conservation, the model-randomisation test (Adebayo et al. 2018) and finite differences on the paths no rule
    changes. Returns a ``SanityReport`` (``to_text()``, ``to_dict()``)."""
    from gradscope.engine.diagnostics.sanity import sanity_checks

    check_common(method=method, plan=plan, target=target, safe_mode=safe_mode)
    engine = engine_for(model, safe_mode=safe_mode)
    _, x, target = inputs_of(engine, image, preprocessing, target)
    m = resolve_method(engine, method, plan)
    return sanity_checks(engine, x, target, m.plan, method=m.name, checks=checks, tolerance=tolerance)


def evaluate(
    model: Any,
    data: Any,
    *,
    methods: Any = ("gradient",),
    plan: Plan | str | Path | None = None,
    metrics: Any = None,
    out: str | Path | None = None,
    masks: Any = None,
    class_map: dict[int, int] | str | Path | None = None,
    difficult: str | Path | None = None,
    class_names: Any = None,
    split: str = "val",
    preprocessing: str = "unit",
    batch: int = 16,
    tolerance: float = 15.0,
    steps: int = 20,
    fidelity_samples: int = 200,
    seed: int = 0,
    restart: bool = False,
    progress: Any = None,
    should_stop: Any = None,
    ray: Any = None,
    safe_mode: bool = True,
    vocab: Any = None,
    baseline: str = "zero",
) -> Any:
    """Score methods over a dataset (Pointing Game, deletion, insertion, MuFidelity; for text ABPC,
    comprehensiveness, sufficiency, token pointing); returns an ``EvalReport``.

    Text (``data`` a ``.jsonl`` or ``.csv`` file or a folder of ``.txt`` files, ``gradscope.io.text_datasets``):
    read with ``vocab`` (a vocabulary file or tokenizer folder; default: the one beside the model, a checkpoint
    folder's tokenizer); ``baseline`` ("zero", "pad" or "mask") replaces a removed token's input embedding;
    ``metrics`` default to abpc, comprehensiveness and sufficiency (images: pointing).

    ``data``: a folder of images (masks in ``masks/<stem>.png`` for the Pointing Game, see
    ``gradscope.io.datasets``) or an array of model inputs (n, H, W, C) with ``masks`` (n, H, W) of class indices
    (-1 background); ``difficult``: TorchRay's difficult-pairs file (else the pairs are judged from the masks).
    ``methods``: presets, ``"preset@node"`` (read at a node), ``"center"``, ``"random"``;
    ``plan``: the user's plan, evaluated too (named by its name or file). ``out``: the folder of batch records
    and results (a run with the same ``out`` resumes; None: a temporary folder). ``ray``: a
    ``gradscope.app.evaluation.on_ray.RayOptions`` to run the batches on a Ray cluster (``model`` must be a path).
    ``progress(done, total, seconds_left)`` is called after every batch; ``should_stop()`` ends the run cleanly.
    """
    import tempfile

    from gradscope.app.evaluation.run import evaluation_settings, run_evaluation, source_of
    from gradscope.io.text_datasets import is_text_dataset

    engine = engine_for(model, safe_mode=safe_mode)
    data = bundled(data)  # demo:eval, from any folder
    reads_tokens = engine.graph.token_input is not None
    text = isinstance(data, (str, Path)) and is_text_dataset(data, reads_tokens)
    if metrics is None:
        from gradscope.app.evaluation.scoring import TEXT_DEFAULT

        metrics = list(TEXT_DEFAULT) if text else ["pointing"]
    if text:
        vocab = _text_vocabulary(vocab, model)
    settings = evaluation_settings(
        methods,
        metrics,
        plan,
        baseline=baseline,
        batch=batch,
        tolerance=tolerance,
        steps=steps,
        fidelity_samples=fidelity_samples,
        seed=seed,
    )
    if class_names is None and isinstance(model, (str, Path)):
        from gradscope.app.files.session_files import find_class_names

        class_names = find_class_names(model)
    source = source_of(
        engine,
        data,
        settings,
        masks=masks,
        class_map=class_map,
        difficult=difficult,
        preprocessing=preprocessing,
        class_names=class_names,
        split=split,
        vocab=vocab,
    )
    model_name = str(model) if isinstance(model, (str, Path)) else getattr(ray, "model", "")
    if ray is not None and not getattr(ray, "model", ""):
        if not isinstance(model, (str, Path)):
            from gradscope.app.evaluation.run import EvaluationError

            raise EvaluationError("A Ray evaluation loads the model in every worker: pass the model's file.")
        ray = dataclasses.replace(ray, model=str(model), safe_mode=safe_mode)
    run = lambda folder: run_evaluation(  # noqa: E731
        engine,
        source,
        settings,
        Path(folder),
        model=model_name,
        restart=restart,
        progress=progress,
        should_stop=should_stop,
        ray=ray,
    )[1]
    if out is None:
        with tempfile.TemporaryDirectory(prefix="gradscope-eval-") as folder:
            return run(folder)
    return run(out)


def _text_vocabulary(vocab: Any, model: Any) -> Any:
    """The vocabulary that reads a text dataset: the one given (a ``Vocabulary`` or its file), else the one beside
    the model file (a checkpoint folder's tokenizer), else None (the samples give token ids)."""
    from gradscope.io.sequences import Vocabulary

    if vocab is None and isinstance(model, (str, Path)):
        from gradscope.app.files.session_files import find_vocabulary

        vocab = find_vocabulary(model)
    if vocab is None or isinstance(vocab, Vocabulary):
        return vocab
    return Vocabulary.load(vocab)
