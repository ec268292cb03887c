"""The headless front end: ``gradscope graph | explain | methods | rules | flow | diagnose | train-report |
evaluate | gui``.

Every error a user can cause is a ``GradscopeError`` and is printed as one clear line (exit code 2); anything
else is a bug and says so (exit code 3; ``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from gradscope.core.errors import EXIT_BUG, EXIT_USER_ERROR, GradscopeError, ImageLoadError
from gradscope.core.files import inside, safe_file_name, shorten

__all__ = ["EXIT_BUG", "EXIT_USER_ERROR", "main"]


# ------------------------------------------------------------------------------------------------- helpers
def _demo_model() -> str:
    from gradscope.io.demo import demo_model_path

    return str(demo_model_path())


def _demo_image() -> str:
    from gradscope.io.demo import demo_image_paths

    return str(demo_image_paths()[0])


def _custom_objects(args: argparse.Namespace) -> dict | None:
    if not getattr(args, "custom_objects", None):
        return None
    from gradscope.io.models import load_custom_objects_file

    objects: dict = {}
    for path in args.custom_objects:
        objects.update(load_custom_objects_file(path))
    return objects


def _engine(args: argparse.Namespace) -> Any:
    from gradscope.api import open_engine

    for path in getattr(args, "rules", None) or []:
        from gradscope.rules.base import load_rule_file

        names = load_rule_file(path)
        _info(args, f"loaded rules from {path}: {', '.join(names)}")
    from gradscope.app.heap import settle_after_load

    model = args.model or _demo_model()
    engine = open_engine(model, safe_mode=not args.unsafe, custom_objects=_custom_objects(args))
    settle_after_load()  # one model per process: full collections skip it from here on (see app.heap)
    return engine


def _warn(args: argparse.Namespace, message: str) -> None:
    """Warnings reach stderr even with --quiet: they say the result may mislead."""
    print(message, file=sys.stderr)


def _info(args: argparse.Namespace, message: str) -> None:
    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr)


def progress(items: Sequence[Any], label: Callable[[Any], str], enabled: bool = True) -> Iterable[Any]:
    """A plain-text progress bar on stderr (multi-image runs)."""
    n = len(items)
    start = time.perf_counter()
    for i, item in enumerate(items):
        yield item
        if enabled:
            done = int(30 * (i + 1) / n)
            rate = (time.perf_counter() - start) / (i + 1)
            eta = rate * (n - i - 1)
            sys.stderr.write(f"\r[{'#' * done}{'.' * (30 - done)}] {i + 1}/{n} {label(item)[:40]:<40} ETA {eta:4.0f}s")
            sys.stderr.flush()
    if enabled and n:
        sys.stderr.write("\n")


# ------------------------------------------------------------------------------------------------- commands
def cmd_graph(args: argparse.Namespace) -> int:
    engine = _engine(args)
    if args.json:
        import json

        print(json.dumps(engine.graph.to_dict(), indent=2))
    else:
        print(engine.graph.to_table())
        for note in engine.graph.notes:
            print(f"\nnote: {note}")
    return 0


def cmd_snippet(args: argparse.Namespace) -> int:
    from gradscope.app.export import write_plan_snippet
    from gradscope.rules.methods import build_method
    from gradscope.rules.plan import Plan

    engine = _engine(args)
    plan = Plan.load(args.plan) if args.plan else build_method(args.method or "gradient", engine.graph).plan
    plan.resolve(engine.graph)  # an unknown node or rule is an error now, not in the training script
    path = write_plan_snippet(args.out, plan, args.model or _demo_model(), method=args.method or "")
    entries = len(plan.entries)
    _info(args, f"wrote {path} ({entries} plan {'entry' if entries == 1 else 'entries'})")
    return 0


def cmd_sanity(args: argparse.Namespace) -> int:
    from gradscope.api import sanity
    from gradscope.core.targets import Target
    from gradscope.rules.plan import Plan

    known = ("conservation", "randomisation", "finite_differences")
    checks = tuple(c.strip() for c in args.checks.split(",") if c.strip())
    unknown = [c for c in checks if c not in known]
    if unknown:
        raise GradscopeError(f"Unknown check(s) {', '.join(unknown)}; choose from {', '.join(known)}.")
    report = sanity(
        _engine(args),
        args.image or _demo_image(),
        method=None if args.plan and not args.method else (args.method or "gradient"),
        plan=Plan.load(args.plan) if args.plan else None,
        target=Target.parse(args.target),
        checks=checks,
    )
    if args.json:
        import json

        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.to_text())
    failed = any(r.flagged for r in report.conservation) or any(r.flagged for r in report.finite_differences)
    return 1 if args.strict and failed else 0


def cmd_methods(args: argparse.Namespace) -> int:
    from gradscope.rules.methods import available_methods

    for name, summary in available_methods().items():
        print(f"{name:<20} {summary}")
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    import dataclasses

    from gradscope.rules.base import available_rules, load_rule_file, rule_plugins, rule_source

    for path in args.rules or []:
        load_rule_file(path)
    for name, cls in available_rules().items():
        if name.startswith("_"):
            continue
        params = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(cls.Params))
        source = rule_source(name)
        origin = "" if source == "builtin" else f"  (from {source})"
        print(f"{name:<24} {cls.describe()}" + (f"  [{params}]" if params else "") + origin)
    plugins = rule_plugins()
    if plugins and not args.rule_plugins:
        print("\nInstalled rule plugins (not loaded: they are code; add --rule-plugins to load them):")
        for plugin in plugins:
            print(f"  {plugin.describe()}")
    return 0


def _typed_input(args: argparse.Namespace, engine: Any) -> Any:
    """``--tokens`` (ids, or a file of them) or ``--text`` (words, through ``--vocab``) as the model's input."""
    from gradscope.io.model_inputs import text_input, token_input
    from gradscope.io.sequences import Vocabulary, parse_token_ids, read_token_file

    if args.tokens is None and args.text is None:
        return None
    if args.image:
        raise GradscopeError("Give one input: a file, --tokens or --text, not two.")
    vocab = Vocabulary.load(args.vocab) if args.vocab else None
    if args.text is not None:
        if vocab is None:
            raise GradscopeError("--text needs --vocab FILE (one token per line) to turn words into token ids.")
        return text_input(engine.graph, args.text, vocab)
    source = Path(args.tokens).expanduser()
    ids = read_token_file(source) if source.is_file() else parse_token_ids(args.tokens)
    return token_input(engine.graph, ids, vocab=vocab, source=str(source) if source.is_file() else "<ids>")


