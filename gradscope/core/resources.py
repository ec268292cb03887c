"""Where gradscope's own files are: ``resources/`` in a checkout, the package ``gradscope.resources`` once
installed (the build maps the folder into the package, see setup.py), or inside a PyInstaller bundle."""

from __future__ import annotations

import sys
from functools import cache
from importlib import resources
from pathlib import Path, PurePath
from typing import Any


@cache
def resource_root() -> Path:
    """The folder holding ``demo/``, ``icons/``, ``rules/`` and ``hypernet/``."""
    bundle = getattr(sys, "_MEIPASS", None)
    if getattr(sys, "frozen", False) and bundle:
        return Path(bundle) / "gradscope" / "resources"
    try:
        root = resources.files("gradscope.resources")
    except ModuleNotFoundError:  # a checkout on sys.path without an install
        return Path(__file__).resolve().parents[2] / "resources"
    # Installs are plain folders (pip unpacks wheels): Keras and Qt need real paths, not a Traversable.
    return Path(str(root))


DEMO_PREFIX = "demo:"


def bundled(path: Any) -> Any:
    """``demo:NAME`` as the path of the bundled demo file or folder NAME (``demo:`` alone: the demo folder), wherever
    gradscope is installed, so the README's and the guides' examples run from any folder; anything else as it is."""
    if isinstance(path, (str, PurePath)) and str(path).startswith(DEMO_PREFIX):
        name = str(path)[len(DEMO_PREFIX) :]
        return str(resource_path("demo", *PurePath(name).parts)) if name else str(resource_path("demo"))
    return path


def resource_path(*parts: str) -> Path:
    """A file or folder under the resources, e.g. ``resource_path("icons", "gradscope.svg")``."""
    return resource_root().joinpath(*parts)


def is_bundled(path: str | Path) -> bool:
    """Whether ``path`` lies among gradscope's own files (inside the installed package, for a wheel): nothing the
    user makes is written there."""
    try:
        return Path(path).expanduser().resolve().is_relative_to(resource_root().resolve())
    except (OSError, RuntimeError):
        return False


def user_folder() -> Path:
    """Where results of gradscope's own files go when the user named no folder: ``~/gradscope``."""
    return Path.home() / "gradscope"
