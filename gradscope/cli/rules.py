"""``gradscope rules``: the backward rules and their parameters (and the plugins installed packages offer)."""

from __future__ import annotations

import argparse
from typing import Any

from gradscope.cli.common import add_command


def add_parser(sub: Any) -> None:
    p = add_command(sub, "rules", run, help="list backward rules and their parameters")
    p.add_argument("--rules", action="append", metavar="FILE", help="also load user rules from FILE")


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from gradscope.rules.base import available_rules, load_rule_file, rule_plugins, rule_source

    for path in args.rules or []:
        load_rule_file(path)
    for name, cls in available_rules().items():
        if name.startswith("_"):
            continue
        params = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(cls.Params))
        source = rule_source(name)
        origin = "" if source == "builtin" else f"  (from {source})"
        print(f"{name:<24} {cls.describe()}" + (f"  [{params}]" if params else "") + origin)
    plugins = rule_plugins()
    if plugins and not args.rule_plugins:
        print("\nInstalled rule plugins (not loaded: they are code; add --rule-plugins to load them):")
        for plugin in plugins:
            print(f"  {plugin.describe()}")
    return 0
