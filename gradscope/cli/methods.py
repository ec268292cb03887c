"""``gradscope methods``: the method presets."""

from __future__ import annotations

import argparse
from typing import Any

from gradscope.cli.common import add_command


def add_parser(sub: Any) -> None:
    add_command(sub, "methods", run, help="list method presets")


def run(args: argparse.Namespace) -> int:
    from gradscope.rules.methods import available_methods

    for name, summary in available_methods().items():
        print(f"{name:<20} {summary}")
    return 0