def cmd_explain(args: argparse.Namespace) -> int:
    from gradscope.api import explain
    from gradscope.app.export import check_long_side
    from gradscope.core.targets import Target
    from gradscope.io.images import list_images
    from gradscope.rules.plan import Plan

    check_long_side(args.size)  # before the model loads: an absurd size is one line, at once
    plan = Plan.load(args.plan) if args.plan else None  # a bad plan too
    engine = _engine(args)
    typed = _typed_input(args, engine)
    image_arg = Path(args.image) if args.image else Path(_demo_image())
    images = [typed] if typed is not None else list_images(image_arg) if image_arg.is_dir() else [image_arg]
    if not images:
        raise ImageLoadError(f"No images (png, jpg, bmp, webp, tif) in folder {image_arg}.")
    out = Path(args.out)
    many = typed is None and image_arg.is_dir()
    if many:
        out.mkdir(parents=True, exist_ok=True)
    elif out.suffix.lower() != ".png":
        raise GradscopeError(f"--out must be a .png file (got {out}); for a folder of images give a folder.")
    target = Target.parse(args.target)
    method = None if (plan is not None and args.method is None) else (args.method or "gradient")
    written, failed, warned, method_warnings = [], [], 0, ()
    stems = [p.stem for p in images] if many else []
    taken: set[str] = set()  # output names used in this batch
    renamed: list[str] = []
    for path in progress(images, lambda p: getattr(p, "name", "input"), enabled=many and not args.quiet):
        try:
            e = explain(
                engine,
                path,
                vocab=args.vocab,
                row=args.row,
                method=method,
                plan=plan,
                target=target,
                layer=args.layer,
                preprocessing=args.preprocessing,
                reduction=args.reduction,
            )
        except ImageLoadError as exc:
            if not many:
                raise
            failed.append(f"{path.name}: {exc}")  # one bad image must not stop the batch
            continue
        e.sidecar["model_file"] = args.model or _demo_model()
        dest = _batch_output(out, path, e.method.name, stems, taken, renamed) if many else out
        inputs = [args.plan, args.vocab, *(images if many else [])]  # files an output must never replace
        e.save(
            dest,
            inputs=inputs,
            cmap=args.cmap,
            alpha=args.alpha,
            normalization=args.normalization,
            style=args.style,
            long_side=args.size,
            colorbar=args.colorbar,
            map_only=args.map_only,
        )
        if args.npy:
            e.save_signal(dest.with_name(dest.stem + "_signal.npy"), inputs=inputs)
        written.append(dest)
        method_warnings = e.method.warnings
        warnings = e.warnings if not many else [w for w in e.warnings if w not in method_warnings]
        prefix = f"{path.name}: " if many else ""
        for w in warnings:
            _warn(args, f"warning: {prefix}{w}")
        warned += bool(warnings)
        if not many:
            _info(
                args,
                f"{shorten(e.method.name)}: target {e.target.describe()} (class {e.predicted_class}), "
                f"{len(e.result.rules)} node(s) with rules, map at {e.node or 'input'} -> {dest}",
            )
    if many:
        for w in method_warnings:  # once for the batch, not per image
            _warn(args, f"warning: {w}")
        _info(args, f"wrote {len(written)} overlays to {out}")
        if renamed:
            _warn(
                args,
                f"{len(renamed)} output name(s) changed so that no overlay replaces another:\n  "
                + "\n  ".join(renamed),
            )
        if failed:
            _warn(args, f"{len(failed)} image(s) could not be read:\n  " + "\n  ".join(failed))
            return EXIT_USER_ERROR
    if args.strict and warned:
        _warn(args, "--strict: warnings make this a failure.")
        return 1
    return 0


