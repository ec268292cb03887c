"""The Qt-free high-level API: open a model, explain an image, save the overlay.

Everything the CLI's ``explain`` does goes through here, and the GUI's worker uses the same pieces.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.arguments import check_argument, check_count
from gradscope.core.display import RichDisplay
from gradscope.core.errors import GraphError, PlanError
from gradscope.core.results import BackwardResult
from gradscope.core.targets import Target, next_token_summary
from gradscope.io.model_inputs import ModelInput
from gradscope.rules.methods import Method, build_method
from gradscope.rules.plan import Plan


def open_engine(model: Any, *, safe_mode: bool = True, custom_objects: dict | None = None, dtype: str = "auto") -> Any:
    """An ``Engine`` for a model object, an ``Engine`` (returned as is), a path to a ``.keras``/``.h5`` file or a
    checkpoint folder (Hugging Face, keras_hub; ``dtype``: "auto", the checkpoint's own, or float32, bfloat16,
    float16)."""
    from gradscope.engine.backward.runner import Engine

    if isinstance(model, Engine):
        return model
    if isinstance(model, (str, Path)):
        from gradscope.io.models import load_model

        model = load_model(model, safe_mode=safe_mode, custom_objects=custom_objects, dtype=dtype)
    return Engine(model)


def resolve_method(engine: Any, method: str | Method | None, plan: Plan | None, **options: Any) -> Method:
    """A ``Method`` from a preset name, or a plain one wrapping a user's plan (plan wins if both are given)."""
    if isinstance(method, Method):
        return method
    if plan is not None and not isinstance(plan, Plan):
        raise PlanError(f"plan must be a Plan (Plan.from_dict / Plan.load), not {type(plan).__name__}.")
    if plan is not None:
        base = build_method(method, engine.graph, **options) if method else None
        return Method(
            name=plan.name or "custom plan",
            plan=plan,
            reduction=base.reduction if base else "max_abs",
            times_input=base.times_input if base else False,
            signed=base.signed if base else False,
            readout_node=base.readout_node if base else None,
            grad_cam=base.grad_cam if base else False,
            sampling=base.sampling if base else None,
            options=dict(base.options) if base else {},
            changed=tuple(plan.resolve(engine.graph).rules),
        )
    return build_method(method or "gradient", engine.graph, **options)


_VIEW_OPTIONS = {"cmap", "alpha", "normalization", "style"}


