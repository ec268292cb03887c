"""``gradscope graph``: the model's layer graph as a table (or JSON)."""

from __future__ import annotations

import argparse
from typing import Any

from gradscope.cli.common import add_command, model_argument, model_options, open_engine


def add_parser(sub: Any) -> None:
    p = add_command(sub, "graph", run, help="print the model's layer graph as a table")
    model_argument(p)
    p.add_argument("--json", action="store_true", help="print the graph as JSON")
    model_options(p)


def run(args: argparse.Namespace) -> int:
    engine = open_engine(args)
    if args.json:
        import json

        print(json.dumps(engine.graph.to_dict(), indent=2))
    else:
        print(engine.graph.to_table())
        for note in engine.graph.notes:
            print(f"\nnote: {note}")
    return 0