def _batch_output(out: Path, image: Path, method: str, stems: list[str], taken: set[str], renamed: list[str]) -> Path:
    """``<stem>_<method>.png`` in ``out``, made a safe file name (a plan's name is data: ``../x``, ``/etc/x``, a
    NUL or 100 MB of text never leave ``out``); images that share a stem (cat.png, cat.jpg) keep their
    extension in the name, and a name this batch already wrote (an overlay or its sidecar) gets a number: no
    output replaces another. Every change is listed."""
    stem = image.name.replace(".", "_") if stems.count(image.stem) > 1 else image.stem
    why = "another image has the same name" if stems.count(image.stem) > 1 else ""
    base = safe_file_name(f"{stem}_{method.replace(' ', '_')}")
    if base != f"{stem}_{method.replace(' ', '_')}" and not why:
        why = "the plan's or image's name is not a safe file name"
    name, n = f"{base}.png", 1
    while name.lower() in taken or f"{name[:-4]}.json".lower() in taken:
        n += 1
        name, why = f"{base}_{n}.png", "an earlier image's overlay has this name"
    taken.update({name.lower(), f"{name[:-4]}.json".lower()})  # the sidecar's name is taken with it
    if why:
        renamed.append(f"{shorten(image.name)} -> {shorten(name)} ({why})")
    return inside(out, name)


