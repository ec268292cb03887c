"""The batch and labels a loss is computed on, as ``flow`` and ``diagnose`` read them from the command line."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.cli.common import PREPROCESSING, model_options


def add_options(p: argparse.ArgumentParser) -> None:
    """``--input``, ``--label``, ``--loss``, ``--output``, ``--target``, ``--preprocessing``, ``--json`` and the model
    options."""
    p.add_argument(
        "--input",
        action="append",
        metavar="FILE",
        help="input: image, .npy, or .npz with one array per model input (repeatable; default: random)",
    )
    p.add_argument("--label", help="labels for the loss: class indices (3 or 0,2,1) or a .npy file")
    p.add_argument(
        "--loss",
        choices=["auto", "compiled", "crossentropy", "mse"],
        help="loss for --label (default auto: compiled if any, else crossentropy for classifiers, else mse)",
    )
    p.add_argument("--output", help="multi-output models: the output node the loss reads (default: all, compiled)")
    p.add_argument("--target", help="without --label: class index, 'top', 'neuron:NODE:i,j,c' or 'channel:NODE:c'")
    p.add_argument(
        "--preprocessing",
        default="unit",
        choices=PREPROCESSING,
        help="how image pixels are scaled (default unit: /255)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    model_options(p)


def read_inputs(args: Any, engine: Any) -> list[np.ndarray] | None:
    """Model inputs from ``--input`` files: .npy (one array), .npz (one array per model input), or images."""
    from gradscope.core.errors import ImageLoadError
    from gradscope.io.arrays import read_arrays

    files = list(getattr(args, "input", None) or [])
    if not files:
        return None
    input_ids = engine.graph.input_ids
    arrays: list[np.ndarray] = []
    for f in files:
        p = Path(f).expanduser()
        if not p.is_file():
            raise ImageLoadError(f"Input file not found: {p}")
        if p.suffix.lower() in (".npy", ".npz"):
            named = read_arrays(p)
            if set(named) >= set(input_ids) and len(input_ids) > 1:  # an .npz named as the inputs
                named = {k: named[k] for k in input_ids}
            arrays.extend(named.values())
        else:
            from gradscope.io.images import load_image, prepare_input

            which = input_ids[min(len(arrays), len(input_ids) - 1)]
            shape = engine.graph.node(which).output_shape
            arrays.append(prepare_input(load_image(p), shape, getattr(args, "preprocessing", "unit")))
    if len(input_ids) == 1 and len(arrays) > 1:  # several files for one input: one batch
        arrays = [
            np.concatenate(
                [a if a.ndim == len(engine.graph.node(input_ids[0]).output_shape) else a[None] for a in arrays]
            )
        ]
    if len(arrays) != len(input_ids):
        raise ImageLoadError(
            f"The model takes {len(input_ids)} inputs ({', '.join(input_ids)}); got {len(arrays)} array(s). "
            "Give one --input per model input, or one .npz file holding them in order."
        )
    return engine.checked_inputs(arrays)  # shape and dtype per input, before labels are matched to the batch


def random_inputs(engine: Any, batch: int = 8) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for node_id in engine.graph.input_ids:
        shape = [d if d is not None else 32 for d in engine.graph.node(node_id).output_shape[1:]]
        out.append(rng.normal(size=(batch, *shape)).astype(np.float32))
    return out


def read_labels(text: str | None) -> np.ndarray | None:
    from gradscope.core.errors import TargetError

    if text is None:
        return None
    p = Path(text).expanduser()
    if p.suffix.lower() == ".npy":
        if not p.is_file():
            raise TargetError(f"Labels file not found: {p}")
        return np.load(p, allow_pickle=False)
    parts = [s.strip() for s in text.split(",") if s.strip()]
    try:
        values = [float(s) for s in parts]
    except ValueError:
        raise TargetError(f"Cannot read labels {text!r}: give class indices like 3 or 0,2,1, or a .npy file.") from None
    if all(v == int(v) for v in values):
        return np.array([int(v) for v in values], np.int64)
    return np.array(values, np.float32)
