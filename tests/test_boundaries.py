"""Architecture: import-linter contracts (layers, Qt and TensorFlow boundaries), file sizes, and importing
gradscope without TensorFlow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gradscope"


def test_import_contracts_hold():
    """The layers and the Qt/TensorFlow boundaries of pyproject.toml's [tool.importlinter] contracts."""
    lint = Path(sys.executable).with_name("lint-imports")
    cmd = [str(lint)] if lint.exists() else [sys.executable, "-m", "importlinter.cli"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_no_source_file_over_700_lines():
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert max(sizes.values()) <= 700, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]


def test_the_application_layer_is_small_models_not_mixins():
    """app/: a file per model, none over 400 lines; the Session composes them and shares ``self`` with no one
    (issue 22: six mixins once shared 58 attributes)."""
    import ast

    app = PACKAGE / "app"
    sizes = {str(p.relative_to(app)): len(p.read_text().splitlines()) for p in app.rglob("*.py")}
    assert max(sizes.values()) <= 400, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    classes = [n for p in app.rglob("*.py") for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef)]
    assert not [c.name for c in classes if c.name.endswith("Mixin")]
    session = next(c for c in classes if c.name == "Session")
    assert session.bases == []


def _root(stem: str) -> str:
    """A module name without the ending that makes ``comparing`` of ``compare``, ``exports`` of ``export``."""
    for suffix in ("ing", "ions", "ion", "es", "e", "s"):
        if stem.endswith(suffix) and len(stem) - len(suffix) >= 4:
            return stem[: -len(suffix)]
    return stem


def test_folders_show_capabilities():
    """Issue 36: no folder holds more than 15 modules, and no two names in one folder differ only by a suffix
    (``compare.py`` beside ``comparing.py``, ``monitor.py`` beside ``monitor_log.py``): a reader cannot tell
    from such names which one a change belongs in."""
    folders = {p.parent for p in PACKAGE.rglob("*.py")}
    for folder in folders:
        modules = [p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
        packages = [d.name for d in folder.iterdir() if (d / "__init__.py").is_file()]
        assert len(modules) <= 15, (folder, len(modules))
        names = sorted(modules + packages)
        alike = [
            (a, b)
            for i, a in enumerate(names)
            for b in names[i + 1 :]
            if _root(a) == _root(b) or b.startswith(a + "_") or a.startswith(b + "_")
        ]
        assert not alike, (folder.relative_to(PACKAGE), alike)
    for package in ("engine", "app"):  # grouped into subpackages, each saying what lives there
        subpackages = [d for d in (PACKAGE / package).iterdir() if (d / "__init__.py").is_file()]
        assert len(subpackages) >= 4 and all(ast_docstring(d / "__init__.py") for d in subpackages)


def ast_docstring(path: Path) -> str | None:
    import ast

    return ast.get_docstring(ast.parse(path.read_text()))


def test_core_imports_without_qt_or_tensorflow():
    code = (
        "import sys\n"
        "for m in ('PySide6', 'tensorflow', 'keras'): sys.modules[m] = None  # make them unimportable\n"
        "import gradscope, gradscope.core.graph, gradscope.core.results, gradscope.core.targets\n"
        "import gradscope.rules.base, gradscope.rules.plan, gradscope.render\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
