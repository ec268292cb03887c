"""One case of ``scripts/bad_input_sweep.py``: what to run and how it must end (shared by the sweep and its rounds
kept in their own files, such as ``bad_input_round_six.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Case:
    group: str
    name: str
    args: list[str]
    expect: str = "error"  # "error": exit 2 with one line; "ok": exit 0; "strict": exit 1 (--strict's failure)
    must_say: str = ""  # text the output must contain (case-insensitive)
    check: Callable[[], str] | None = None  # after the run: "" when all is well, else what went wrong
    must_not_say: str = ""  # text the output must not contain (a false report)
    python: str = ""  # a Python API call to try in place of the CLI (a GradscopeError prints "error: ...", exit 2)


def write(path: Path, text: str | bytes) -> str:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def api(call: str) -> str:
    """A Python program that makes one API call: a ``GradscopeError`` ends it as the CLI would (exit 2, one line)."""
    return (
        "import sys\nimport gradscope.api as gs\nimport gradscope\nfrom gradscope import GradientMonitor\n"
        "from gradscope.core.errors import GradscopeError\n"
        f"try:\n    {call}\nexcept GradscopeError as exc:\n    print(f'error: {{exc}}')\n    sys.exit(2)\n"
    )