@dataclass
class Explanation(RichDisplay):
    """One input's explanation: the raw signal, the map and what produced it. In a notebook it shows itself (the
    overlay with its colour bar and caption, or a token strip); ``show()`` elsewhere.

    ``saliency`` is the per-position map: (H, W) for an image, (seq,) for token ids (one score per token, read
    at the embedding's output: the signal times the embedding summed over its dimension), (features,) for a
    tabular row."""

    image: np.ndarray | None  # uint8 (H, W, 3): the original image (None for tokens, rows and arrays)
    signal: np.ndarray  # backward signal at the read-out node (times input if the method says so)
    saliency: np.ndarray  # (h, w), (seq,) or (features,), not normalised
    result: BackwardResult
    method: Method
    node: str | None  # read-out node (None: the model input)
    target: Target
    sidecar: dict[str, Any] = field(default_factory=dict)
    fed: ModelInput | None = None  # what the model was fed (tokens and their words, feature names)

    _html_maker = "gradscope.app.display.explanations:explanation_html"

    @property
    def labels(self) -> tuple[str, ...]:
        """What each position of a (seq,) or (features,) map is: tokens or feature names (else empty)."""
        return self.fed.labels if self.fed is not None and self.saliency.ndim == 1 else ()

    @property
    def warnings(self) -> list[str]:
        """What may make this map misleading: the method's own warnings, plan selectors that matched no node,
        non-finite logits, a degenerate map (all zero, constant, NaN/Inf). Empty when there is nothing to say."""
        from gradscope.app.rendering.view import degenerate_note

        out = list(self.method.warnings) + self.result.warnings() + list(self.fed.warnings if self.fed else ())
        note = degenerate_note(self.saliency, self.method.name)
        if note:
            out.append(note)
        return out

    @property
    def predicted_class(self) -> int:
        return int(self.result.target_indices[0]) if self.result.target_indices.size else -1

    def view(
        self,
        *,
        cmap: str | None = None,
        alpha: float = 0.5,
        normalization: str | None = None,
        style: str = "caffe",
    ) -> Any:
        """The ``ViewSettings`` this explanation is drawn with: the method's read-out defaults (a signed method
        gets a diverging colormap and signed normalisation), then the caller's choices."""
        from gradscope.app.rendering.view import INPUT_KEY, ViewSettings

        if self.labels:  # token and feature scores are signed (x input): red for, blue against the target
            cmap, normalization = cmap or "bwr", normalization or "signed"
        view = ViewSettings.for_method(
            self.method, colormap=cmap, alpha=alpha, normalization=normalization, style=style
        )
        reduction = self.sidecar.get("reduction")
        return dataclasses.replace(view, reduction=reduction or view.reduction, readout_node=self.node or INPUT_KEY)

    def images(self, **view_options: Any) -> Any:
        """The ``OverlayImages`` (heat map, blend) through the same pipeline as the GUI and its exports."""
        from gradscope.app.rendering.positions import position_picture
        from gradscope.app.rendering.view import ViewError, overlay_images

        unknown = sorted(set(view_options) - _VIEW_OPTIONS)
        if unknown:
            raise ViewError(f"Unknown view option(s) {', '.join(unknown)}; valid: {', '.join(sorted(_VIEW_OPTIONS))}.")
        view = self.view(**view_options)
        if not self.labels:
            return overlay_images(self.signal, self.image, view, self.node)
        return position_picture(self.fed, self.saliency, view, self.node)

    def render(self, **view_options: Any) -> np.ndarray:
        """The overlay as uint8 (H, W, 3). ``style="caffe"`` (default) lets weak evidence show the image
        (RULES_SPEC §4); ``"alpha"`` is a plain alpha blend. Options: ``cmap``, ``alpha``, ``normalization``,
        ``style``."""
        return self.images(**view_options).picture

    def save(
        self,
        path: str | Path,
        *,
        inputs: Any = (),
        long_side: int | None = None,
        colorbar: bool = False,
        map_only: bool = False,
        **view_options: Any,
    ) -> Path:
        """Write the overlay PNG and its JSON sidecar (the schema every front end writes, ``app.files.exports``).
        ``inputs``: more files this result was computed from (e.g. a plan file), never overwritten;
        ``long_side``: the PNG's long side (default: the image's, at least 512 px); ``colorbar``: a colour bar
        with the map's range under the picture; ``map_only``: the coloured map without the image."""
        from gradscope.app.files.exports import write_overlay

        images = self.images(**view_options)
        own = [self.sidecar.get("model_file"), self.sidecar.get("image")]
        sidecar = self._export_sidecar(**view_options)
        return write_overlay(
            path, images, sidecar, inputs=[*own, *inputs], long_side=long_side, colorbar=colorbar, map_only=map_only
        )

    def save_signal(self, path: str | Path, *, inputs: Any = ()) -> Path:
        """The raw signal behind the map (``self.signal``: float32, before channel reduction) as ``.npy``, with
        a JSON sidecar of the same schema as the overlay's."""
        from gradscope.app.files.exports import write_signal

        own = [self.sidecar.get("model_file"), self.sidecar.get("image")]
        return write_signal(path, self.signal, self._export_sidecar(), inputs=[*own, *inputs])

    def _export_sidecar(self, **view_options: Any) -> dict[str, Any]:
        from gradscope.app.files.exports import overlay_sidecar, position_rows

        view = self.view(**view_options)
        ids = self.fed.ids if self.fed is not None else None
        positions = position_rows(self.labels, self.saliency, ids) if self.labels else None
        return overlay_sidecar(
            model_name=self.sidecar.get("model"),
            model_file=self.sidecar.get("model_file"),
            image=self.sidecar.get("image"),
            preprocessing=self.sidecar.get("preprocessing", "unit"),
            target=self.target,
            predicted_class=self.sidecar.get("predicted_class"),
            method=self.method.name,
            plan=self.method.plan,
            readout_node=self.node,
            changed_nodes=self.result.rules,
            view=view,
            positions=positions,
            explained_token=self.sidecar.get("explained_token"),
        )


