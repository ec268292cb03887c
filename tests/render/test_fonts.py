"""Text for every script: each character is drawn by an installed face that holds it, not as Pillow's box."""

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from gradscope.render import fonts
from gradscope.render.positions import FONT_SIZE, PAD, token_strip

SAMPLES = {
    "Latin": "Grüße",
    "Greek": "Γειά",
    "Cyrillic": "Привет",
    "Arabic": "مرحبا",
    "CJK": "你好世界",
    "emoji": "👍",
}
PACKAGE = "fonts-dejavu-core fonts-noto-cjk fonts-noto-color-emoji (scripts/setup.sh installs them as root)"


def test_charset_ranges_are_read_as_fontconfig_writes_them():
    starts, ends = fonts._parse_charset("20-7e a0 370-3ff")
    face = fonts.Face("x.ttf", 0, "X", "Regular", False, starts, ends)
    assert face.holds(" ") and face.holds("~") and face.holds("\xa0") and face.holds("Ω")
    assert not face.holds("\x1f") and not face.holds("\x7f") and not face.holds("\xa1") and not face.holds("你")


def test_runs_keep_sequences_together_and_cover_the_text():
    text = "e\u0301 👨\u200d👩\u200d👧 ok"
    cut = fonts.runs(text)
    assert "".join(r for r, _ in cut) == text
    assert all(not r.startswith(("\u200d", "\u0301")) for r, _ in cut[1:]) or len(cut) == 1
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"
    if fonts.face_for("\U0001f468") is not None:
        assert any(family in r for r, _ in cut), cut  # the whole family in one run: one face draws it


def _ink(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("L")) < 128


def _drawn(face: fonts.Face, text: str) -> np.ndarray:
    font, scale = fonts._pillow_font(face, 32)
    canvas = Image.new("RGB", (int(font.getlength(text)) + 20, 160), "white")
    ImageDraw.Draw(canvas).text((5, 5), text, font=font, fill="black", embedded_color=face.colour)
    return np.asarray(canvas.convert("L"))


@pytest.mark.parametrize("script", list(SAMPLES))
def test_each_script_is_drawn_by_a_face_that_holds_it(script):
    text = SAMPLES[script]
    chosen = {fonts.face_for(ch) for ch in text}
    if None in chosen:
        pytest.skip(f"no installed font holds {script} here; install {PACKAGE}")
    for ch in text:
        assert fonts.face_for(ch).holds(ch)
    # The chosen face draws a real glyph: not its own missing-glyph box (a private-use code point none holds).
    for face in chosen:
        mine = "".join(ch for ch in text if fonts.face_for(ch) is face)
        box = "\U0010fffd" * len(mine)
        assert not face.holds("\U0010fffd")
        assert not np.array_equal(_drawn(face, mine), _drawn(face, box)), (script, face.family)


def test_pillows_bundled_font_would_draw_boxes_for_cjk():
    """Why the faces are needed: the bundled font draws every CJK character as the same box."""
    font = ImageFont.load_default(size=24)
    pictures = []
    for ch in "你好":
        canvas = Image.new("L", (40, 40), 255)
        ImageDraw.Draw(canvas).text((4, 4), ch, font=font, fill=0)
        pictures.append(np.asarray(canvas))
    assert np.array_equal(*pictures)


def test_token_strip_draws_each_script_inside_its_box():
    tokens = list(SAMPLES.values())
    if any(fonts.face_for(ch) is None for t in tokens for ch in t):
        pytest.skip(f"not every script has a font here; install {PACKAGE}")
    strip = token_strip(tokens, np.zeros(len(tokens)), width=1200)  # score 0: white boxes, black ink
    ink = strip.min(axis=2) < 100
    line = FONT_SIZE + 2 * PAD
    x = PAD
    for token in tokens:
        w = fonts.text_width(token, FONT_SIZE) + 2 * PAD
        inside = ink[PAD + 1 : PAD + line - 1, x + 1 : x + w - 1]
        assert inside.any(), token  # the token's glyphs, in its own box
        x += w + 2
    assert not ink[:, x + 4 :].any()  # nothing drawn past the last box


def test_width_matches_what_is_drawn():
    text = "".join(SAMPLES.values())
    width = fonts.text_width(text, 20)
    canvas = Image.new("RGB", (width + 200, 60), "white")
    fonts.draw_text(canvas, (10, 10), text, 20, (0, 0, 0))
    columns = np.flatnonzero(np.asarray(canvas.convert("L")).min(axis=0) < 200)
    assert columns[0] >= 10 and columns[-1] <= 10 + width + 4
    assert columns[-1] - columns[0] >= 0.8 * width


@pytest.mark.parametrize("pair", ["你好", "Жж", "αβ", "بت"])
def test_token_strip_tells_characters_apart(pair):
    """With boxes for glyphs, two characters of a script come out the same; drawn by a face, they differ."""
    if any(fonts.face_for(ch) is None for ch in pair):
        pytest.skip(f"no font for {pair!r} here; install {PACKAGE}")
    strip = token_strip(list(pair), np.zeros(2), width=400)
    ink = strip.min(axis=2) < 100
    w0 = fonts.text_width(pair[0], FONT_SIZE) + 2 * PAD
    w1 = fonts.text_width(pair[1], FONT_SIZE) + 2 * PAD
    first = ink[:, PAD : PAD + w0]
    second = ink[:, PAD + w0 + 2 : PAD + w0 + 2 + w1]
    assert first.any() and second.any()
    assert first.shape != second.shape or not np.array_equal(first, second)


def test_emoji_are_drawn_in_colour_where_a_colour_face_holds_them():
    """Issue 51: 😀 came out as DejaVu's monochrome outline beside a colour 🎬 and 👍 (text faces are tried first,
    so digits never come out as emoji)."""
    colour = [f for f in fonts.faces() if f.colour]
    if not any(f.holds("\U0001f600") for f in colour):
        pytest.skip(f"no colour emoji font here; install {PACKAGE}")
    for ch in "\U0001f600\U0001f3ac\U0001f44d":
        assert fonts.face_for(ch).colour, (ch, fonts.face_for(ch).family)
    assert [face.colour for _, face in fonts.runs("ok \U0001f600 1")] == [False, True, False]
    heart = fonts.runs("\u2764\ufe0f")  # asked for as emoji by its variation selector
    assert len(heart) == 1 and (heart[0][1].colour or not any(f.holds("\u2764") for f in colour))
    assert not fonts.face_for("1").colour and not fonts.face_for("\u00a9").colour
