"""``explain_generation``: a greedy generation attributed token by token (Inseq's matrix)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.api.inputs import (
    check_common,
    engine_for,
    model_input,
    refuse_sampling,
    resolve_method,
    vocabulary,
)
from gradscope.core.arguments import check_count
from gradscope.core.display import RichDisplay
from gradscope.core.errors import GraphError
from gradscope.rules.methods import Method
from gradscope.rules.plan import Plan


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

    def summary(self) -> str:
        return f"<GenerationExplanation: {len(self.generated)} tokens generated, attributed by {self.method.name}>"

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
    from gradscope.engine.backward.attribution import TOKEN_READOUTS, token_readout
    from gradscope.engine.backward.generation import MAX_GENERATE, attribute_generation

    check_common(vocab=vocab, method=method, plan=plan, safe_mode=safe_mode)
    check_count("steps", steps, 1, MAX_GENERATE)
    engine = engine_for(model, safe_mode=safe_mode)
    vocab = vocabulary(vocab, model, prompt)
    fed = model_input(engine, prompt, vocab=vocab)
    if fed.kind != "tokens":
        raise GraphError("Generation needs token ids or text for a language model.")
    m = resolve_method(engine, method, plan)
    if m.sampling is not None:
        refuse_sampling(m)
    rules = [r.rule.name for r in m.plan.resolve(engine.graph).rules.values()]
    readout = token_readout(rules, times_input=m.times_input)
    masks = [i for i, kind in engine.graph.token_companions.items() if kind == "mask"]
    real = int(fed.arrays[engine.graph.input_ids.index(masks[0])].sum()) if masks else len(fed.ids)
    g = attribute_generation(engine, fed.ids[:real], steps, m.plan, readout=readout, progress=progress)
    labels = tuple(vocab.decode(g.tokens) if vocab is not None else (str(i) for i in g.tokens.tolist()))
    view = ViewSettings.for_method(m, colormap="bwr", normalization="signed")
    sidecar = {
        "model": getattr(engine.model, "name", "model"),
        "model_file": str(model) if isinstance(model, (str, Path)) else None,
        "image": fed.source,
        "target": {"kind": "token"},
        "method": m.name,
        "plan": m.plan.to_dict(),
        "readout_node": g.node,
        "token_score": TOKEN_READOUTS[readout],
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