def model_input(
    engine: Any, source: Any, *, preprocessing: str = "unit", vocab: Any = None, row: int = 0
) -> ModelInput:
    """Any input as the model's batch (``io.model_inputs``): an image (path or uint8 array), token ids (an
    integer array or list for a model whose input is integer, or typed: ``"12 7 99"``, or text with ``vocab``), a
    ``.npy``/``.npz``/``.csv``/``.txt``/``.json`` file, a float array, or a ``ModelInput``. ``vocab``: a
    ``Vocabulary``, the path of one, or a keras_hub tokenizer's preset folder."""
    from gradscope.io.images import load_image, prepare_input, rgb_image
    from gradscope.io.model_inputs import INPUT_FILE_SUFFIXES, read_model_input, table_input, token_input, typed_input
    from gradscope.io.sequences import TableRow, Vocabulary

    if isinstance(source, ModelInput):
        return source
    graph = engine.graph
    if isinstance(vocab, (str, Path)):
        vocab = Vocabulary.load(vocab)
    first = graph.input_ids[0]
    shape = graph.node(first).output_shape
    if isinstance(source, str) and graph.token_input is not None and not Path(source).expanduser().is_file():
        return typed_input(graph, source, vocab)  # "12 7 99", or words through the vocabulary
    if isinstance(source, (str, Path)) and Path(source).suffix.lower() in INPUT_FILE_SUFFIXES:
        return read_model_input(graph, source, vocab=vocab, row=row)  # anything else is an image to Pillow
    if not isinstance(source, (str, Path)):
        a = np.asarray(source)
        if graph.token_input is not None:
            return token_input(graph, a.reshape(-1) if a.ndim == 2 and len(a) == 1 else a, vocab=vocab)
        if len(graph.input_ids) == 1 and len(shape) == 2 and a.ndim == 1:
            return table_input(graph, TableRow(a.astype(np.float32), tuple(f"col{i}" for i in range(a.size))))
        if a.dtype != np.uint8 or len(shape) != 4:  # arrays as they are: checked by the engine
            return ModelInput((a,), "array", "<array>")
    img = rgb_image(load_image(source) if isinstance(source, (str, Path)) else source)
    x = prepare_input(img, shape, preprocessing)
    return ModelInput((x,), "image", str(source) if isinstance(source, (str, Path)) else "<array>", image=img)


def _check_common(**given: Any) -> None:
    """The arguments several API functions share, checked by type before any work (``vocab=123`` named as such)."""
    from gradscope.io.sequences import Vocabulary

    kinds: dict[str, tuple[tuple[type, ...], str]] = {
        "vocab": (
            (str, Path, Vocabulary, type(None)),
            "a Vocabulary, the path of a vocabulary file or folder, or None",
        ),
        "method": ((str, Method, type(None)), "a method name (gradscope methods), a Method or None"),
        "plan": ((Plan, type(None)), "a Plan (Plan.load(path)) or None"),
        "target": (
            (Target, numbers.Integral, str, type(None)),
            "a class index, a Target, a target as the CLI writes it ('7', 'neuron:NODE:i,j,c') or None",
        ),
        "safe_mode": ((bool,), "True or False"),
    }
    for name, value in given.items():
        check_argument(name, value, *kinds[name])


