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
    sizes = {p.name: len(p.read_text().splitlines()) for p in app.glob("*.py")}
    assert max(sizes.values()) <= 400, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    classes = [n for p in app.glob("*.py") for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef)]
    assert not [c.name for c in classes if c.name.endswith("Mixin")]
    session = next(c for c in classes if c.name == "Session")
    assert session.bases == []


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
