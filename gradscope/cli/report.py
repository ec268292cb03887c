"""``gradscope report RUN --out report.html``: one self-contained HTML page of an evaluation folder, a training log
folder or a folder of exported explanations (``gradscope.app.display.run_page``)."""

from __future__ import annotations

from typing import Any

from gradscope.cli.common import add_command, info, warn


def add_parser(sub: Any) -> None:
    p = add_command(
        sub,
        "report",
        run,
        help="one self-contained HTML page of an evaluation, a training log or exported explanations",
    )
    p.add_argument(
        "run", help="an evaluation --out folder, a GradientMonitor log folder, or a folder of exported PNGs + sidecars"
    )
    p.add_argument("--out", required=True, metavar="FILE.html", help="the page to write (opens offline, no server)")


def run(args: Any) -> int:
    from gradscope.app.display.run_page import write_report

    written = write_report(args.run, args.out)
    if written.left_out:
        listed = "\n  ".join(written.left_out)
        warn(args, f"warning: {len(written.left_out)} file(s) left out of the page:\n  {listed}")
    info(args, f"wrote {written.path}")
    return 0
