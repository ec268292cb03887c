"""What made a displayed result or a report: the versions of gradscope and the libraries it ran on, read from the
installed distributions (no TensorFlow import), the Python and the time."""

from __future__ import annotations

import platform
import time
from importlib import metadata

DISTRIBUTIONS = ("gradscope", "keras", "tensorflow", "tensorflow-cpu", "keras-hub", "numpy")


def versions() -> list[tuple[str, str]]:
    rows = []
    for name in DISTRIBUTIONS:
        try:
            rows.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            continue
    if not any(name == "gradscope" for name, _ in rows):  # run from a checkout that is not installed
        import gradscope

        rows.insert(0, ("gradscope", gradscope.__version__))
    rows.append(("python", f"{platform.python_version()} ({platform.system()} {platform.machine()})"))
    rows.append(("made", time.strftime("%Y-%m-%d %H:%M:%S %Z")))
    return rows
