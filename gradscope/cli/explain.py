"""``gradscope explain``: a saliency overlay PNG (+ JSON sidecar) for an image, a folder of images, typed tokens
or text, a CSV row or arrays."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gradscope.cli.common import (
    PREPROCESSING,
    add_command,
    demo_image,
    demo_model,
    info,
    model_argument,
    model_options,
    next_token_options,
    next_token_target,
    open_engine,
    progress,
    warn,
)
from gradscope.core.errors import EXIT_USER_ERROR, GradscopeError, ImageLoadError
from gradscope.core.files import inside, is_file_named, safe_file_name, shorten
from gradscope.core.targets import Target, describe_next_token


def add_parser(sub: Any) -> None:
    p = add_command(sub, "explain", run, help="write a saliency overlay PNG (+ JSON sidecar) for an image or a folder")
    model_argument(p)
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
    next_token_options(p)
    p.add_argument(
        "--generate",
        type=int,
        metavar="N",
        help="language models: decode N tokens greedily and attribute each to the prompt and the tokens before it "
        "(writes the matrix as PNG, its scores as <out>_scores.csv, and the sidecar)",
    )
    p.add_argument("--method", help="method preset (see `gradscope methods`; default: gradient)")
    p.add_argument("--plan", help="plan JSON file (selector -> rule + params); overrides --method's plan")
    p.add_argument(
        "--alternate",
        metavar="INPUT",
        help="another input (a file, token ids or text) that the plan's value rules read: substitute_value and "
        "patch_value with source 'input' take a node's value there",
    )
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
        choices=["minmax", "percentile", "abs", "signed", "signed_percentile"],
        help="how the map is scaled (default: minmax; signed_percentile for signed methods)",
    )
    p.add_argument(
        "--reduction",
        choices=["max_abs", "sum", "sum_clamped", "l2", "abs_sum"],
        help="channel reduction (default: the method's)",
    )
    p.add_argument(
        "--preprocessing",
        default="unit",
        choices=PREPROCESSING,
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
    model_options(p)


def typed_input(args: argparse.Namespace, engine: Any) -> Any:
    """``--tokens`` (ids, or a file of them) or ``--text`` (words, through ``--vocab``) as the model's input."""
    from gradscope.io.model_inputs import text_input, token_input
    from gradscope.io.sequences import Vocabulary, parse_token_ids, read_token_file

    if args.tokens is None and args.text is None:
        return None
    if args.image:
        raise GradscopeError("Give one input: a file, --tokens or --text, not two.")
    try:
        vocab = Vocabulary.load(args.vocab) if args.vocab else None
    except GradscopeError:
        if args.text is not None or not getattr(args, "vocab_found", False):
            raise
        args.vocab = vocab = None  # the model's own tokenizer is broken, but ids need none: shown as ids
    if args.text is not None:
        if vocab is None:
            raise GradscopeError(
                "--text needs a vocabulary to turn words into token ids: --vocab FILE (one token per line), or a "
                "vocab.txt / <model>.vocab.txt beside the model."
            )
        return text_input(engine.graph, args.text, vocab)
    source = Path(args.tokens).expanduser() if is_file_named(args.tokens) else None
    ids = read_token_file(source) if source is not None else parse_token_ids(args.tokens)
    return token_input(engine.graph, ids, vocab=vocab, source=str(source) if source is not None else "<ids>")


