"""What every front-door function shares: the engine of a model, a method from a preset or a plan, any input
as the model's batch, the vocabulary that reads it, and the type checks of common arguments."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.arguments import check_argument
from gradscope.core.errors import GraphError, PlanError
from gradscope.core.resources import bundled
from gradscope.core.targets import Target
from gradscope.io.model_inputs import ModelInput
from gradscope.rules.methods import Method, build_method
from gradscope.rules.plan import Plan


def open_engine(
    model: Any,
    *,
    safe_mode: bool = True,
    custom_objects: dict | None = None,
    dtype: str = "auto",
    progress: Callable[[int, int], None] | None = None,
) -> Any:
    """An ``Engine`` for a model object, an ``Engine`` (returned as is), a path to a ``.keras``/``.h5`` file or a
    checkpoint folder (Hugging Face, keras_hub; ``dtype``: "auto", the checkpoint's own, or float32, bfloat16,
    float16; ``progress(bytes read, bytes in all)`` while its weights are read)."""
    from gradscope.engine.backward.runner import Engine

    if isinstance(model, Engine):
        return model
    if isinstance(model, (str, Path)):
        from gradscope.io.models import load_model

        model = load_model(model, safe_mode=safe_mode, custom_objects=custom_objects, dtype=dtype, progress=progress)
    return Engine(model)


_OPENED: dict[tuple, Any] = {}  # the models the path-taking functions opened last (``engine_for``)
_KEPT = 2


def engine_for(model: Any, *, safe_mode: bool = True, dtype: str = "auto") -> Any:
    """``open_engine`` for the front-door functions: a path opened by an earlier call (the same file or folder,
    unchanged since, in the same mode) is reused, so a notebook's ``gs.explain(folder, ...)`` cells load the folder
    once and its model keeps its name (Keras numbered each new copy ``gpt2_causal_lm_1``, ``_2``...). The two
    most recent are kept; ``open_engine`` itself always opens anew."""
    if not isinstance(model, (str, Path)):
        return open_engine(model, safe_mode=safe_mode, dtype=dtype)
    path = Path(bundled(model)).expanduser()
    try:
        stamp = max(f.stat().st_mtime_ns for f in ([path, *path.iterdir()] if path.is_dir() else [path]))
        key = (str(path.resolve()), stamp, safe_mode, dtype)
    except OSError:  # missing or unreadable: opening says why
        return open_engine(model, safe_mode=safe_mode, dtype=dtype)
    if key not in _OPENED:
        _OPENED[key] = open_engine(model, safe_mode=safe_mode, dtype=dtype)
        while len(_OPENED) > _KEPT:
            _OPENED.pop(next(iter(_OPENED)))
    return _OPENED[key]


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


def refuse_sampling(m: Method) -> None:
    raise GraphError(
        f"{m.sampling} averages gradients over noisy copies of the input, which token ids cannot be; use "
        "gradient (x input) or an LRP/MWP preset on a text model."
    )


def model_input(
    engine: Any, source: Any, *, preprocessing: str = "unit", vocab: Any = None, row: int = 0
) -> ModelInput:
    """Any input as the model's batch (``io.model_inputs``): an image (path or uint8 array), token ids (an
    integer array or list for a model whose input is integer, or typed: ``"12 7 99"``, or text with ``vocab``), a
    ``.npy``/``.npz``/``.csv``/``.txt``/``.json`` file, a float array, or a ``ModelInput``. ``vocab``: a
    ``Vocabulary``, the path of one, or a keras_hub tokenizer's preset folder."""
    from gradscope.core.files import is_file_named
    from gradscope.io.images import load_image, prepare_input, rgb_image
    from gradscope.io.model_inputs import INPUT_FILE_SUFFIXES, read_model_input, table_input, token_input, typed_input
    from gradscope.io.sequences import TableRow, Vocabulary

    if isinstance(source, ModelInput):
        return source
    source, vocab = bundled(source), bundled(vocab)  # demo:NAME: a bundled file, from any folder
    graph = engine.graph
    if isinstance(vocab, (str, Path)):
        vocab = Vocabulary.load(vocab)
    first = graph.input_ids[0]
    shape = graph.node(first).output_shape
    if isinstance(source, str) and graph.token_input is not None and not is_file_named(source):
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


def check_common(**given: Any) -> None:
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


def vocabulary(vocab: Any, model: Any, source: Any) -> Any:
    """The ``Vocabulary`` that reads ``source`` and names its tokens: ``vocab`` (loaded once), else the one beside
    a model given as a path (as the window and the CLI read it: a vocabulary file, a checkpoint folder's
    tokenizer), else None. A tokenizer beside the model that cannot be read stops only text, which needs it: token
    ids run, shown as ids."""
    from gradscope.app.files.session_files import find_vocabulary
    from gradscope.core.errors import GradscopeError
    from gradscope.core.files import is_file_named
    from gradscope.io.sequences import Vocabulary

    if vocab is not None:
        return Vocabulary.load(vocab) if isinstance(vocab, (str, Path)) else vocab
    found = find_vocabulary(bundled(model)) if isinstance(model, (str, Path)) else None
    if found is None:
        return None
    try:
        return Vocabulary.load(found)
    except GradscopeError:
        if isinstance(source, str) and not is_file_named(source) and not _are_ids(source):
            raise  # text, which needs the tokenizer: its own error says what is wrong with it
        return None


def _are_ids(text: str) -> bool:
    from gradscope.core.errors import GradscopeError
    from gradscope.io.sequences import parse_token_ids

    try:
        parse_token_ids(text)
    except GradscopeError:
        return False
    return True


def inputs_of(engine: Any, source: Any, preprocessing: str, target: Target | int | None, **how: Any) -> tuple:
    """(``ModelInput``, the model's input batch, ``Target``) from any input and a class index."""
    fed = model_input(engine, source, preprocessing=preprocessing, **how)
    x = engine.checked_inputs(list(fed.arrays))
    if isinstance(target, str):
        target = Target.parse(target)
    elif not isinstance(target, Target):
        target = Target(index=target)  # type: ignore[arg-type]  (Target checks it is a whole number)
    return fed, (x[0] if len(x) == 1 else x), target
