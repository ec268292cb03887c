"""Start the desktop GUI: ``python main.py [MODEL] [IMAGE]`` or ``gradscope gui [MODEL] [IMAGE]``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from gradscope.core.errors import EXIT_USER_ERROR, GradscopeError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gradscope gui", description="The gradscope desktop GUI.")
    p.add_argument(
        "model",
        nargs="?",
        help="a .keras/.h5 model, a checkpoint folder (Hugging Face: config.json + .safetensors; keras_hub preset), "
        "or a .gradscope.json session (default: the demo)",
    )
    p.add_argument(
        "image",
        nargs="?",
        help="the input: an image, .npy/.npz arrays, a .csv row or .txt/.json token ids (default: a demo image)",
    )
    p.add_argument("--tokens", metavar="TEXT", help="token ids ('12 7 99'), or words with --vocab, as the input")
    p.add_argument("--vocab", metavar="FILE", help="a vocabulary (one token per line): token ids shown as words")
    p.add_argument("--training", metavar="LOGDIR", help="open the Training view on a GradientMonitor log folder")
    p.add_argument("--screenshot", metavar="PNG", help="save a screenshot of the window once idle, then quit")
    p.add_argument("--select", metavar="NODE", help="select this node at start (e.g. for a screenshot)")
    p.add_argument("--method", metavar="NAME", help="apply this method preset at start")
    p.add_argument("--rule", metavar="RULE", help="give the selected node this rule at start")
    p.add_argument("--custom-objects", metavar="PY", help="a Python file defining the model's custom layers")
    p.add_argument("--diagnose", action="store_true", help="run the path diagnostics once the model is open")
    p.add_argument("--size", metavar="WxH", default="1560x960", help="window size (default 1560x960)")
    p.add_argument("--preprocessing", choices=("unit", "raw", "caffe", "minus_one_one"), help="pixel scaling")
    p.add_argument("--no-demo", action="store_true", help="start empty instead of opening the demo model")
    return p.parse_args(argv)


def _folder_tokenizer(model: str) -> bool:
    from gradscope.io.checkpoints import has_tokenizer

    return Path(model).is_dir() and has_tokenizer(Path(model))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.screenshot and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # headless as documented (xcb aborted: exit 134)
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from gradscope.core.resources import resource_path
    from gradscope.qt.main_window import MainWindow

    _warn_about_the_binding()
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("gradscope")
    app.setOrganizationName("gradscope")
    icon = resource_path("icons", "gradscope.svg")
    if icon.is_file():
        app.setWindowIcon(QIcon(str(icon)))
    errors: list[str] = []  # headless (--screenshot): what went wrong, printed once the window has closed
    window = MainWindow(modal_errors=not args.screenshot)  # nobody can click a dialog away
    if args.screenshot:
        window.error_shown.connect(lambda title, message: errors.append(f"{title}: {message}"))
    try:
        w, h = (int(v) for v in args.size.lower().split("x"))
        window.resize(w, h)
    except ValueError:
        pass
    if not args.screenshot:  # a screenshot is exactly --size, whatever screen (or none) there is
        _fit_to_screen(window, app)
    window.show()
    model, image = args.model, args.image
    if model is None and not args.no_demo and not args.training:  # a log alone: not the demo beside it
        model, image, problem = _demo_paths(image)
        if problem:
            window.status_label.setText(problem)
    s = window.session
    if args.preprocessing:
        s.fed.set_preprocessing(args.preprocessing)
    if args.vocab:
        s.fed.set_vocabulary(args.vocab)
    elif args.tokens and model and _folder_tokenizer(model):  # a checkpoint folder's tokenizer reads the words
        s.fed.set_vocabulary(model)
    if args.tokens:
        s.fed.set_typed(args.tokens)
    elif image:
        s.fed.open(image)  # no model yet: nothing runs until it has loaded
    if model and args.custom_objects:
        window.open_model(model, custom_objects_file=args.custom_objects)
    elif model:
        window.open_path(model)
    if args.training:
        window.open_training_log(args.training)
    if args.select or args.method or args.rule or args.diagnose:
        _after_load(window, args)
    if args.screenshot:
        out = Path(args.screenshot)

        def shoot() -> None:
            out.parent.mkdir(parents=True, exist_ok=True)
            shot = window.grab()
            shot.save(str(out))
            print(f"screenshot: {out}")
            if args.size.lower() != f"{shot.width()}x{shot.height()}":
                smallest = window.minimumSizeHint()
                errors.append(
                    f"--size: the screenshot is {shot.width()}x{shot.height()}, not {args.size} (the window is at "
                    f"least {smallest.width()}x{smallest.height()})"
                )
            app.quit()

        window.when_idle(shoot)
    code = app.exec()
    # printed now, not when they happen: while the worker imports TensorFlow, fd 2 points at /dev/null
    for line in errors:
        print(f"gradscope gui: error: {line}", file=sys.stderr)
    status = code or (EXIT_USER_ERROR if errors else 0)  # a screenshot run that met an error says so
    executor = window.session.jobs.executor
    if getattr(executor, "alive", False):  # closed during a TensorFlow call: exit without finalising under it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _warn_about_the_binding() -> None:
    """PySide6 6.12 on Python 3.11 loses a reference to None per void call and crashes a long session
    (pyproject excludes it; an environment gradscope did not install may still have it)."""
    import PySide6

    if sys.version_info < (3, 12) and tuple(PySide6.__version_info__[:2]) == (6, 12):
        print(
            f"gradscope gui: warning: PySide6 {PySide6.__version__} on Python {sys.version.split()[0]} crashes "
            "long sessions (a reference-count bug fixed by Python 3.12's immortal None); install "
            "'PySide6-Essentials<6.12' or use Python 3.12+.",
            file=sys.stderr,
        )


def _demo_paths(image: str | None) -> tuple[str | None, str | None, str]:
    """The bundled demo model and first demo image; a message (and no model) if they are not there."""
    try:
        from gradscope.io.demo import demo_image_paths, demo_model_path

        model = str(demo_model_path())
    except Exception as exc:  # the GUI still opens, empty, and says why
        return None, image, f"{exc}  Open a model with File ▸ Open model."
    if image is None:
        try:
            image = str(demo_image_paths()[0])
        except Exception:
            image = None
    return model, image, ""


def _fit_to_screen(window: Any, app: Any) -> None:
    """Open no larger than the screen's free area (a laptop's 1280x720 included), centred on it."""
    screen = app.primaryScreen()
    if screen is None:
        return
    free = screen.availableGeometry()
    w, h = min(window.width(), free.width()), min(window.height(), free.height())
    window.resize(w, h)
    window.move(free.x() + (free.width() - w) // 2, free.y() + (free.height() - h) // 2)


def _after_load(window: object, args: argparse.Namespace) -> None:
    """Apply --method / --select / --rule once the model is there (screenshots and demos)."""
    s = window.session  # type: ignore[attr-defined]
    done = {"flag": False}

    def apply(*_: object) -> None:
        if done["flag"]:
            return
        done["flag"] = True
        if args.method:
            s.editor.apply_method(args.method)
        if args.select:
            try:
                s.graph.node(args.select)  # a missing id is an error that names the nearest ones
            except GradscopeError as exc:
                s.feedback.error("Cannot select the node", f"--select: {exc}", exc)
                return
            s.selection.select(args.select)
            if args.rule:
                s.editor.add_rule(s.selected, args.rule)
        if args.diagnose:
            window.diagnose()  # type: ignore[attr-defined]

    s.document.loaded.connect(lambda *_: _defer(apply))


def _defer(fn: object) -> None:
    from PySide6.QtCore import QTimer

    QTimer.singleShot(0, fn)  # type: ignore[arg-type]


if __name__ == "__main__":
    raise SystemExit(main())