def _vocabulary_beside(model: Any) -> Path | None:
    """A vocabulary file beside a model given as a path (as the window and the CLI read it), else None."""
    from gradscope.app.files.session_files import find_vocabulary

    return find_vocabulary(model) if isinstance(model, (str, Path)) else None


def _inputs(engine: Any, source: Any, preprocessing: str, target: Target | int | None, **how: Any) -> tuple:
    """(``ModelInput``, the model's input batch, ``Target``) from any input and a class index."""
    fed = model_input(engine, source, preprocessing=preprocessing, **how)
    x = engine.checked_inputs(list(fed.arrays))
    if isinstance(target, str):
        target = Target.parse(target)
    elif not isinstance(target, Target):
        target = Target(index=target)  # type: ignore[arg-type]  (Target checks it is a whole number)
    return fed, (x[0] if len(x) == 1 else x), target


def explain(
    model: Any,
    image: Any,
    *,
    vocab: Any = None,
    row: int = 0,
    method: str | Method | None = "gradient",
    plan: Plan | None = None,
    target: Target | int | None = None,
    layer: str | None = None,
    preprocessing: str = "unit",
    reduction: str | None = None,
    method_options: dict[str, Any] | None = None,
    safe_mode: bool = True,
) -> Explanation:
    """Explain one input: run the method's (or the user's) plan and read the map at ``layer``.

    ``model``: a path, a keras.Model or an ``Engine`` (reuse one Engine across inputs: it caches traces).
    ``image``: any input ``model_input`` takes: an image path or uint8 (H, W, 3) array, token ids, a CSV /
    array / token file, a ``ModelInput``; ``vocab`` (a ``Vocabulary`` or its file) shows token ids as words,
    ``row`` picks a CSV row. ``target``: a class index, a ``Target`` or None (top-1).
    For token ids the map is read where the signal exists, at the embedding's output (unless ``layer`` says
    otherwise), as one score per token.
    """
    from gradscope.app.rendering.view import REDUCTIONS, ViewError, token_grid
    from gradscope.render import reduce_channels

    if reduction is not None and reduction not in REDUCTIONS:
        raise ViewError(f"Unknown channel reduction {reduction!r}; choose: {', '.join(REDUCTIONS)}.")
    _check_common(vocab=vocab, method=method, plan=plan, target=target, safe_mode=safe_mode)
    check_argument("layer", layer, (str, type(None)), "a node id or None")
    check_argument("method_options", method_options, (dict, type(None)), "a dict of the method's options or None")
    check_count("row", row, 0, 2**31)
    engine = open_engine(model, safe_mode=safe_mode)
    vocab = vocab if vocab is not None else _vocabulary_beside(model)
    fed, x, target = _inputs(engine, image, preprocessing, target, vocab=vocab, row=row)
    m = resolve_method(engine, method, plan, **(method_options or {}))
    node = layer or m.readout_node
    if node is not None and engine.graph.node(node).is_input:
        node = None
    tokens = fed.kind == "tokens"
    if tokens and node is None:  # no gradient reaches integer ids: read where the signal exists
        node = engine.graph.embedding_of(engine.graph.token_input).id
    if target.kind == "class" and engine.is_language_model():  # a language model's class is its next token
        target = target.as_token()
    result = engine.backward(x, target, m.plan, capture=[node] if node else (), stats=False)
    if node is None:
        signal, forward = result.input_grad[0], result.inputs[0][0]
    else:
        signal, forward = result.node_grads[node][0], result.node_values[node][0]
        if signal.ndim not in (2, 3) and not tokens:
            raise GraphError(
                f"Node {node!r} has output shape {engine.graph.node(node).output_shape}: a map needs a spatial "
                "(H, W[, C]) or (L, C) output. Pick a convolutional layer or the input."
            )
    from gradscope.engine.backward.attribution import sampled_input_grad, token_scores, weighted_signal
    from gradscope.rules.base import carries_relevance

    if m.sampling is not None:
        if tokens:
            raise GraphError(
                f"{m.sampling} averages gradients over noisy copies of the input, which token ids cannot be; use "
                "gradient (x input) or an LRP/MWP preset on a text model."
            )
        if node is not None:
            raise GraphError(f"{m.sampling} reads its map at the model input; drop --layer/layer={node!r}.")
        signal = sampled_input_grad(engine, x, target, m.plan, m.sampling, m.options)[0]
    if tokens:  # one score per token, summed over the embedding dimension: relevance as it is (LRP, MWP),
        # a gradient times the embedding (gradient x input) otherwise
        relevance = carries_relevance(result.rules.values())
        signal = weighted_signal(signal, forward, times_input=not relevance, grad_cam=False)
        saliency = token_scores(signal)
    else:
        signal = weighted_signal(signal, forward, times_input=m.times_input, grad_cam=m.grad_cam)
        grid = token_grid(signal) if fed.kind == "image" else None  # an image transformer: a map per patch
        signal = signal if grid is None else grid
        saliency = signal if signal.ndim == 1 else reduce_channels(signal, reduction or m.reduction)
    sidecar = {
        "model": getattr(engine.model, "name", "model"),
        "model_file": str(model) if isinstance(model, (str, Path)) else None,
        "image": fed.source,
        "preprocessing": preprocessing,
        "target": target.to_dict(),
        "predicted_class": int(result.target_indices[0]) if result.target_indices.size else None,
        "method": m.name,
        "plan": m.plan.to_dict(),
        "readout_node": node,
        "reduction": reduction or m.reduction,
    }
    if target.kind == "token":  # which token was explained, and how likely the model found it
        position = engine.token_position(target, x)
        decode = None
        if vocab is not None:
            from gradscope.io.sequences import Vocabulary

            decode = (vocab if isinstance(vocab, Vocabulary) else Vocabulary.load(vocab)).decode
        token = int(result.target_indices[0])
        sidecar["explained_token"] = next_token_summary(
            result.logits[0, position], position, token, target.contrast, decode
        )
    return Explanation(fed.image, signal, saliency, result, m, node, target, sidecar, fed)


