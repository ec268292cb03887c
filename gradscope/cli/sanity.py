"""``gradscope sanity``: conservation, model randomisation and finite differences of a method or plan."""

from __future__ import annotations

import argparse
from typing import Any

from gradscope.cli.common import add_command, demo_image, model_argument, model_options, open_engine
from gradscope.core.errors import GradscopeError

CHECKS = ("conservation", "randomisation", "finite_differences")


def add_parser(sub: Any) -> None:
    p = add_command(
        sub, "sanity", run, help="sanity checks of a method or plan: conservation, randomisation, finite diffs"
    )
    model_argument(p)
    p.add_argument("image", nargs="?", help="image file (default: a bundled demo image)")
    p.add_argument("--method", help="method preset (default: gradient)")
    p.add_argument("--plan", help="plan JSON file (overrides --method's plan)")
    p.add_argument("--target", help="class index or 'top' (default)")
    p.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated subset of {', '.join(CHECKS)}")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 when conservation or finite differences fail")
    model_options(p)


def run(args: argparse.Namespace) -> int:
    from gradscope.api import sanity
    from gradscope.core.targets import Target
    from gradscope.rules.plan import Plan

    checks = tuple(c.strip() for c in args.checks.split(",") if c.strip())
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise GradscopeError(f"Unknown check(s) {', '.join(unknown)}; choose from {', '.join(CHECKS)}.")
    report = sanity(
        open_engine(args),
        args.image or demo_image(),
        method=None if args.plan and not args.method else (args.method or "gradient"),
        plan=Plan.load(args.plan) if args.plan else None,
        target=Target.parse(args.target),
        checks=checks,
    )
    if args.json:
        import json

        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.to_text())
    failed = any(r.flagged for r in report.conservation) or any(r.flagged for r in report.finite_differences)
    return 1 if args.strict and failed else 0
