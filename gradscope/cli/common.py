"""What every command shares: the options every command takes, the model argument and options, opening the
model, the bundled demo's files, outputs that must not collide, a language model's next-token options (explain,
patch), and plain-text output (info, warnings, a progress bar)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from gradscope.core.errors import GradscopeError
from gradscope.core.files import shorten
from gradscope.core.numbers import is_whole
from gradscope.core.targets import Target, whole_number


def demo_model() -> str:
    from gradscope.io.demo import demo_model_path

    return str(demo_model_path())


def demo_image() -> str:
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


def open_engine(args: argparse.Namespace) -> Any:
    """The model of ``args.model`` (default: the demo), in safe mode unless ``--unsafe``, after the user's rule
    files (``--rules``) are loaded."""
    from gradscope.api import open_engine as open_model

    for path in getattr(args, "rules", None) or []:
        from gradscope.rules.base import load_rule_file

        names = load_rule_file(path)
        info(args, f"loaded rules from {path}: {', '.join(names)}")
    from gradscope.app.work.heap import settle_after_load

    model = args.model or demo_model()
    dtype = getattr(args, "dtype", "auto")
    shown = None if getattr(args, "quiet", False) else weights_progress(Path(str(model)).name)
    engine = open_model(
        model, safe_mode=not args.unsafe, custom_objects=_custom_objects(args), dtype=dtype, progress=shown
    )
    settle_after_load()  # one model per process: full collections skip it from here on (see app.work.heap)
    return engine


def distinct_outputs(outputs: dict[str, str | None], inputs: Iterable[Any] = ()) -> None:
    """Before any work: two output flags that name one file are refused (``--csv a.png --png a.png`` said "wrote
    a.png" twice and the CSV was lost), and so is an output that is one of the inputs."""
    from pathlib import Path

    from gradscope.core.errors import ArgumentError

    taken: dict[Path, str] = {Path(str(i)).expanduser().resolve(): "an input" for i in inputs if i}
    for flag, path in outputs.items():
        if not path:
            continue
        resolved = Path(path).expanduser().resolve()
        if resolved in taken:
            raise ArgumentError(f"{flag} {path} is also {taken[resolved]}: give each output its own file.")
        taken[resolved] = flag


def warn(args: argparse.Namespace, message: str) -> None:
    """Warnings reach stderr even with --quiet: they say the result may mislead."""
    print(message, file=sys.stderr)


def info(args: argparse.Namespace, message: str) -> None:
    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr)


def weights_progress(name: str) -> Callable[[int, int], None]:
    """``progress(bytes read, bytes in all)`` for a checkpoint folder's weights on stderr: one line rewritten on a
    terminal, a line per quarter in a log (a 16 GB folder reads for a minute; it must not look frozen)."""
    tty = sys.stderr.isatty()
    shown = [-1]

    def show(done: int, total: int) -> None:
        step = int(100 * done / max(total, 1)) if tty else 25 * (4 * done // max(total, 1))
        if step == shown[0] or total < 256 << 20:  # a small folder reads in a blink
            return
        shown[0] = step
        line = f"Opening {name}: {done / 2**30:.1f} of {total / 2**30:.1f} GB of weights read"
        sys.stderr.write(f"\r{line}" + ("\n" if done >= total else "") if tty else f"{line}\n")
        sys.stderr.flush()

    return show


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


# ------------------------------------------------------------------------------------------------- parsers
def _common_options() -> argparse.ArgumentParser:
    """Options every command also takes after its name (``explain ... --debug``, as the bug message advises);
    SUPPRESS keeps the top-level value when a command is given none."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return common


def add_command(sub: Any, name: str, run: Callable[[argparse.Namespace], int], **kwargs: Any) -> Any:
    """A command's parser, with the options every command takes; ``run(args)`` is what it does."""
    p = sub.add_parser(name, parents=[_common_options()], **kwargs)
    p.set_defaults(func=run)
    return p


def model_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model", nargs="?", help=".keras or .h5 file, or a checkpoint folder (default: the bundled demo model)"
    )


def model_options(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        default="auto",
        help="checkpoint folders: the dtype to run in (default auto: as stored, e.g. bfloat16)",
    )


PREPROCESSING = ["unit", "raw", "caffe", "minus_one_one"]


def ray_options(p: argparse.ArgumentParser, what: str) -> None:
    """``--ray [ADDRESS]`` and ``--ray-actors``: ``what`` runs on a Ray cluster (``ray_options_of`` reads them)."""
    p.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help=f"{what} on a Ray cluster (ray://HOST:10001 or auto); without ADDRESS a local Ray instance",
    )
    p.add_argument("--ray-actors", type=int, help="Ray workers, each holding one model (default: one per CPU, max 8)")


def ray_options_of(args: argparse.Namespace) -> Any:
    """The ``RayOptions`` of ``--ray`` (None without it): every worker loads the model's file as this process does."""
    if args.ray is None:
        return None
    from gradscope.app.evaluation.on_ray import RayOptions

    if not args.model:
        raise GradscopeError("--ray needs the model's file: each Ray worker loads it.")
    return RayOptions(address=args.ray or None, model=str(args.model), safe_mode=not args.unsafe,
                      custom_objects=list(args.custom_objects or []), rules=list(args.rules or []),
                      actors=args.ray_actors)  # fmt: skip


def next_token_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--next",
        metavar="TOKEN",
        help="language models: the continuation to explain, a token id or a token of --vocab (default: the most "
        "likely next token)",
    )
    p.add_argument(
        "--contrast", metavar="TOKEN", help="language models: explain --next rather than this token (logit A - B)"
    )
    p.add_argument(
        "--position", type=int, metavar="K", help="language models: the position whose next token (default: the last)"
    )


def next_token_target(args: argparse.Namespace, engine: Any) -> Target | None:
    """``--next``, ``--contrast``, ``--position`` as a next-token target (None when none is given)."""
    if args.next is None and args.contrast is None and args.position is None:
        return None
    if not engine.is_language_model():
        raise GradscopeError(
            "--next, --contrast and --position are for language models (an output of (batch, sequence, "
            "vocabulary)); use --target for this model."
        )
    if args.target is not None:
        raise GradscopeError("Give --target or --next/--contrast/--position, not both.")
    vocab = None
    named = [(flag, t) for flag, t in (("--next", args.next), ("--contrast", args.contrast)) if t is not None]
    if any(not is_whole(t) for _, t in named):
        if not args.vocab:
            flag, text = next((f, t) for f, t in named if not is_whole(t))
            raise GradscopeError(
                f"{flag} {shorten(text, 40)!r} is not a token id (a whole number); to name a token by its text, "
                "give --vocab."
            )
        from gradscope.io.sequences import Vocabulary

        vocab = Vocabulary.load(args.vocab)

    def token(text: str | None) -> int | None:
        if text is None:
            return None
        return whole_number(text, "token id") if vocab is None else vocab.token_id(text)

    return Target(kind="token", index=token(args.next), contrast=token(args.contrast), position=args.position)