@dataclass
class GenerationExplanation(RichDisplay):
    """A generation attributed token by token (``engine.backward.generation.Generation``): ``matrix[i, j]`` is
    context token ``j``'s score for generated token ``i``; ``labels`` name every token (prompt, then generated).
    In a notebook it shows itself as Inseq's table (HTML); ``show()`` elsewhere."""

    generation: Any
    labels: tuple[str, ...]
    method: Method
    sidecar: dict[str, Any] = field(default_factory=dict)

    _html_maker = "gradscope.app.display.explanations:generation_html"

    @property
    def matrix(self) -> np.ndarray:
        return self.generation.matrix

    @property
    def generated(self) -> np.ndarray:
        return self.generation.generated

    def picture(self) -> np.ndarray:
        from gradscope.render.positions import token_matrix

        g, labels = self.generation, self.labels
        rows = [f"{labels[g.prompt.size + i]} (p = {p:.2f})" for i, p in enumerate(g.probabilities)]
        return token_matrix(labels[: g.matrix.shape[1]], rows, g.matrix)

    def csv_text(self) -> str:
        """One row per generated token: its position, id, label, probability, then a score per context token."""
        import csv
        import io

        g, labels = self.generation, self.labels
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        context = labels[: g.matrix.shape[1]]
        writer.writerow(["position", "id", "token", "probability", *(f"{j}:{t}" for j, t in enumerate(context))])
        for i, row in enumerate(g.matrix):
            position = g.prompt.size + i
            cells = ["" if not np.isfinite(v) else repr(float(v)) for v in row]
            writer.writerow([position, int(g.generated[i]), labels[position], repr(float(g.probabilities[i])), *cells])
        return out.getvalue()

    def save(self, path: str | Path, *, inputs: Any = ()) -> Path:
        """The matrix as PNG, the scores as ``<name>_scores.csv`` and the sidecar, written together."""
        from gradscope import render
        from gradscope.app.files.exports import refuse_overwriting
        from gradscope.render.export import sidecar_text

        path = Path(path)
        if path.suffix.lower() != ".png":
            raise GraphError(f"The generation's picture is a .png file; got {path.name}.")
        table = path.with_name(path.stem + "_scores.csv")
        refuse_overwriting([path, render.sidecar_path(path), table], [self.sidecar.get("model_file"), *inputs])
        sidecar = {**self.sidecar}
        sidecar["generation"] = {**sidecar["generation"], "scores_csv": table.name}
        sidecar_text(sidecar)  # a value JSON cannot hold fails here, before anything is written
        data = self.csv_text().encode("utf-8")
        return render.save_png(path, self.picture(), sidecar, [(table, lambda fh: fh.write(data))])


