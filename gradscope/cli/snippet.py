"""``gradscope snippet``: a plan as a Python training script (``plan_model``)."""

from __future__ import annotations

import argparse
from typing import Any

from gradscope.cli.common import add_command, demo_model, info, model_argument, model_options, open_engine


def add_parser(sub: Any) -> None:
    p = add_command(sub, "snippet", run, help="write a Python training script that uses a plan (plan_model)")
    model_argument(p)
    p.add_argument("--method", help="method preset whose plan to use (see `gradscope methods`)")
    p.add_argument("--plan", help="plan JSON file (overrides --method)")
    p.add_argument("--out", default="train_with_plan.py", help="output .py file")
    model_options(p)


def run(args: argparse.Namespace) -> int:
    from gradscope.app.files.exports import write_plan_snippet
    from gradscope.rules.methods import build_method
    from gradscope.rules.plan import Plan

    engine = open_engine(args)
    plan = Plan.load(args.plan) if args.plan else build_method(args.method or "gradient", engine.graph).plan
    plan.resolve(engine.graph)  # an unknown node or rule is an error now, not in the training script
    path = write_plan_snippet(args.out, plan, args.model or demo_model(), method=args.method or "")
    entries = len(plan.entries)
    info(args, f"wrote {path} ({entries} plan {'entry' if entries == 1 else 'entries'})")
    return 0
