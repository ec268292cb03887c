"""The options that name a language model's next token (``--next``, ``--contrast``, ``--position``), shared by the
commands that measure one (explain, patch), as a ``Target``."""

from __future__ import annotations

import argparse
from typing import Any

from gradscope.core.errors import GradscopeError
from gradscope.core.files import shorten
from gradscope.core.numbers import is_whole
from gradscope.core.targets import Target, whole_number


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
