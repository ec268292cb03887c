"""Entry point of the desktop bundle: ``gradscope`` opens the GUI (on the demo, or on ``MODEL [IMAGE]``), and
``gradscope COMMAND ...`` (``explain``, ``graph``, ``diagnose``, ``--version``, ...) runs the CLI, so the one
bundled program does both."""

import sys


def _cli_commands() -> set[str]:
    import argparse

    from gradscope.cli import build_parser

    parser = build_parser()
    commands = {"-h", "--help", "--version", "--debug", "-q", "--quiet", "--rule-plugins"}
    for action in parser._actions:  # argparse has no public accessor for subcommand names
        if isinstance(action, argparse._SubParsersAction):
            commands |= set(action.choices)
    return commands


def main() -> int:
    args = sys.argv[1:]
    if args and args[0] in _cli_commands() and args[0] != "gui":
        from gradscope.cli import main as cli_main

        return cli_main(args)
    from gradscope.qt.app import main as gui_main

    return gui_main(args[1:] if args[:1] == ["gui"] else args)


if __name__ == "__main__":
    sys.exit(main())