def run_generation(args: argparse.Namespace) -> int:
    """``--generate N``: the generation attributed token by token, as a matrix picture + CSV + sidecar."""
    from gradscope.api import explain_generation
    from gradscope.engine.backward.generation import MAX_GENERATE

    if not 1 <= args.generate <= MAX_GENERATE:
        raise GradscopeError(f"--generate takes 1 to {MAX_GENERATE} tokens; got {args.generate}.")
    if args.tokens is None and args.text is None:
        raise GradscopeError("--generate needs a prompt: --text (with --vocab) or --tokens.")
    out = Path(args.out)
    if out.suffix.lower() != ".png":
        raise GradscopeError(f"--out must be a .png file (got {out}).")
    engine = open_engine(args)
    fed = typed_input(args, engine)
    plan = None
    if args.plan:
        from gradscope.rules.plan import Plan

        plan = Plan.load(args.plan)
    method = None if (plan is not None and args.method is None) else (args.method or "attnlrp")

    def show(done: int, total: int) -> None:
        if not args.quiet:
            sys.stderr.write(f"\r  generated {done}/{total} tokens")
            sys.stderr.flush()

    g = explain_generation(engine, fed, steps=args.generate, vocab=args.vocab, method=method, plan=plan, progress=show)
    g.sidecar["model_file"] = args.model or demo_model()
    if not args.quiet:
        sys.stderr.write("\n")
    path = g.save(out, inputs=[args.plan, args.vocab])
    text = " ".join(g.labels[len(g.generation.prompt) :])
    info(args, f"{g.method.name}: generated {len(g.generated)} tokens ({shorten(text, 60)}) -> {path}")
    return 0


def explained(e: Any) -> str:
    """What was explained, in words: the class, or a language model's next token with its probability."""
    token = e.sidecar.get("explained_token")
    if token is None:
        return f"{e.target.describe()} (class {e.predicted_class})"
    return describe_next_token(token)


def run(args: argparse.Namespace) -> int:
    from gradscope.api import explain
    from gradscope.app.files.exports import check_long_side
    from gradscope.io.images import list_images
    from gradscope.rules.plan import Plan

    check_long_side(args.size)  # before the model loads: an absurd size is one line, at once
    if not args.vocab and args.model:  # as the window does: a vocabulary beside the model is read (data, not code)
        from gradscope.app.files.session_files import find_vocabulary

        found = find_vocabulary(args.model)
        args.vocab, args.vocab_found = (str(found), True) if found is not None else (None, False)
    if args.generate is not None:
        return run_generation(args)
    plan = Plan.load(args.plan) if args.plan else None  # a bad plan too
    engine = open_engine(args)
    typed = typed_input(args, engine)
    image_arg = Path(args.image) if args.image else Path(demo_image())
    images = [typed] if typed is not None else list_images(image_arg) if image_arg.is_dir() else [image_arg]
    if not images:
        raise ImageLoadError(f"No images (png, jpg, bmp, webp, tif) in folder {image_arg}.")
    out = Path(args.out)
    many = typed is None and image_arg.is_dir()
    if many:
        if out.exists() and not out.is_dir():
            raise GradscopeError(f"--out {out} is a file; for a folder of images give a folder (made if missing).")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise GradscopeError(f"Cannot make the output folder {out}: {exc.strerror or exc}.") from None
    elif out.suffix.lower() != ".png":
        raise GradscopeError(f"--out must be a .png file (got {out}); for a folder of images give a folder.")
    target = next_token_target(args, engine) or Target.parse(args.target)
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
                alternate=args.alternate,
            )
        except ImageLoadError as exc:
            if not many:
                raise
            failed.append(f"{path.name}: {exc}")  # one bad image must not stop the batch
            continue
        e.sidecar["model_file"] = args.model or demo_model()
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
            warn(args, f"warning: {prefix}{w}")
        warned += bool(warnings)
        if not many:
            info(
                args,
                f"{shorten(e.method.name)}: target {explained(e)}, "
                f"{len(e.result.rules)} node(s) with rules, map at {e.node or 'input'} -> {dest}",
            )
    if many:
        for w in method_warnings:  # once for the batch, not per image
            warn(args, f"warning: {w}")
        info(args, f"wrote {len(written)} overlays to {out}")
        if renamed:
            warn(
                args,
                f"{len(renamed)} output name(s) changed so that no overlay replaces another:\n  "
                + "\n  ".join(renamed),
            )
        if failed:
            warn(args, f"{len(failed)} image(s) could not be read:\n  " + "\n  ".join(failed))
            return EXIT_USER_ERROR
    if args.strict and warned:
        warn(args, "--strict: warnings make this a failure.")
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
