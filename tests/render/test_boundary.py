"""gradscope.render must work headless: no Qt, no TensorFlow, even when colormaps come from pyqtgraph."""

from __future__ import annotations

import subprocess
import sys


def test_render_imports_and_colours_without_qt_or_tensorflow() -> None:
    code = (
        "import sys\n"
        "for m in ('PySide6', 'shiboken6', 'tensorflow', 'keras'): sys.modules[m] = None\n"
        "import numpy as np\n"
        "import gradscope.render as r\n"
        "names = r.available_colormaps()\n"
        "for n in names: assert r.lut(n).shape == (256, 3), n\n"
        "r.blend(np.zeros((4, 4, 3), np.uint8), np.ones((2, 2)), cmap=names[-1])\n"
        "assert not any(k.startswith(('pyqtgraph', 'PySide6', 'tensorflow')) and sys.modules[k] is not None\n"
        "               for k in sys.modules)\n"
        "print(' '.join(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "jet" in out.stdout.split()
