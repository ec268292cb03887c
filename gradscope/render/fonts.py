"""Text in pictures for every script users type: each character is drawn with the first installed font that holds
it (the system's sans-serif first), as a browser or Qt falls back, so a prompt in Greek, Cyrillic, Arabic, CJK or
with emoji reads in a token strip and its export instead of boxes.

The fonts are the system's, found through fontconfig (``fc-list``, one call per process, reading fontconfig's
cache): nothing is downloaded. Without fontconfig (or without a font for a character) Pillow's bundled font draws
it, which holds Latin only. ``scripts/setup.sh`` installs Debian's DejaVu, Noto CJK and Noto Color Emoji.
Colour bitmap fonts (Noto Color Emoji: one 109 px strike) are drawn at their strike and scaled to the line.
"""

from __future__ import annotations

import bisect
import functools
import shutil
import subprocess
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

_FIELDS = "%{file}\t%{index}\t%{family[0]}\t%{style[0]}\t%{color}\t%{charset}\n"


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one object per face
class Face:
    """One installed font: its file, index in a collection, and the code points it holds (sorted ranges)."""

    path: str
    index: int
    family: str
    style: str
    colour: bool
    starts: tuple[int, ...]
    ends: tuple[int, ...]

    def holds(self, char: str) -> bool:
        c = ord(char)
        i = bisect.bisect_right(self.starts, c) - 1
        return i >= 0 and c <= self.ends[i]


def _parse_charset(text: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    starts, ends = [], []
    for part in text.split():
        lo, _, hi = part.partition("-")
        starts.append(int(lo, 16))
        ends.append(int(hi or lo, 16))
    return tuple(starts), tuple(ends)


def _run_fc(*args: str) -> str:
    exe = shutil.which(args[0])
    if exe is None:
        return ""
    try:
        return subprocess.run([exe, *args[1:]], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.cache
def faces() -> tuple[Face, ...]:
    """The installed fonts in the order they are tried: the system's sans-serif, then regular upright sans faces,
    then the rest (colour fonts last, so digits never come out as emoji)."""
    found = []
    for line in _run_fc("fc-list", "-f", _FIELDS).splitlines():
        parts = line.split("\t")
        if len(parts) != 6 or not parts[5].strip():
            continue
        path, index, family, style, colour, charset = parts
        if not path.lower().endswith((".ttf", ".otf", ".ttc", ".otc")):
            continue  # Pillow draws TrueType/OpenType; skip bitmap formats (.pcf, .pfb ...)
        starts, ends = _parse_charset(charset)
        found.append(Face(path, int(index or 0), family, style, colour == "True", starts, ends))
    default = _run_fc("fc-match", "-f", "%{file}\t%{index}", "sans-serif").split("\t")

    def rank(f: Face) -> tuple:
        is_default = [f.path, str(f.index)] == default
        regular = f.style.lower() in ("regular", "book", "roman", "normal")
        sans = "sans" in f.family.lower() and "mono" not in f.family.lower()
        return (not is_default, f.colour, not regular, not sans, f.family, f.path, f.index)

    return tuple(sorted(found, key=rank))


#: Code points drawn as emoji by default (pictographs, emoticons, transport, flags' regional letters): a colour face
#: first for them, where text faces hold some as outlines (DejaVu's 😀 came out monochrome beside a colour 🎬).
EMOJI_RANGES = ((0x1F1E6, 0x1F1FF), (0x1F300, 0x1FAFF))


def is_emoji(char: str) -> bool:
    c = ord(char)
    return any(lo <= c <= hi for lo, hi in EMOJI_RANGES)


@functools.cache
def face_for(char: str, emoji: bool = False) -> Face | None:
    """The first face (in :func:`faces` order) that holds ``char``; a colour face first for an emoji (``emoji``:
    one asked for by a variation selector, ``❤️``); ``None`` when none does."""
    if not char.isprintable() and char not in "\u200d\ufe0f":
        return None
    if emoji or is_emoji(char):
        colour = next((f for f in faces() if f.colour and f.holds(char)), None)
        if colour is not None:
            return colour
    return next((f for f in faces() if f.holds(char)), None)


@functools.cache
def _pillow_font(face: Face | None, size: int) -> tuple[ImageFont.FreeTypeFont | ImageFont.ImageFont, float]:
    """(font, scale): the font to draw with and the factor from its size to ``size`` (1 but for colour bitmap
    fonts, which hold a single strike)."""
    if face is None:
        try:
            return ImageFont.load_default(size=size), 1.0
        except (TypeError, OSError):
            return ImageFont.load_default(), 1.0
    try:
        return ImageFont.truetype(face.path, size, index=face.index), 1.0
    except OSError:  # a bitmap-only face: only its own strike size loads (109 px for Noto Color Emoji)
        font = ImageFont.truetype(face.path, 109, index=face.index)
        return font, size / 109.0


def runs(text: str) -> list[tuple[str, Face | None]]:
    """``text`` cut into runs that one face draws. Combining marks, joiners and variation selectors stay with the
    character before them, so an emoji sequence or an accented letter is not split."""
    out: list[tuple[str, Face | None]] = []
    for i, ch in enumerate(text):
        joins = out and (ch in "\u200d\ufe0f\ufe0e" or (0x300 <= ord(ch) <= 0x36F) or out[-1][0].endswith("\u200d"))
        face = out[-1][1] if joins else face_for(ch, emoji=text[i + 1 : i + 2] == "\ufe0f")
        if out and out[-1][1] == face:
            out[-1] = (out[-1][0] + ch, face)
        else:
            out.append((ch, face))
    return out


def text_width(text: str, size: int) -> int:
    """Width in pixels of ``text`` drawn by :func:`draw_text` at ``size``."""
    total = 0.0
    for run, face in runs(text):
        font, scale = _pillow_font(face, size)
        total += font.getlength(run) * scale
    return int(round(total))


def draw_text(image: Image.Image, xy: tuple[float, float], text: str, size: int, fill) -> None:
    """Draw ``text`` with its top-left at ``xy`` on ``image`` (RGB or RGBA), each run in its own face, all on
    one baseline."""
    draw = ImageDraw.Draw(image)
    x, y = float(xy[0]), float(xy[1])
    baseline = y + round(size * 0.8)
    for run, face in runs(text):
        font, scale = _pillow_font(face, size)
        if scale == 1.0:
            kwargs = {"anchor": "ls"} if isinstance(font, ImageFont.FreeTypeFont) else {}
            at = (x, baseline) if kwargs else (x, y)
            draw.text(at, run, fill=fill, font=font, embedded_color=bool(face and face.colour), **kwargs)
            x += font.getlength(run)
            continue
        width = max(1, int(round(font.getlength(run))))
        strike = Image.new("RGBA", (width, 128), (0, 0, 0, 0))
        ImageDraw.Draw(strike).text((0, 100), run, font=font, anchor="ls", embedded_color=True)
        small = strike.resize((max(1, round(width * scale)), max(1, round(128 * scale))), Image.Resampling.LANCZOS)
        image.paste(small, (int(round(x)), int(round(baseline - 100 * scale))), small)
        x += width * scale