def explain_generation(
    model: Any,
    prompt: Any,
    *,
    steps: int = 16,
    vocab: Any = None,
    method: str | Method | None = "attnlrp",
    plan: Plan | None = None,
    safe_mode: bool = True,
    progress: Any = None,
) -> GenerationExplanation:
    """Decode ``steps`` tokens greedily after ``prompt`` (token ids, or text with ``vocab``) and attribute each to
    the prompt and the tokens generated before it, one backward pass per token (Inseq's matrix)."""
    from gradscope.app.rendering.view import ViewSettings
    from gradscope.engine.backward.generation import MAX_GENERATE, attribute_generation
    from gradscope.rules.base import carries_relevance

    _check_common(vocab=vocab, method=method, plan=plan, safe_mode=safe_mode)
    check_count("steps", steps, 1, MAX_GENERATE)
    engine = open_engine(model, safe_mode=safe_mode)
    vocab = vocab if vocab is not None else _vocabulary_beside(model)
    fed = model_input(engine, prompt, vocab=vocab)
    if fed.kind != "tokens":
        raise GraphError("Generation needs token ids or text for a language model.")
    m = resolve_method(engine, method, plan)
    relevance = carries_relevance(r.rule.name for r in m.plan.resolve(engine.graph).rules.values())
    masks = [i for i, kind in engine.graph.token_companions.items() if kind == "mask"]
    real = int(fed.arrays[engine.graph.input_ids.index(masks[0])].sum()) if masks else len(fed.ids)
    g = attribute_generation(engine, fed.ids[:real], steps, m.plan, relevance=relevance, progress=progress)
    decode = None
    if vocab is not None:
        from gradscope.io.sequences import Vocabulary

        decode = (vocab if isinstance(vocab, Vocabulary) else Vocabulary.load(vocab)).decode
    labels = tuple(decode(g.tokens) if decode else (str(i) for i in g.tokens.tolist()))
    view = ViewSettings.for_method(m, colormap="bwr", normalization="signed")
    sidecar = {
        "model": getattr(engine.model, "name", "model"),
        "model_file": str(model) if isinstance(model, (str, Path)) else None,
        "image": fed.source,
        "target": {"kind": "token"},
        "method": m.name,
        "plan": m.plan.to_dict(),
        "readout_node": g.node,
        "view": view.to_dict(),
        "generation": {
            "prompt": g.prompt.tolist(),
            "generated": g.generated.tolist(),
            "labels": list(labels),
            "probabilities": g.probabilities.tolist(),
            "scores_csv": "",
        },
    }
    return GenerationExplanation(g, labels, m, sidecar)


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

    _check_common(method=method, plan=plan, target=target, safe_mode=safe_mode)
    engine = open_engine(model, safe_mode=safe_mode)
    _, x, target = _inputs(engine, image, preprocessing, target)
    m = resolve_method(engine, method, plan)
    return sanity_checks(engine, x, target, m.plan, method=m.name, checks=checks, tolerance=tolerance)


