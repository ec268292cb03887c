"""The desktop bundle's spec evaluates, references files that exist, and the entry point starts headless."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def evaluate_spec() -> dict:
    """Run packaging/gradscope.spec with PyInstaller's build objects replaced by recorders."""
    calls: dict = {}

    def recorder(name):
        def record(*args, **kwargs):
            calls[name] = (args, kwargs)
            return types.SimpleNamespace(pure=[], scripts=[], binaries=[], datas=kwargs.get("datas", []))

        return record

    hooks = types.ModuleType("PyInstaller.utils.hooks")
    hooks.collect_submodules = lambda name, filter=None: [name]
    hooks.copy_metadata = lambda name: [(f"/metadata/{name}", f"{name}.dist-info")]
    for mod in ("PyInstaller", "PyInstaller.utils"):
        sys.modules.setdefault(mod, types.ModuleType(mod))
    sys.modules["PyInstaller.utils.hooks"] = hooks
    spec = ROOT / "packaging" / "gradscope.spec"
    namespace = {"SPECPATH": str(spec.parent), **{n: recorder(n) for n in ("Analysis", "PYZ", "EXE", "COLLECT")}}
    exec(compile(spec.read_text(), str(spec), "exec"), namespace)
    return calls


def test_spec_evaluates_and_references_existing_files():
    calls = evaluate_spec()
    assert set(calls) == {"Analysis", "PYZ", "EXE", "COLLECT"}
    (scripts,), analysis = calls["Analysis"]
    assert all(Path(s).is_file() for s in scripts) and Path(scripts[0]).name == "gradscope_app.py"
    (src, dest), *metadata = analysis["datas"]
    assert Path(src).exists() and any("keras" in m[1] for m in metadata)
    assert (Path(src) / "demo" / "shapes_cnn.keras").is_file()
    assert dest == "gradscope/resources"  # where gradscope.core.resources looks inside a bundle
    assert "gradscope" in analysis["hiddenimports"]


def test_desktop_file_is_valid():
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str
    parser.read(ROOT / "packaging" / "gradscope.desktop")
    entry = parser["Desktop Entry"]
    assert entry["Type"] == "Application" and entry["Exec"].startswith("gradscope")
    assert (ROOT / "resources" / "icons" / f"{entry['Icon']}.svg").is_file()


def test_entry_point_starts_headless(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HOME": str(tmp_path)}
    shot = tmp_path / "window.png"
    out = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "--screenshot", str(shot)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    from PIL import Image

    assert Image.open(shot).size[0] > 800  # the main window really rendered


def test_the_bundle_entry_runs_the_cli_for_a_command_and_the_gui_otherwise(monkeypatch):
    sys.path.insert(0, str(ROOT / "packaging"))
    try:
        import gradscope_app
    finally:
        sys.path.remove(str(ROOT / "packaging"))
    calls = []
    monkeypatch.setattr("gradscope.cli.main", lambda argv: calls.append(("cli", argv)) or 0)
    monkeypatch.setattr("gradscope.qt.app.main", lambda argv: calls.append(("gui", argv)) or 0)
    for argv in (["explain", "--out", "o.png"], ["--version"], [], ["model.keras", "x.png"], ["gui", "--no-demo"]):
        monkeypatch.setattr(sys, "argv", ["gradscope", *argv])
        assert gradscope_app.main() == 0
    assert calls == [
        ("cli", ["explain", "--out", "o.png"]),
        ("cli", ["--version"]),
        ("gui", []),
        ("gui", ["model.keras", "x.png"]),
        ("gui", ["--no-demo"]),
    ]
