"""Build mapping only (metadata lives in pyproject.toml): ``resources/`` stays the source folder at the top of
the repository and is installed as the package ``gradscope.resources``, so a wheel, an sdist, an editable
install and a PyInstaller bundle all find the demo model, images, icons and example rules the same way
(``gradscope.core.resources``)."""

from pathlib import Path

from setuptools import find_packages, setup

# Every folder under resources/ is a data package (setuptools wants data folders listed as packages).
data_packages = ["gradscope.resources"] + [
    "gradscope.resources." + ".".join(d.relative_to("resources").parts)
    for d in sorted(Path("resources").rglob("*"))
    if d.is_dir() and d.name != "__pycache__"
]

setup(
    packages=[*find_packages(include=["gradscope", "gradscope.*"]), *data_packages],
    package_dir={"gradscope.resources": "resources"},
    package_data={name: ["*"] for name in data_packages},
    exclude_package_data={name: ["*.pyc"] for name in data_packages},
)
