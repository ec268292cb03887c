"""Import boundaries: only gradscope.qt imports Qt; importing gradscope does not import TensorFlow."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gradscope"
QT_MODULES = ("PySide6", "pyqtgraph", "shiboken6")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_qt_package_imports_qt():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "qt" in path.relative_to(PACKAGE).parts[:1]:
            continue
        bad = imported_modules(path) & set(QT_MODULES)
        # render/colormap may read pyqtgraph's colormap data lazily; nothing else may touch Qt.
        if bad and not (path.name == "colormap.py" and bad == {"pyqtgraph"}):
            offenders.append(f"{path.relative_to(PACKAGE)}: {sorted(bad)}")
    assert not offenders, offenders


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
