"""The README's examples run as written on what ships with gradscope: the bundled-files CLI block, the
``plan_model(model, plan).fit`` example (a compiled model hands on its compile settings), and a headless
screenshot without a display (in tests/qt/test_window_sizes.py). In the README and every guide under docs/, each
relative link reaches its file (and heading), each ``gradscope ...`` command parses with the CLI's own parser and
each Python block compiles; the site itself is built with ``mkdocs build --strict`` by scripts/docs.sh (CI)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np

from gradscope.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _bundled_block() -> list[list[str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("To try them on what ships with gradscope", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [shlex.split(line.split("#")[0]) for line in block.strip().splitlines() if line.strip()]


def test_the_bundled_files_cli_block_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # from any folder: `demo:` names the bundled files (resources/demo/... did not)
    commands = _bundled_block()
    assert [c[1] for c in commands] == ["explain", "explain", "evaluate", "gui"]
    for argv in commands[:3]:
        argv = [re.sub(r"^/tmp/", f"{tmp_path}/", a) for a in argv[1:]]
        assert main(argv) == 0, argv
    assert (tmp_path / "map.png").is_file()
    sides = sorted((tmp_path / "maps").glob("*.json"))
    assert len(sides) == 6 and json.loads(sides[0].read_text())["plan"]["name"] == "relu_backward_sigmoid"
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["complete"] and results["images"] == 24
    from gradscope.cli import bundled
    from gradscope.io.demo import demo_dir

    assert bundled("--plan=demo:plan.json") == f"--plan={demo_dir() / 'plan.json'}" and bundled("x:demo:") == "x:demo:"


def test_the_python_block_runs_as_written_from_another_folder(tmp_path):
    """Outside the checkout (in a folder of its own, in a fresh interpreter), the README's Python example runs as
    written: ``demo:`` names the bundled files in Python as on the command line."""
    import subprocess
    import sys

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("**Python.**", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    run = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "overlay.png").is_file() and (tmp_path / "overlay.json").is_file()
    assert "24 of 24 images scored" in run.stdout and "cmwp" in run.stdout


def test_plan_model_fits_a_compiled_model_as_the_readme_shows():
    import keras

    import gradscope as gs

    keras.utils.set_random_seed(0)
    i = keras.Input((4,))
    model = keras.Model(i, keras.layers.Dense(2, activation="relu")(keras.layers.Dense(8, activation="relu")(i)))
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    plan = gs.Plan().with_entry("activation:relu", "backward_as", {"activation": "sigmoid"})
    planned = gs.plan_model(model, plan)
    x, y = np.random.default_rng(0).normal(size=(16, 4)), np.ones((16, 2))
    before = [w.numpy().copy() for w in model.trainable_weights]
    history = planned.fit(x, y, epochs=1, batch_size=8, verbose=0)
    assert set(history.history) == {"loss", "mae"}  # the user's loss and metrics
    assert any(not np.array_equal(a, w.numpy()) for a, w in zip(before, model.trainable_weights))


DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _slug(heading: str) -> str:
    """The anchor GitHub and mkdocs give a heading (lower case, punctuation dropped, spaces as hyphens)."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_every_relative_link_reaches_its_file_and_heading():
    checked = 0
    for doc in DOCUMENTS:
        text = doc.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # an address outside the repository
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            assert file.exists(), f"{doc.name}: link to {target} reaches nothing"
            if anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), flags=re.M)
                assert anchor in {_slug(h) for h in headings}, f"{doc.name}: no heading #{anchor} in {file.name}"
            checked += 1
    assert checked > 20


def test_every_command_in_the_guides_parses():
    from gradscope.cli import build_parser

    commands = 0
    for doc in DOCUMENTS:
        for block in _blocks(doc.read_text(encoding="utf-8"), "bash"):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line.split(" #")[0].strip())
                if not words or words[0].rsplit("/", 1)[-1] != "gradscope" or len(words) < 2:
                    continue
                if words[1] in ("gui", "--version"):
                    continue  # the window's own parser (tests/qt) / prints and exits
                argv = [w for w in words[1:] if not (w.startswith("[") or w.endswith("]"))]  # [optional] parts
                try:
                    build_parser().parse_args(argv)
                except SystemExit:
                    raise AssertionError(f"{doc.name}: `{line.strip()}` does not parse") from None
                commands += 1
    assert commands > 25


def test_every_python_block_compiles():
    blocks = 0
    for doc in DOCUMENTS:
        for block in _blocks(doc.read_text(encoding="utf-8"), "python"):
            compile(block, f"{doc.name} python block", "exec")
            blocks += 1
    assert blocks >= 5
