"""The headless front end: ``gradscope graph | explain | snippet | sanity | methods | rules | flow | diagnose |
train-report | evaluate | report | gui``, one module per command (each an ``add_parser`` and a ``run``); this
module only builds the parser from them and dispatches.

Every error a user can cause is a ``GradscopeError`` and is printed as one clear line (exit code 2); anything
else is a bug and says so (exit code 3; ``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from gradscope.cli import (
    diagnose,
    evaluate,
    explain,
    flow,
    graph,
    methods,
    patch,
    report,
    rules,
    sanity,
    snippet,
    train_report,
)
from gradscope.cli.common import info
from gradscope.cli.interrupt import exit_on_interrupt_in_native_code
from gradscope.core.errors import EXIT_BUG, EXIT_USER_ERROR, GradscopeError, is_interrupt

__all__ = ["EXIT_BUG", "EXIT_USER_ERROR", "build_parser", "main"]

#: The commands in the order ``--help`` lists them.
COMMANDS = (graph, explain, patch, snippet, sanity, methods, rules, flow, diagnose, train_report, evaluate, report)


def version_line() -> str:
    """``gradscope X (TensorFlow Y as <distribution>; Keras Z)``, read from the installed metadata: no import of
    TensorFlow, so it answers at once and also where TensorFlow is missing."""
    from importlib import metadata

    from gradscope import __version__

    def installed(*names: str) -> tuple[str, str] | None:
        for name in names:
            try:
                return metadata.version(name), name
            except metadata.PackageNotFoundError:
                continue
        return None

    tf = installed("tensorflow", "tensorflow-cpu", "tf-nightly", "tensorflow-macos")
    keras = installed("keras")
    tf_text = f"{tf[0]} as {tf[1]}" if tf else "not installed"
    return f"gradscope {__version__} (TensorFlow {tf_text}; Keras {keras[0] if keras else 'not installed'})"


class _VersionAction(argparse.Action):
    """``--version``: the metadata is read only when asked (~20 ms otherwise spent on every command)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        parser.exit(message=version_line() + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradscope", description="Visual debugger for gradients of Keras 3 models (TensorFlow backend)."
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="show gradscope's, TensorFlow's and Keras' versions and exit"
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only results")
    parser.add_argument(
        "--rule-plugins",
        action="store_true",
        help="also load the rule plugins installed packages offer (code: see `gradscope rules`)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    # Listed for --help only: main() hands `gui ...` to the window's own parser (qt.app) before parsing.
    sub.add_parser(
        "gui",
        help="open the desktop GUI",
        description="Open the desktop GUI. It also takes the window's options: --screenshot PNG, --size WxH, "
        "--select NODE, --method NAME, --rule RULE, --no-demo, ... (`gradscope gui -h` lists them all).",
        add_help=False,
    )
    return parser


def bundled(word: str) -> str:
    """``demo:NAME`` (or ``--flag=demo:NAME``) as the path of the bundled demo file or folder NAME, wherever
    gradscope is installed: ``gradscope explain demo:shapes_cnn.keras demo:images/circle_0.png`` runs from any
    folder (``resources/demo/...`` works only in a checkout); ``demo:`` alone is the demo folder."""
    from gradscope.core.resources import bundled as resolved

    flag, eq, value = word.partition("=") if word.startswith("--") else ("", "", word)
    return f"{flag}{eq}{resolved(value)}"  # anything but demo:NAME comes back as it was


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = [bundled(w) for w in (sys.argv[1:] if argv is None else argv)]
    command = next((w for w in words if not w.startswith("-")), None)
    if command == "gui":  # the window parses its own options (--screenshot, --size, --select, ...): qt.app
        from gradscope.qt.app import main as gui_main

        return gui_main(words[words.index("gui") + 1 :])
    args = parser.parse_args(words)
    if argv is None and args.command != "gui":  # a real command line (the GUI handles its own shutdown)
        exit_on_interrupt_in_native_code()
    try:
        if args.rule_plugins:
            from gradscope.rules.base import load_rule_plugins

            loaded = load_rule_plugins()
            info(args, f"rule plugins: loaded {', '.join(loaded) or 'no rules'}")
        return int(args.func(args) or 0)
    except GradscopeError as exc:
        print(f"gradscope: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("gradscope: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: say so plainly, traceback only on request
        if is_interrupt(exc):  # Ctrl-C inside a C function that returned a value: still an interrupt
            print("gradscope: interrupted", file=sys.stderr)
            return 130
        if args.debug:
            raise
        print(
            f"gradscope: internal error: {type(exc).__name__}: {exc}\n"
            "This is a bug in gradscope; rerun with --debug for the traceback and please report it.",
            file=sys.stderr,
        )
        return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
