"""Patching in every front end but the window (tests/qt/test_patching_view.py): ``gs.patch`` with its export (PNG,
CSV, sidecar read back as the format says), ``gradscope patch`` (the same numbers), the notebook display (the
export's picture) and ``gradscope report``; on a CNN's grid cells, a text model with an Embedding, and a Hugging
Face folder in float32 and bfloat16."""

from __future__ import annotations

import base64
import csv
import io
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import gradscope as gs
from gradscope.app.files.exports import read_sidecar
from gradscope.app.files.patches import patch_picture
from gradscope.backend import keras
from gradscope.cli import main
from gradscope.core.errors import EXIT_USER_ERROR
from gradscope.io.demo import demo_image_paths, demo_model_path

pytest.importorskip("keras_hub")

HF = Path(__file__).resolve().parent / "data" / "hf"
CLEAN, CORRUPT = "the cat sat on the mat", "the cat sat in the mat"  # 11 tokens each in the tiny GPT-2's BPE


@pytest.fixture(scope="module")
def gpt2():
    return gs.open_engine(HF / "gpt2")


def test_python_patch_and_its_export(gpt2, tmp_path):
    r = gs.patch(gpt2, CLEAN, CORRUPT, vocab=HF / "gpt2", components="resid,attn,mlp", method="atp", compare=True)
    assert set(r.effects) == {"resid", "attn", "mlp"} and r.effects["resid"].shape == (2, 11)
    assert r.units[3] == " cat" and "' m'" in r.metric
    one = gs.patch(gpt2, CLEAN, CORRUPT, vocab=HF / "gpt2", method="exact")
    assert isinstance(one.effects, np.ndarray)  # one component: the (blocks, positions) array itself
    np.testing.assert_allclose(one.effects, r.exact["resid"])
    path = r.save(tmp_path / "grid")
    assert path.suffix == ".png" and np.array_equal(np.asarray(Image.open(path).convert("RGB")), patch_picture(r))
    sidecar = read_sidecar(path)  # checked against the declared format
    info = sidecar["patching"]
    assert info["method"] == "atp" and info["units"] == r.units and info["components"] == r.nodes
    assert info["clean"] == "<text>" and info["agreement"]["resid"]["correlation"] == pytest.approx(
        r.agreement["resid"].correlation
    )
    rows = list(csv.DictReader((tmp_path / info["effects_csv"]).open()))
    assert len(rows) == 3 * 2 * 11
    for row in rows:
        c, b, u = row["component"], int(row["block"]), int(row["unit"])
        assert float(row["atp"]) == r.effects[c][b, u] and float(row["exact"]) == r.exact[c][b, u]
    html = r._repr_html_()
    (picture,) = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert np.array_equal(
        np.asarray(Image.open(io.BytesIO(base64.b64decode(picture))).convert("RGB")), patch_picture(r)
    )
    assert "correlation" in html


