"""HTML pieces every display is made of: escaped text, PNGs embedded as data URIs, tables, and the page.

A notebook output is a fragment (``fragment``): one ``<div class="gs">`` with its own scoped style, no script, no
address outside itself. A report is a whole page (``page``) of such fragments. Both read at 1280 px and on a
phone-width screen: pictures shrink to the width, wide tables scroll inside their box.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

STYLE = """
.gs{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans",sans-serif;font-size:14px;color:#222;
  line-height:1.4;max-width:100%}
.gs h2{font-size:18px;margin:16px 0 6px}.gs h3{font-size:15px;margin:12px 0 4px}
.gs figure{margin:6px 0}.gs figure img{max-width:100%;height:auto;display:block}.gs figure img.chart{max-width:none}
.gs .grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(280px,1fr));gap:10px 16px;align-items:start}
.gs figcaption,.gs .note{color:#555;font-size:13px;margin-top:4px}
.gs .scroll{overflow-x:auto;max-width:100%}
.gs table{border-collapse:collapse;font-variant-numeric:tabular-nums}
.gs th,.gs td{border-bottom:1px solid #ddd;padding:3px 8px;text-align:right;white-space:nowrap}
.gs th:first-child,.gs td:first-child{text-align:left}
.gs .alert{border-left:4px solid #c62828;background:#fdecea;padding:6px 10px;margin:6px 0}
.gs .ok{border-left:4px solid #2e7d32;background:#edf7ed;padding:6px 10px;margin:6px 0}
.gs .strip{display:flex;flex-wrap:wrap;gap:2px;align-items:baseline}
.gs .tok{padding:2px 4px;border:1px solid #cfd8dc;border-radius:2px;white-space:pre;font-size:15px}
.gs .matrix td{padding:0;border:1px solid #fff;min-width:22px;height:20px;text-align:center;font-size:11px}
.gs .matrix th{font-weight:normal;font-size:12px;padding:2px 4px}
.gs .matrix thead th{writing-mode:vertical-rl;transform:rotate(180deg);text-align:left;max-height:140px}
.gs .meta td,.gs .meta th{text-align:left;white-space:normal;word-break:break-word}
.gs .meta td:first-child,.gs .meta th:first-child{white-space:nowrap;word-break:normal}
"""


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def png_bytes(picture: np.ndarray) -> bytes:
    """uint8 (H, W[, 3|4]) pixels as PNG bytes."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(picture)).save(buf, format="PNG")
    return buf.getvalue()


def img(png: bytes | np.ndarray, alt: str, *, width: int | None = None, photo: bool = False) -> str:
    """An ``<img>`` holding the picture itself (a data URI: the HTML stands alone): PNG, or with ``photo`` (an overlay
    on a photograph, which PNG compresses poorly: six maps made a 1.7 MB page) JPEG at quality 90."""
    if photo and not isinstance(png, bytes):
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(png)).convert("RGB").save(buf, format="JPEG", quality=90)
        data, kind = buf.getvalue(), "jpeg"
    else:
        data, kind = (png if isinstance(png, bytes) else png_bytes(png)), "png"
    size = f' width="{int(width)}"' if width else ""
    return f'<img src="data:image/{kind};base64,{base64.b64encode(data).decode("ascii")}" alt="{esc(alt)}"{size}>'


def figure(
    png: bytes | np.ndarray,
    caption: str,
    *,
    alt: str = "",
    width: int | None = None,
    photo: bool = False,
    chart: bool = False,
) -> str:
    """``chart``: a picture with text in it (a flow chart, a heat map's labels) shown at its own size, scrolling
    sideways where the column is narrower: shrunk to a docs column or a phone, its 11 px labels were 5 px."""
    picture = img(png, alt or caption, width=width, photo=photo)
    if chart:
        picture = '<div class="scroll">' + picture.replace("<img ", '<img class="chart" ', 1) + "</div>"
    return f"<figure>{picture}<figcaption>{esc(caption)}</figcaption></figure>"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], *, css: str = "") -> str:
    """A table in a horizontally scrolling box (no header row when ``header`` is empty); cells are escaped."""
    head = "<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr></thead>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table class="{css}">{head}<tbody>{body}</tbody></table></div>'


def alerts(lines: Sequence[str], *, ok: str = "") -> str:
    """Red boxes for what went wrong, or one green box saying ``ok`` when nothing did."""
    if not lines:
        return f'<div class="ok">{esc(ok)}</div>' if ok else ""
    return "".join(f'<div class="alert">{esc(line)}</div>' for line in lines)


def fragment(body: str) -> str:
    """A notebook output: the body in a ``.gs`` box with its scoped style."""
    return f'<div class="gs"><style>{STYLE}</style>{body}</div>'


def page(title: str, body: str, meta: Sequence[tuple[str, Any]] = ()) -> str:
    """A whole self-contained page: no script, no stylesheet or font from elsewhere."""
    facts = table((), meta, css="meta") if meta else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{esc(title)}</title><style>body{{margin:0;padding:12px 16px}}{STYLE}</style></head>"
        f'<body><div class="gs"><h1 style="font-size:22px">{esc(title)}</h1>{body}'
        f"<h2>How this was made</h2>{facts}</div></body></html>\n"
    )
