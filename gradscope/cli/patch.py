"""``gradscope patch MODEL --clean ... --corrupt ...``: activation and attribution patching (exact, AtP, AtP*) over
every block and position (or an image's grid cells) as a heat map PNG, its CSV and sidecar."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gradscope.cli.common import (
    add_command,
    demo_model,
    distinct_outputs,
    info,
    model_argument,
    model_options,
    next_token_options,
    next_token_target,
    open_engine,
    ray_options,
    ray_options_of,
)


def add_parser(sub: Any) -> None:
    p = add_command(
        sub, "patch", run, help="activation / attribution patching: each component x position, clean vs corrupted"
    )
    model_argument(p)
    p.add_argument(
        "--clean", required=True, help="the clean input: text, token ids ('12 7 99'), or a file (image, ...)"
    )
    p.add_argument("--corrupt", required=True, help="the corrupted input, aligned with --clean (as many tokens)")
    p.add_argument("--method", default="atp", choices=("exact", "atp", "atp_star"), help="default: atp")
    p.add_argument(
        "--component",
        default="resid",
        help="transformer parts, comma-separated: resid, attn, mlp, q, k, v (default: resid)",
    )
    p.add_argument("--node", action="append", metavar="NODE", help="a node to patch instead (repeatable; any model)")
    p.add_argument("--grid", type=int, default=7, help="image models: cells a side (default 7)")
    p.add_argument("--metric", default="logit", choices=("logit", "probability", "loss"), help="default: logit")
    p.add_argument("--target", help="classifiers: the class measured (default: the clean input's top class)")
    next_token_options(p)
    p.add_argument("--vocab", metavar="FILE", help="vocabulary for text (a checkpoint folder's tokenizer by default)")
    p.add_argument("--compare", action="store_true", help="also the exact effects, and the estimate's agreement")
    p.add_argument("--out", default="patching.png", help="the heat map PNG (+ _effects.csv and a JSON sidecar)")
    ray_options(p, "the exact rows")
    model_options(p)


def run(args: argparse.Namespace) -> int:
    from gradscope.api import patch
    from gradscope.core.targets import Target

    if not args.vocab and args.model:  # as explain does: the model's own vocabulary (data, never code)
        from gradscope.app.files.session_files import find_vocabulary

        found = find_vocabulary(args.model)
        args.vocab = str(found) if found is not None else None
    distinct_outputs({"--out": args.out}, [args.model, args.vocab])
    ray = ray_options_of(args)
    engine = open_engine(args)
    target = next_token_target(args, engine) or Target.parse(args.target)

    def show(done: int, total: int) -> None:
        if not args.quiet and total:
            sys.stderr.write(f"\r  {done}/{total} patches")
            sys.stderr.flush()

    try:
        result = patch(
            engine, args.clean, args.corrupt, target=target, metric=args.metric, components=args.component,
            nodes=args.node, method=args.method, grid=args.grid, compare=args.compare, vocab=args.vocab,
            progress=show, ray=ray,
        )  # fmt: skip
    finally:
        if not args.quiet:
            sys.stderr.write("\n")
    result.sidecar["model_file"] = args.model or demo_model()
    path = result.save(args.out, inputs=[args.vocab])
    info(
        args, f"{result.method}: {result.metric}; clean {result.clean_value:.4g}, corrupted {result.corrupt_value:.4g}"
    )
    for component, effects in result.by_component.items():
        block, unit = divmod(int(abs(effects).argmax()), effects.shape[1])
        info(args, f"  {component}: largest at block {block}, {result.units[unit]!r} ({effects[block, unit]:+.4g})")
    for component, agreement in result.agreement.items():
        wrong = f", sign wrong at {len(agreement.wrong_sign)} cell(s)" if agreement.wrong_sign else ""
        info(
            args,
            f"  {component}: against exact, correlation {agreement.correlation:.3f}, top-{agreement.top_k} overlap "
            f"{agreement.top_k_overlap:.0%}{wrong}",
        )
    info(args, f"wrote {path}")
    return 0