def _delegate(module: str, function: str) -> Callable[[argparse.Namespace], int]:
    """Commands implemented in other modules (diagnostics), imported only when used."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        return importlib.import_module(module).__dict__[function](args)

    return run


# ------------------------------------------------------------------------------------------------- parser
def _model_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help=".keras or .h5 file (default: the bundled demo model)")


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--unsafe",
        action="store_true",
        help="allow unsafe deserialization (Lambda layers run code from the file): only for files you trust",
    )
    p.add_argument(
        "--custom-objects",
        action="append",
        metavar="FILE",
        help="Python file registering the model's custom layers (repeatable)",
    )
    p.add_argument("--rules", action="append", metavar="FILE", help="Python file of user rules to load (repeatable)")


def _diagnostic_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--input",
        action="append",
        metavar="FILE",
        help="input: image, .npy, or .npz with one array per model input (repeatable; default: random)",
    )
    p.add_argument("--label", help="labels for the loss: class indices (3 or 0,2,1) or a .npy file")
    p.add_argument(
        "--loss",
        choices=["auto", "compiled", "crossentropy", "mse"],
        help="loss for --label (default auto: compiled if any, else crossentropy for classifiers, else mse)",
    )
    p.add_argument("--output", help="multi-output models: the output node the loss reads (default: all, compiled)")
    p.add_argument("--target", help="without --label: class index, 'top', 'neuron:NODE:i,j,c' or 'channel:NODE:c'")
    p.add_argument(
        "--preprocessing",
        default="unit",
        choices=["unit", "raw", "caffe", "minus_one_one"],
        help="how image pixels are scaled (default unit: /255)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    _model_options(p)


def version_line() -> str:
    """``gradscope X (TensorFlow Y as <distribution>; Keras Z)``, read from the installed metadata: no import of
    TensorFlow, so it answers at once and also where TensorFlow is missing."""
    from importlib import metadata

    from gradscope import __version__

    def installed(*names: str) -> tuple[str, str] | None:
        for name in names:
            try:
                return metadata.version(name), name
            except metadata.PackageNotFoundError:
                continue
        return None

    tf = installed("tensorflow", "tensorflow-cpu", "tf-nightly", "tensorflow-macos")
    keras = installed("keras")
    tf_text = f"{tf[0]} as {tf[1]}" if tf else "not installed"
    return f"gradscope {__version__} (TensorFlow {tf_text}; Keras {keras[0] if keras else 'not installed'})"


class _VersionAction(argparse.Action):
    """``--version``: the metadata is read only when asked (~20 ms otherwise spent on every command)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        parser.exit(message=version_line() + "\n")


