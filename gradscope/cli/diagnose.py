"""``gradscope diagnose``: which trainable variables get no gradient, and the op that cuts the path."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradscope.cli import loss_inputs
from gradscope.cli.common import add_command, model_argument, open_engine
from gradscope.cli.loss_inputs import read_inputs, read_labels


def add_parser(sub: Any) -> None:
    p = add_command(
        sub,
        "diagnose",
        run,
        help="find trainable variables that get no gradient and the op that cuts the path (exit code 1 if any)",
    )
    model_argument(p)
    loss_inputs.add_options(p)


def run(args: Any) -> int:
    """``gradscope diagnose MODEL [--input F ...] [--target T | --label L [--loss NAME]] [--json]``.

    Exit code 0 when every trainable variable gets a gradient, 1 when some do not.
    """
    import json

    from gradscope.core.targets import Target
    from gradscope.engine.diagnostics.paths import diagnose_model

    engine = open_engine(args)
    xs = read_inputs(args, engine)
    labels = read_labels(getattr(args, "label", None))
    target = Target.parse(args.target) if getattr(args, "target", None) else None
    if labels is not None or getattr(args, "loss", None):
        target = Target(kind="loss", loss=getattr(args, "loss", None), node=getattr(args, "output", None))
    if labels is not None and labels.ndim == 1 and labels.size == 1:
        labels = np.repeat(labels, len(xs[0]) if xs else 2)
    report = diagnose_model(engine, None if xs is None else (xs if len(xs) > 1 else xs[0]), target, labels=labels)
    print(json.dumps(report.to_dict(), indent=2, default=str) if getattr(args, "json", False) else report.to_text())
    return 0 if report.ok else 1
