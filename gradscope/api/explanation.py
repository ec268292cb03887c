"""``explain``: one input's map under a method or plan, and the ``Explanation`` it returns (saved, shown, exported
as every front end does)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.api.inputs import (
    check_common,
    engine_for,
    inputs_of,
    model_input,
    refuse_sampling,
    resolve_method,
    vocabulary,
)
from gradscope.core.arguments import check_argument, check_count
from gradscope.core.display import RichDisplay
from gradscope.core.errors import GraphError
from gradscope.core.results import BackwardResult
from gradscope.core.targets import Target, next_token_summary
from gradscope.io.model_inputs import ModelInput
from gradscope.rules.methods import Method
from gradscope.rules.plan import Plan

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

    def summary(self) -> str:
        what = f"class {self.predicted_class}" if not self.sidecar.get("explained_token") else "next token"
        model = self.sidecar.get("model", "model")
        return f"<Explanation: {model} · {self.method.name} · {what}; map {self.saliency.shape}>"

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
            alternate=self.sidecar.get("alternate"),
            token_score=self.sidecar.get("token_score"),
        )


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
    alternate: Any = None,
    safe_mode: bool = True,
) -> Explanation:
    """Explain one input: run the method's (or the user's) plan and read the map at ``layer``.

    ``model``: a path, a keras.Model or an ``Engine`` (reuse one Engine across inputs: it caches traces).
    ``image``: any input ``model_input`` takes: an image path or uint8 (H, W, 3) array, token ids, a CSV /
    array / token file, a ``ModelInput``; ``vocab`` (a ``Vocabulary`` or its file) shows token ids as words,
    ``row`` picks a CSV row. ``target``: a class index, a ``Target`` or None (top-1). ``alternate``: another input
    of the same shape, read by the plan's value rules (``substitute_value`` / ``patch_value`` with source "input").
    For token ids the map is read where the signal exists, at the embedding's output (unless ``layer`` says
    otherwise), as one score per token.
    """
    from gradscope.app.rendering.view import REDUCTIONS, ViewError, token_grid
    from gradscope.render import reduce_channels

    if reduction is not None and reduction not in REDUCTIONS:
        raise ViewError(f"Unknown channel reduction {reduction!r}; choose: {', '.join(REDUCTIONS)}.")
    check_common(vocab=vocab, method=method, plan=plan, target=target, safe_mode=safe_mode)
    check_argument("layer", layer, (str, type(None)), "a node id or None")
    check_argument("method_options", method_options, (dict, type(None)), "a dict of the method's options or None")
    check_count("row", row, 0, 2**31)
    engine = engine_for(model, safe_mode=safe_mode)
    vocab = vocabulary(vocab, model, image)
    fed, x, target = inputs_of(engine, image, preprocessing, target, vocab=vocab, row=row)
    m = resolve_method(engine, method, plan, **(method_options or {}))
    node = layer or m.readout_node
    if node is not None and engine.graph.node(node).is_input:
        node = None
    tokens = fed.kind == "tokens"
    if tokens and node is None:  # no gradient reaches integer ids: read where the signal exists
        node = engine.graph.embedding_of(engine.graph.token_input).id
    if target.kind == "class" and engine.is_language_model():  # a language model's class is its next token
        target = target.as_token()
    other, other_source = None, None  # the input the plan's value rules read (source "input")
    if alternate is not None:
        fed_other = model_input(engine, alternate, vocab=vocab, preprocessing=preprocessing)
        other, other_source = engine.checked_inputs(list(fed_other.arrays)), fed_other.source
    result = engine.backward(x, target, m.plan, capture=[node] if node else (), stats=False, alternate=other)
    if node is None:
        signal, forward = result.input_grad[0], result.inputs[0][0]
    else:
        signal, forward = result.node_grads[node][0], result.node_values[node][0]
        if signal.ndim not in (2, 3) and not tokens:
            raise GraphError(
                f"Node {node!r} has output shape {engine.graph.node(node).output_shape}: a map needs a spatial "
                "(H, W[, C]) or (L, C) output. Pick a convolutional layer or the input."
            )
    from gradscope.engine.backward.attribution import (
        TOKEN_READOUTS,
        sampled_input_grad,
        token_map,
        token_readout,
        weighted_signal,
    )

    if m.sampling is not None:
        if tokens:
            refuse_sampling(m)
        if node is not None:
            raise GraphError(f"{m.sampling} reads its map at the model input; drop --layer/layer={node!r}.")
        signal = sampled_input_grad(engine, x, target, m.plan, m.sampling, m.options)[0]
    readout = None
    if tokens:  # one score per token: relevance as it is (LRP, MWP), gradient x embedding, or the gradient's norm
        readout = token_readout(result.rules.values(), times_input=m.times_input)
        saliency = token_map(signal, forward, readout)
        signal = weighted_signal(signal, forward, times_input=readout == "gradient_x_embedding", grad_cam=False)
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
        "alternate": other_source,
    }
    if readout is not None:
        sidecar["token_score"] = TOKEN_READOUTS[readout]
    if target.kind == "token":  # which token was explained, and how likely the model found it
        position = engine.token_position(target, x)
        decode = vocab.decode if vocab is not None else None
        token = int(result.target_indices[0])
        sidecar["explained_token"] = next_token_summary(
            result.logits[0, position], position, token, target.contrast, decode
        )
    return Explanation(fed.image, signal, saliency, result, m, node, target, sidecar, fed)