def _common_options() -> argparse.ArgumentParser:
    """Options every command also takes after its name (``explain ... --debug``, as the bug message advises);
    SUPPRESS keeps the top-level value when a command is given none."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return common


def add_command(sub: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A command's parser, with the options every command takes (``_common_options``)."""
    return sub.add_parser(name, parents=[_common_options()], **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradscope", description="Visual debugger for gradients of Keras 3 models (TensorFlow backend)."
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="show gradscope's, TensorFlow's and Keras' versions and exit"
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only results")
    parser.add_argument(
        "--rule-plugins",
        action="store_true",
        help="also load the rule plugins installed packages offer (code: see `gradscope rules`)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = add_command(sub, "graph", help="print the model's layer graph as a table")
    _model_argument(p)
    p.add_argument("--json", action="store_true", help="print the graph as JSON")
    _model_options(p)
    p.set_defaults(func=cmd_graph)

    p = add_command(sub, "explain", help="write a saliency overlay PNG (+ JSON sidecar) for an image or a folder")
    _model_argument(p)
    p.add_argument(
        "image",
        nargs="?",
        help="input: an image file or folder, or a .npy/.npz (arrays by input name), .csv (a row), .txt/.json "
        "(token ids) file (default: a bundled demo image)",
    )
    p.add_argument("--tokens", metavar="IDS", help="token ids for a text model: '12 7 99', or a .txt/.json file")
    p.add_argument("--text", help="words for a text model, turned into token ids by --vocab")
    p.add_argument("--vocab", metavar="FILE", help="vocabulary: one token per line (id = line number), or JSON")
    p.add_argument("--row", type=int, default=0, help="the CSV row to explain (0: the first data row)")
    p.add_argument("--target", help="class index, 'top' (default), 'neuron:NODE:i,j,c' or 'channel:NODE:c'")
    p.add_argument("--method", help="method preset (see `gradscope methods`; default: gradient)")
    p.add_argument("--plan", help="plan JSON file (selector -> rule + params); overrides --method's plan")
    p.add_argument("--layer", help="read the map at this node id (default: the method's, else the input)")
    p.add_argument("--out", default="overlay.png", help="output PNG, or a folder for a folder of images")
    p.add_argument("--map-only", action="store_true", help="write the coloured map without the image under it")
    p.add_argument("--npy", action="store_true", help="also write the raw signal as <out>_signal.npy (+ .json)")
    p.add_argument(
        "--cmap", help="colormap (jet, viridis, inferno, gray, coolwarm, ...; default: jet, bwr for signed methods)"
    )
    p.add_argument(
        "--style",
        default="caffe",
        choices=["caffe", "alpha"],
        help="caffe (default): the map's strength sets its opacity; alpha: a plain blend",
    )
    p.add_argument("--alpha", type=float, default=0.5, help="overlay opacity 0..1 for --style alpha (default 0.5)")
    p.add_argument(
        "--normalization",
        choices=["minmax", "percentile", "abs", "signed"],
        help="how the map is scaled (default: minmax, signed for signed methods)",
    )
    p.add_argument(
        "--reduction",
        choices=["max_abs", "sum", "sum_clamped", "l2", "abs_sum"],
        help="channel reduction (default: the method's)",
    )
    p.add_argument(
        "--preprocessing",
        default="unit",
        choices=["unit", "raw", "caffe", "minus_one_one"],
        help="how pixels are scaled for the model (default unit: /255)",
    )
    p.add_argument(
        "--size", type=int, metavar="PX", help="long side of the PNG in pixels (default: the image's own, at least 512)"
    )
    p.add_argument("--colorbar", action="store_true", help="draw a colour bar with the map's range under it")
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when a map may mislead (unmatched selector, NaN/Inf outputs, degenerate map)",
    )
    _model_options(p)
    p.set_defaults(func=cmd_explain)

    p = add_command(sub, "snippet", help="write a Python training script that uses a plan (plan_model)")
    _model_argument(p)
    p.add_argument("--method", help="method preset whose plan to use (see `gradscope methods`)")
    p.add_argument("--plan", help="plan JSON file (overrides --method)")
    p.add_argument("--out", default="train_with_plan.py", help="output .py file")
    _model_options(p)
    p.set_defaults(func=cmd_snippet)

    p = add_command(sub, "sanity", help="sanity checks of a method or plan: conservation, randomisation, finite diffs")
    _model_argument(p)
    p.add_argument("image", nargs="?", help="image file (default: a bundled demo image)")
    p.add_argument("--method", help="method preset (default: gradient)")
    p.add_argument("--plan", help="plan JSON file (overrides --method's plan)")
    p.add_argument("--target", help="class index or 'top' (default)")
    p.add_argument(
        "--checks",
        default="conservation,randomisation,finite_differences",
        help="comma-separated subset of conservation, randomisation, finite_differences",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 when conservation or finite differences fail")
    _model_options(p)
    p.set_defaults(func=cmd_sanity)

    p = add_command(sub, "methods", help="list method presets")
    p.set_defaults(func=cmd_methods)
    p = add_command(sub, "rules", help="list backward rules and their parameters")
    p.add_argument("--rules", action="append", metavar="FILE", help="also load user rules from FILE")
    p.set_defaults(func=cmd_rules)

    p = add_command(sub, "flow", help="per-layer gradient flow (of a training loss with --label) as a table, CSV, PNG")
    _model_argument(p)
    _diagnostic_options(p)
    p.add_argument("--plan", help="plan JSON file: the flow under these rules (default: the plain gradient)")
    p.add_argument("--no-weights", action="store_true", help="skip weight gradients (faster; no |grad W|/|W|)")
    p.add_argument("--strict", action="store_true", help="exit 1 on a warning (NaN/Inf in the input or weights)")
    p.add_argument("--csv", metavar="FILE", help="write one row per node to FILE")
    p.add_argument("--png", metavar="FILE", help="write a chart of the flow to FILE")
    p.set_defaults(func=_delegate("gradscope.cli.diagnose", "cmd_flow"))

    p = add_command(
        sub,
        "diagnose",
        help="find trainable variables that get no gradient and the op that cuts the path (exit code 1 if any)",
    )
    _model_argument(p)
    _diagnostic_options(p)
    p.set_defaults(func=_delegate("gradscope.cli.diagnose", "cmd_diagnose"))

    p = add_command(
        sub,
        "train-report",
        help="alerts of a GradientMonitor log: first NaN/Inf, vanishing/exploding layers, dead ReLUs (exit 1 on NaN)",
    )
    p.add_argument("logdir", help="the log_dir given to gradscope.GradientMonitor")
    p.add_argument("--step", type=int, help="also print the per-layer flow of this recorded step")
    p.add_argument("--run", metavar="ID", help="the run to report when the folder holds several (default: the latest)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--csv", metavar="FILE", help="write the flow of --step (default: the last record) to FILE")
    p.add_argument("--png", metavar="FILE", help="write a chart of the flow of --step (default: the last record)")
    p.set_defaults(func=_delegate("gradscope.cli.training", "cmd_train_report"))

    from gradscope.cli.evaluate import add_parser as add_evaluate

    add_evaluate(sub, _model_argument, _model_options)

    # Listed for --help only: main() hands `gui ...` to the window's own parser (qt.app) before parsing.
    add_command(
        sub,
        "gui",
        help="open the desktop GUI",
        description="Open the desktop GUI. It also takes the window's options: --screenshot PNG, --size WxH, "
        "--select NODE, --method NAME, --rule RULE, --no-demo, ... (`gradscope gui -h` lists them all).",
        add_help=False,
    )
    return parser


INTERRUPT_GRACE = {"seconds": 1.0}  # how long Python gets after Ctrl-C; a second Ctrl-C ends at once


def _exit_on_interrupt_in_native_code() -> None:
    """Make Ctrl-C work while TensorFlow runs native code (an endless ``tf.while_loop`` in a rule never returns
    to Python, so KeyboardInterrupt is never raised). The C signal handler still writes to the wakeup fd: a
    watcher thread gives Python ``INTERRUPT_GRACE`` seconds to raise KeyboardInterrupt and finish (an
    evaluation writes its report), then ends the process (status 130); a second Ctrl-C ends it at once. Writes
    are atomic, so nothing half-written is left. Main thread of a real process only."""
    import os
    import select
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not (
        signal.default_int_handler
    ):
        return
    try:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (OSError, ValueError):  # no pipes, or a wakeup fd someone else owns
        return

    def watch() -> None:
        while True:
            data = os.read(read_fd, 64)
            if signal.SIGINT in data:
                deadline = time.monotonic() + INTERRUPT_GRACE["seconds"]
                while (left := deadline - time.monotonic()) > 0:
                    ready, _, _ = select.select([read_fd], [], [], left)
                    if ready and signal.SIGINT in os.read(read_fd, 64):
                        break  # a second Ctrl-C: the user does not want to wait
                print("\ngradscope: interrupted (native code did not return)", file=sys.stderr, flush=True)
                os._exit(130)

    threading.Thread(target=watch, name="gradscope-interrupt", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((w for w in words if not w.startswith("-")), None)
    if command == "gui":  # the window parses its own options (--screenshot, --size, --select, ...): qt.app
        from gradscope.qt.app import main as gui_main

        return gui_main(words[words.index("gui") + 1 :])
    args = parser.parse_args(argv)
    if argv is None and args.command != "gui":  # a real command line (the GUI handles its own shutdown)
        _exit_on_interrupt_in_native_code()
    try:
        if args.rule_plugins:
            from gradscope.rules.base import load_rule_plugins

            loaded = load_rule_plugins()
            _info(args, f"rule plugins: loaded {', '.join(loaded) or 'no rules'}")
        return int(args.func(args) or 0)
    except GradscopeError as exc:
        print(f"gradscope: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("gradscope: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: say so plainly, traceback only on request
        if args.debug:
            raise
        print(
            f"gradscope: internal error: {type(exc).__name__}: {exc}\n"
            "This is a bug in gradscope; rerun with --debug for the traceback and please report it.",
            file=sys.stderr,
        )
        return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
