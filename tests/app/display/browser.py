"""Headless Chromium (Debian's ``chromium``) to render HTML to a PNG, as a person's browser would show it.

Tests that need it skip where it is not installed, except where ``GRADSCOPE_REQUIRE_BROWSER=1`` (CI and
``scripts/test.sh`` as root install it), so CI never passes by skipping them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
)  # fmt: skip


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("GRADSCOPE_REQUIRE_BROWSER") == "1":
            pytest.fail("GRADSCOPE_REQUIRE_BROWSER=1 but no chromium on PATH (apt-get install chromium)")
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    return found


def screenshot(html_file: Path, png: Path, width: int = 1280, height: int = 1600) -> np.ndarray:
    """The page at ``width`` x ``height`` CSS pixels as uint8 RGB; offline (the page must stand alone)."""
    profile = png.with_suffix(".profile")
    subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
         f"--screenshot={png}", html_file.resolve().as_uri()],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return np.asarray(Image.open(png).convert("RGB"))


def assert_drawn(pixels: np.ndarray, *, min_colours: int = 50) -> None:
    """Not blank: many distinct colours, and something else than the white page."""
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    flat = pixels.reshape(-1, 3)
    colours = len(np.unique(flat[:: max(1, len(flat) // 200_000)], axis=0))
    assert colours >= min_colours, f"only {colours} colours: a blank page?"
    assert (flat < 250).any(axis=1).mean() > 0.01, "almost every pixel is white"
