"""GUI timings a user feels (issue 13): open -> graph visible for ResNet50, and panning a 2,000-node graph.

    .venv/bin/python benchmarks/bench_gui.py            # offscreen, or a real X window when DISPLAY is set
    .venv/bin/python benchmarks/bench_gui.py --open-idle DIR/encoder_12x768.keras DIR/vit_12x768.keras

``--open-idle``: a fresh ``gradscope gui MODEL --screenshot`` process per round, timed from its start to the
screenshot (the first map shown and no work pending, plus the 0.4 s the window waits before grabbing): what a
user waits from the command to a usable window, Python and TensorFlow start-up included. The models: saved by
``bench_transformer.py --save DIR``. Results in ``results/open_idle.{csv,json}``.

Open -> graph visible: from ``open_model`` to the first layout drawn (the model is built from its config and
laid out on the worker, the window stays responsive, and the graph is drawn while the weights load); then to
the model usable (weights loaded, nodes clickable). TensorFlow is already imported here (the script builds
the models first), as in the app a few seconds after start. Panning: the view scrolled by 40 px steps and
repainted synchronously, per frame, for the graph opened collapsed and for every group expanded (2,002 boxes),
at a readable zoom and zoomed out (where boxes are drawn without text, ``graph_view.LABEL_ZOOM``).
"""

from __future__ import annotations

import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen" if not os.environ.get("DISPLAY") else "xcb")


def deep_model(path: Path) -> None:
    import keras

    x = i = keras.Input((8,), name="features")
    for stage in range(1, 11):
        for block in range(1, 21):
            name = f"stage{stage}_block{block}"
            h = keras.layers.Dense(8, name=f"{name}_1_dense")(x)
            h = keras.layers.LayerNormalization(name=f"{name}_1_norm")(h)
            h = keras.layers.Activation("gelu", name=f"{name}_1_gelu")(h)
            for k in range(2, 8):
                h = keras.layers.Dense(8, name=f"{name}_{k}_dense")(h)
            x = keras.layers.Add(name=f"{name}_add")([x, h])
    keras.Model(i, keras.layers.Dense(10, name="head")(x), name="deep_mlp_2000").save(path)


def wait(app, condition, timeout=600.0) -> None:
    end = time.perf_counter() + timeout
    while not condition() and time.perf_counter() < end:
        app.processEvents()
        time.sleep(0.002)


def pan_ms(app, view, zoom: float, frames: int = 60) -> float:
    view.resetTransform()
    view.scale(zoom, zoom)
    bar = view.verticalScrollBar()
    bar.setValue(bar.minimum())
    times = []
    for _ in range(frames):
        t0 = time.perf_counter()
        bar.setValue(bar.value() + 40)
        view.viewport().repaint()
        app.processEvents()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def open_idle_seconds(model: str) -> float:
    """A fresh ``gradscope gui MODEL --screenshot`` process, from its launch to the screenshot (seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        shot = Path(tmp) / "shot.png"
        command = [sys.executable, "-m", "gradscope", "gui", model, "--screenshot", str(shot)]
        env = {**os.environ, "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen")}
        t0 = time.perf_counter()
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        seconds = None
        for line in child.stdout:
            if line.startswith("screenshot:"):
                seconds = time.perf_counter() - t0
        child.wait()
        if child.returncode or seconds is None or not shot.is_file():
            raise SystemExit(f"gradscope gui {model} failed (exit {child.returncode})")
    return seconds


def open_idle(models: list[str], rounds: int) -> None:
    rows = []
    for model in models:
        seconds = [open_idle_seconds(model) for _ in range(rounds)]
        row = {"model": Path(model).stem, "rounds": rounds, "median_s": statistics.median(seconds)}
        row |= {"min_s": min(seconds), "max_s": max(seconds)}
        print(f"{row['model']}: open -> idle {row['median_s']:.2f} s (median; {row['min_s']:.2f}-{row['max_s']:.2f})")
        rows.append(row)
    results = Path(__file__).resolve().parent / "results"
    meta = {"machine": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}
    (results / "open_idle.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    with (results / "open_idle.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main() -> None:
    if "--open-idle" in sys.argv:
        at = sys.argv.index("--open-idle")
        rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
        models = [a for a in sys.argv[at + 1 :] if a.endswith((".keras", ".h5"))]
        return open_idle(models, rounds)
    import keras
    from PySide6.QtWidgets import QApplication

    from gradscope.qt.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv)
    folder = Path(tempfile.mkdtemp(prefix="gradscope-bench-gui-"))
    resnet = folder / "resnet50.keras"
    keras.applications.ResNet50(weights=None).save(resnet)
    deep = folder / "deep2000.keras"
    deep_model(deep)
    window = MainWindow()
    window.resize(1280, 720)
    window.show()
    app.processEvents()
    view = window.graph_view
    t0 = time.perf_counter()
    window.open_model(str(resnet))
    wait(app, lambda: bool(view.items_by_id))
    visible = time.perf_counter() - t0
    wait(app, lambda: window.session.graph is not None)
    print(
        f"ResNet50: open -> graph visible {visible:.2f} s ({len(view.items_by_id)} boxes), "
        f"weights loaded and clickable {time.perf_counter() - t0:.2f} s"
    )
    window.open_model(str(deep))
    wait(app, lambda: window.session.graph is not None and len(window.session.graph) > 2000 and view.items_by_id)
    wait(app, lambda: window.session.jobs.busy is None)
    for label in ("collapsed", "expanded"):
        if label == "expanded":
            window.session.document.collapse_all(False)
            wait(app, lambda: len(view.items_by_id) > 2000)
        for zoom in (0.6, 0.15):
            ms = pan_ms(app, view, zoom)
            print(
                f"2,002 nodes {label:<9} ({len(view.items_by_id):>4} boxes) zoom {zoom:<4}: "
                f"{ms:6.1f} ms per frame ({1000 / ms:5.0f} fps)"
            )
    window.close()
    sys.stdout.flush()
    os._exit(0)  # skip the interpreter's teardown of Qt objects a script never handed back to an event loop


if __name__ == "__main__":
    main()