def test_the_command_line_writes_what_python_computes(gpt2, tmp_path, capsys):
    out = tmp_path / "p.png"
    args = ["patch", str(HF / "gpt2"), "--clean", CLEAN, "--corrupt", CORRUPT, "--component", "resid,mlp"]
    assert main([*args, "--method", "exact", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "resid: largest at block 1, 'at'" in err and f"wrote {out}" in err
    rows = list(csv.DictReader((tmp_path / "p_effects.csv").open()))
    r = gs.patch(gpt2, CLEAN, CORRUPT, vocab=HF / "gpt2", components="resid,mlp", method="exact")
    got = {(row["component"], int(row["block"]), int(row["unit"])): float(row["exact"]) for row in rows}
    for c, effects in r.by_component.items():
        for (b, u), value in np.ndenumerate(effects):
            assert got[(c, b, u)] == pytest.approx(value, abs=1e-6)
    assert main([*args, "--method", "atp", "--compare", "--out", str(tmp_path / "q.png")]) == 0
    assert "against exact, correlation" in capsys.readouterr().err
    assert main(["patch", str(HF / "gpt2"), "--clean", CLEAN, "--corrupt", "the dog sat on the mat", "--out",
                 str(tmp_path / "x.png")]) == EXIT_USER_ERROR  # fmt: skip
    assert "11 tokens, the corrupted one 14" in capsys.readouterr().err
    report = tmp_path / "page.html"
    assert main(["report", str(tmp_path), "--out", str(report), "-q"]) == 0
    page = report.read_text()
    assert "logit of 91 &#x27; m&#x27; after position 10" in page and "atp against exact, correlation" in page


def test_a_cnn_by_grid_cells_from_the_command_line(tmp_path):
    images = demo_image_paths()
    out = tmp_path / "cells.png"
    args = ["patch", str(demo_model_path()), "--clean", str(images[0]), "--corrupt", str(images[1]), "--node", "conv2"]
    assert main([*args, "--grid", "4", "--method", "exact", "--out", str(out), "-q"]) == 0
    info = read_sidecar(out)["patching"]
    assert info["grid"] == [4, 4] and info["units"][5] == "1,1" and info["components"] == {"nodes": ["conv2"]}
    r = gs.patch(str(demo_model_path()), str(images[0]), str(images[1]), nodes=["conv2"], grid=4, method="exact")
    rows = list(csv.DictReader((tmp_path / "cells_effects.csv").open()))
    np.testing.assert_allclose([float(row["exact"]) for row in rows], r.effects[0], atol=1e-5)


def test_a_text_model_with_an_embedding_patched_by_hand():
    keras.utils.set_random_seed(5)
    ids = keras.Input((None,), dtype="int32")
    emb = keras.layers.Embedding(30, 6, name="emb")(ids)
    h = keras.layers.Dense(6, activation="tanh", name="mix")(emb)
    model = keras.Model(ids, keras.layers.Dense(3, name="out")(keras.layers.GlobalAveragePooling1D(name="pool")(h)))
    clean, corrupt = np.array([[3, 7, 1, 9, 4]]), np.array([[3, 7, 2, 9, 4]])
    r = gs.patch(model, clean, corrupt, target=1, nodes=["emb", "mix"], method="exact")
    e_clean, e_corrupt = (model.get_layer("emb")(x).numpy() for x in (clean, corrupt))

    def logit(e):
        return float(model.get_layer("out")(model.get_layer("pool")(model.get_layer("mix")(e)))[0, 1])

    for p in range(5):
        patched = e_clean.copy()
        patched[0, p] = e_corrupt[0, p]
        assert r.effects[0, p] == pytest.approx(logit(patched) - logit(e_clean), abs=1e-5)
    assert r.effects[0, 2] != 0 and not np.any(np.delete(r.effects[0], 2))  # only the changed token matters


def test_a_bfloat16_folder_is_patched_as_it_runs():
    """In bfloat16 the metric is read in float32; exact and AtP follow the float32 model's within bfloat16's
    precision, and patching the last block's output at the last position gives the corrupted run's value."""
    ref = np.load(HF / "llama_patching.npz")
    engine = gs.open_engine(HF / "llama", dtype="bfloat16")
    target = gs.Target(kind="token", index=int(ref["token"]))
    scale = np.abs(ref["exact"]).max()
    for method in ("exact", "atp"):
        r = gs.patch(engine, ref["clean"], ref["corrupt"], target=target, components="resid,attn,mlp", method=method)
        got = np.stack([r.by_component[c] for c in ("resid", "attn", "mlp")])
        assert np.abs(got - ref[method]).max() < 0.1 * scale  # bfloat16 keeps ~3 significant digits
        assert not got[:, :, :4].any()  # before the first difference: exactly 0, as in float32
        if method == "exact":
            assert r.by_component["resid"][-1, -1] == pytest.approx(r.corrupt_value - r.clean_value, abs=1e-6)


@pytest.mark.slow  # ~30 s of Ray start-up: out of the default run, run by CI on its own (.ci/run)
def test_ray_gives_the_grid_of_the_local_run():
    pytest.importorskip("ray.data")
    from gradscope.app.evaluation.on_ray import RayOptions

    ids = [5, 9, 12, 30, 44, 7, 21, 3]
    other = [5, 9, 12, 31, 44, 7, 21, 3]
    how = dict(components="resid,attn", method="atp", compare=True)
    local = gs.patch(HF / "llama", ids, other, **how)
    remote = gs.patch(HF / "llama", ids, other, ray=RayOptions(num_cpus=2, actors=2), **how)
    for component in ("resid", "attn"):
        np.testing.assert_allclose(remote.exact[component], local.exact[component], atol=1e-6)
        np.testing.assert_allclose(remote.effects[component], local.effects[component], atol=1e-6)
        assert remote.agreement[component].correlation == pytest.approx(local.agreement[component].correlation)
    exact = gs.patch(HF / "llama", ids, other, components="resid", method="exact", ray=RayOptions(num_cpus=2, actors=1))
    np.testing.assert_allclose(exact.effects, local.exact["resid"], atol=1e-6)
