"""Lookup tables and colormap application."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.render import apply_colormap, available_colormaps, is_diverging, lut

PERCEPTUAL = ["viridis", "inferno", "magma", "plasma", "turbo"]


def test_jet_endpoints_and_structure() -> None:
    j = lut("jet").astype(int)
    assert j.shape == (256, 3)
    assert tuple(j[0]) == (0, 0, 128)  # dark blue
    assert tuple(j[-1]) == (128, 0, 0)  # dark red
    r, g, b = j.T
    # red never falls before its peak, blue never rises after its start; green is a single hump
    peak_r = int(np.argmax(r))
    assert np.all(np.diff(r[: peak_r + 1]) >= 0) and np.all(np.diff(r[peak_r:]) <= 0)
    assert np.all(np.diff(b[int(np.argmax(b)) :]) <= 0)
    peak_g = int(np.argmax(g))
    assert np.all(np.diff(g[: peak_g + 1]) >= 0) and np.all(np.diff(g[peak_g:]) <= 0)
    assert g[0] == 0 and g[-1] == 0 and g.max() == 255
    # middle is green-ish (cyan -> yellow transition)
    assert tuple(j[128]) == pytest.approx((128, 255, 127), abs=2)


def test_gray_is_identity() -> None:
    g = lut("gray")
    np.testing.assert_array_equal(g, np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1))


@pytest.mark.parametrize("name", ["bwr", "coolwarm"])
def test_diverging_maps(name: str) -> None:
    t = lut(name, 257).astype(int)
    assert is_diverging(name)
    assert t[0, 2] > t[0, 0] and t[-1, 0] > t[-1, 2]  # blue end, red end
    assert t[128].min() >= 210  # near-white centre
    np.testing.assert_array_equal(apply_colormap(np.array([0.0]), name, signed=True)[0], lut(name)[128])


def test_coolwarm_close_to_matplotlib() -> None:
    mpl = pytest.importorskip("matplotlib")
    ref = np.rint(mpl.colormaps["coolwarm"](np.linspace(0, 1, 256))[:, :3] * 255)
    assert np.abs(lut("coolwarm").astype(int) - ref).max() <= 4


@pytest.mark.parametrize("name", PERCEPTUAL)
def test_pyqtgraph_backed_luts(name: str) -> None:
    if name not in available_colormaps():
        pytest.skip("pyqtgraph colormap data not installed")
    t = lut(name)
    assert t.shape == (256, 3) and t.dtype == np.uint8
    assert len({tuple(row) for row in t}) > 200  # a real gradient, not a constant fallback


def test_viridis_matches_pyqtgraph_own_lut() -> None:
    pytest.importorskip("PySide6")
    pgcm = pytest.importorskip("pyqtgraph.colormap")
    ref = pgcm.get("viridis").getLookupTable(0.0, 1.0, nPts=256, alpha=False).astype(int)
    assert np.abs(lut("viridis").astype(int) - ref).max() <= 1
    assert tuple(lut("viridis")[0]) == pytest.approx((68, 1, 84), abs=1)


def test_numpy_maps_always_available() -> None:
    names = available_colormaps()
    for name in ("jet", "gray", "bwr", "coolwarm"):
        assert name in names
    assert lut("JET").shape == (256, 3)


def test_unknown_and_bad_n() -> None:
    with pytest.raises(ValueError, match="Unknown colormap 'rainbowz'"):
        lut("rainbowz")
    with pytest.raises(ValueError):
        lut("jet", 1)


def test_lut_is_a_copy() -> None:
    a = lut("jet")
    a[:] = 0
    assert lut("jet")[0, 2] == 128


def test_apply_colormap_indexes_lut() -> None:
    m = np.array([[0.0, 1.0], [0.5, np.nan]])
    out = apply_colormap(m, "jet")
    j = lut("jet")
    assert out.shape == (2, 2, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out[0, 0], j[0])
    np.testing.assert_array_equal(out[0, 1], j[255])
    np.testing.assert_array_equal(out[1, 0], j[128])
    np.testing.assert_array_equal(out[1, 1], j[0])  # NaN drawn as 0
    np.testing.assert_array_equal(apply_colormap(np.array([-5.0, 7.0]), "gray")[:, 0], [0, 255])


def test_apply_colormap_signed() -> None:
    out = apply_colormap(np.array([-1.0, 0.0, 1.0]), "bwr", signed=True)
    t = lut("bwr")
    np.testing.assert_array_equal(out, t[[0, 128, 255]])