def evaluate(
    model: Any,
    data: Any,
    *,
    methods: Any = ("gradient",),
    plan: Plan | str | Path | None = None,
    metrics: Any = ("pointing",),
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
) -> Any:
    """Score methods over a dataset (Pointing Game, deletion, insertion, MuFidelity); returns an ``EvalReport``.

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

    engine = open_engine(model, safe_mode=safe_mode)
    settings = evaluation_settings(
        methods,
        metrics,
        plan,
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


@dataclass
class GraphPicture(RichDisplay):
    """The layer graph as the window lays it out, each box filled by its node's gradient when ``flow`` (the
    ``FlowReport`` of the input it was given) is there: ``svg()``, ``save(path)``; in a notebook it shows itself."""

    layout: Any  # render.graph_layout.GraphLayout
    flow: Any = None  # engine.diagnostics.flow.FlowReport, or None (no input: boxes are not coloured)
    title: str = ""

    _html_maker = "gradscope.app.display.reports:graph_html"

    def svg(self) -> str:
        from gradscope.render.graph_svg import NodeFlow, graph_svg

        flow = None
        if self.flow is not None:
            flow = {
                r.node: NodeFlow(None if r.status == "none" else float(r.grad_mean_abs), tuple(r.flags))
                for r in self.flow.rows
            }
        return graph_svg(self.layout, flow, title=self.title)

    def save(self, path: str | Path) -> Path:
        """The SVG, written atomically (a ``.svg`` file)."""
        from gradscope.app.files.exports import refuse_overwriting
        from gradscope.core.files import write_text_atomic

        path = Path(path)
        if path.suffix.lower() != ".svg":
            raise GraphError(f"The graph is written as an .svg file; got {path.name}.")
        refuse_overwriting([path], [])
        return write_text_atomic(path, self.svg())


def graph(
    model: Any,
    inputs: Any = None,
    labels: Any = None,
    *,
    loss: str | None = None,
    preprocessing: str = "unit",
    vocab: Any = None,
    collapsed: Any = None,
    direction: str = "TB",
    safe_mode: bool = True,
) -> GraphPicture:
    """The layer graph (``keras.utils.plot_model`` with the flow). With ``inputs`` (anything ``explain`` takes, or a
    batch array) each box is filled by its node's mean |g| for the top class, or for the loss with ``labels``
    (``gradient_flow``; a language model's next token): red where a gradient is NaN/Inf or explodes, grey where
    none arrives. ``collapsed``:
    nested-model groups drawn as one box (default: as the window opens the model)."""
    from gradscope.engine.diagnostics.flow import gradient_flow
    from gradscope.render.graph_layout import compute_layout, default_collapsed

    _check_common(vocab=vocab, safe_mode=safe_mode)
    engine = open_engine(model, safe_mode=safe_mode)
    groups = default_collapsed(engine.graph) if collapsed is None else set(collapsed)
    layout = compute_layout(engine.graph, groups, direction=direction)
    name = getattr(engine.model, "name", "model")
    if inputs is None:
        return GraphPicture(layout, None, name)
    if isinstance(inputs, np.ndarray) and inputs.ndim >= 2 and inputs.dtype.kind == "f":
        x = engine.checked_inputs([inputs])[0]  # a batch, as gradient_flow takes it
    else:
        _, x, _ = _inputs(
            engine, inputs, preprocessing, None, vocab=vocab if vocab is not None else _vocabulary_beside(model)
        )
    target = Target().as_token() if labels is None and engine.is_language_model() else None  # the next token
    flow = gradient_flow(engine, x, labels, loss, weight_grads=False, target=target)
    return GraphPicture(layout, flow, f"{name}: gradient flow of {flow.target}")
