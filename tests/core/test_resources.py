"""gradscope finds its own files (demo, icons, example rules) in a checkout, an install and a bundle."""

from __future__ import annotations

import sys

import pytest

from gradscope.core import resources


@pytest.fixture(autouse=True)
def _fresh_lookup():
    resources.resource_root.cache_clear()
    yield
    resources.resource_root.cache_clear()


def test_the_files_the_program_needs_are_found():
    for parts in (
        ("demo", "shapes_cnn.keras"),
        ("demo", "shapes_meta.json"),
        ("demo", "images", "boxes.json"),
        ("icons", "gradscope.svg"),
        ("rules", "weight_aware_example.py"),
        ("hypernet", "hypernet_assign.keras"),
    ):
        assert resources.resource_path(*parts).is_file(), parts


def test_an_installed_package_is_found_through_importlib_resources():
    from importlib import resources as importlib_resources

    root = importlib_resources.files("gradscope.resources")  # the build maps resources/ into the package
    assert resources.resource_root() == type(resources.resource_root())(str(root))


def test_a_bundle_looks_inside_itself(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert resources.resource_path("demo") == tmp_path / "gradscope" / "resources" / "demo"
