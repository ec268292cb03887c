"""Bad input, round 6 (issue 58): a plan's name that ran code through ``snippet``, a report that embedded any file
named ``*.png``, a sharded index that read weights from anywhere, checkpoint files that were FIFOs, devices or
absurd configs, text that is not Unicode, prompts tried as paths, tokens named in ``vocab.json``'s key order, a
broken tokenizer that stopped runs given ids, sampling methods on a generation, wrong types at the API's edge,
two outputs naming one file, and layer names XML forbids. Each test fails on the code before the fix."""

from __future__ import annotations

import ast
import base64
import io
import json
import os
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import gradscope as gs
from gradscope.app.evaluation.run import EvaluationError
from gradscope.app.files.exports import plan_snippet
from gradscope.cli import main
from gradscope.core.errors import EXIT_USER_ERROR, GradscopeError, InputError, ModelLoadError, PlanError
from gradscope.io import memory
from gradscope.io.checkpoints.size import parameter_estimate
from gradscope.io.datasets import DataProblem, ImageFolder
from gradscope.io.demo import demo_image_paths, demo_model_path
from gradscope.io.sequences import Vocabulary

keras = pytest.importorskip("keras")
pytest.importorskip("keras_hub")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

HF = Path(__file__).resolve().parent / "data" / "hf"
DEMO = str(demo_model_path())


def folder_copy(tmp_path: Path, family: str, name: str | None = None) -> Path:
    return Path(shutil.copytree(HF / family, tmp_path / (name or family)))


def _feed(ids: list[int]) -> dict:
    return {"token_ids": np.array([ids]), "padding_mask": np.ones((1, len(ids)), "int32")}


# ------------------------------------------------------------------------------------------- 1. generated code
HOSTILE_NAMES = (
    'x"""; __import__("os").system("touch PWNED"); """',
    "x'''; __import__('os').system('touch PWNED'); '''",
    'unbalanced """ quote',
    "a\nimport os; os.system('touch PWNED')\n#",
    "carriage\rreturn and \u2028 line separator and a trailing backslash \\",
)
ALLOWED_CALLS = {"Plan.from_dict", "load_model", "plan_model", "print", "load_rule_file", "load_rule_plugins"}


def _calls(script: str) -> set[str]:
    return {ast.unparse(node.func) for node in ast.walk(ast.parse(script)) if isinstance(node, ast.Call)}


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_plan_name_is_a_literal_in_the_generated_script_never_code(name):
    plan = gs.Plan(name=name).with_entry("activation:relu", "zero")
    script = plan_snippet(plan, 'model"""\n.keras', method=name)
    assert _calls(script) <= ALLOWED_CALLS  # parses, and calls only what gradscope writes
    module = ast.parse(script)
    assert ast.get_docstring(module).startswith("Train with a gradscope plan (PLAN below)")
    literals = {n.value for n in ast.walk(module) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert name in literals and 'model"""\n.keras' in literals  # the values themselves, as string literals


def test_the_snippet_command_writes_a_script_that_runs_no_code_of_the_plans(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"schema": 2, "name": HOSTILE_NAMES[0], "entries": [{"select": "c1", "rule": "zero"}]}))
    model = tmp_path / "tiny.keras"
    from tests.engine.fixtures import tiny_cnn

    tiny_cnn(seed=0).save(model)
    assert main(["snippet", str(model), "--plan", str(plan), "--out", "s.py", "--quiet"]) == 0
    import runpy

    namespace = runpy.run_path(str(tmp_path / "s.py"), run_name="__main__")
    assert not (tmp_path / "PWNED").exists()
    assert namespace["PLAN"].name == HOSTILE_NAMES[0] == namespace["PLAN_NAME"]


# ------------------------------------------------------------------------------------------- 2. report
def _data_uris(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/(?:png|jpeg);base64,([^"]+)"', html)]


@pytest.fixture()
def exported(tmp_path):
    folder = tmp_path / "maps"
    e = gs.explain(DEMO, str(demo_image_paths()[0]), method="gradient")
    e.save(folder / "good.png")
    return folder


def test_a_report_embeds_only_pictures_that_are_images_inside_the_folder(exported, tmp_path):
    sidecar = (exported / "good.json").read_text()
    outside = tmp_path / "private.png"
    Image.fromarray(np.full((40, 40, 3), (250, 10, 10), np.uint8)).save(outside)  # an image, but not the folder's
    secret = b"SECRET-" + os.urandom(16).hex().encode()
    (tmp_path / "secret.txt").write_bytes(secret)
    links = {"hostname": "/etc/hostname", "zero": "/dev/zero", "photo": str(outside), "text": tmp_path / "secret.txt"}
    for stem, target in links.items():
        (exported / f"{stem}.png").symlink_to(target)
    (exported / "zeros.png").write_bytes(bytes(5 << 20))  # 5 MB of zeros named .png
    with_tail = exported / "tail.png"
    with_tail.write_bytes((exported / "good.png").read_bytes() + secret)  # a PNG with a file glued on
    for stem in (*links, "zeros", "tail"):
        (exported / f"{stem}.json").write_text(sidecar)
    out = tmp_path / "page.html"
    assert main(["report", str(exported), "--out", str(out)]) == 0
    html = out.read_text()
    pictures = _data_uris(html)
    assert len(pictures) == 2  # good.png and tail.png, as their pixels
    assert not any(secret in p for p in pictures) and secret.decode() not in html
    good = Image.open(exported / "good.png").convert("RGB")
    good.thumbnail((480, 480))  # drawn at the width the page shows it, as JPEG: the same picture, within its loss
    shown = [np.asarray(Image.open(io.BytesIO(p)).convert("RGB"), np.int16) for p in pictures]
    assert any(p.shape == np.asarray(good).shape and np.abs(p - np.asarray(good)).mean() < 4 for p in shown)
    assert "5 file(s) left out" in html
    for stem in links:
        assert f"{stem}.png is not a regular file inside maps" in html
    assert "zeros.png is not an image" in html


# ------------------------------------------------------------------------------------------- 3. sharded index
def _shard(folder: Path, rename: dict[str, str] | None = None) -> dict[str, str]:
    """``model.safetensors`` split into two shards and an index (``rename``: what the index calls a shard)."""
    tensors = safetensors_numpy.load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    keys = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2], "model-00002-of-00002.safetensors": []}
    shards["model-00002-of-00002.safetensors"] = keys[len(keys) // 2 :]
    weight_map = {}
    for name, names in shards.items():
        safetensors_numpy.save_file({k: tensors[k] for k in names}, str(folder / name), metadata={"format": "pt"})
        weight_map.update({k: (rename or {}).get(name, name) for k in names})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


def test_a_sharded_folder_opens_with_the_logits_of_the_whole_file(tmp_path):
    folder = folder_copy(tmp_path, "llama")
    _shard(folder)
    ref = np.load(HF / "llama.npz")
    logits = np.asarray(gs.open_engine(folder).model(_feed(ref["ids"].tolist())))[0]
    np.testing.assert_allclose(logits, ref["logits"], atol=1e-5 * np.abs(ref["logits"]).max(), rtol=0)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("../elsewhere/x.safetensors", "not inside the folder"),
        ("ABSOLUTE", "not inside the folder"),
        ("../../../../etc/passwd", "not inside the folder"),
        ("model-00003-of-00002.safetensors", "which the folder does not have"),
        ("fifo.safetensors", "not a regular file"),
    ],
)
def test_an_index_names_only_regular_files_of_its_own_folder(tmp_path, name, says, monkeypatch):
    folder = folder_copy(tmp_path, "llama")
    (tmp_path / "elsewhere").mkdir()
    if name == "ABSOLUTE":
        name = str(tmp_path / "elsewhere" / "y.safetensors")
    _shard(folder, {"model-00002-of-00002.safetensors": name})
    second = folder / "model-00002-of-00002.safetensors"
    shutil.copy(second, tmp_path / "elsewhere" / "x.safetensors")  # the weights are really there: loading worked
    shutil.copy(second, tmp_path / "elsewhere" / "y.safetensors")
    if name == "fifo.safetensors":
        os.mkfifo(folder / name)
    import safetensors

    opened: list[str] = []
    real_open = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open", lambda path, *a, **k: opened.append(path) or real_open(path, *a, **k))
    with pytest.raises(ModelLoadError, match=re.escape(says)):
        gs.open_engine(folder)
    assert opened == []  # refused before keras_hub opened any weight file


# ------------------------------------------------------------------------------------------- 4-6. folder files
def _replace(path: Path, how: str) -> None:
    path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    elif how == "zero":
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize(
    ("file", "how", "says"),
    [
        ("config.json", "deep", "nested 200000 levels deep"),
        ("config.json", "zero", "is not a regular file"),
        ("config.json", "fifo", "is not a regular file"),
        ("config.json", "large", "a checkpoint config is at most 16 MiB"),
        ("model.safetensors", "fifo", "model.safetensors is not a regular file"),
        ("vocab.json", "zero", "vocab.json is not a regular file"),
        ("tokenizer.json", "fifo", "tokenizer.json is not a regular file"),
    ],
)
def test_checkpoint_files_that_are_not_what_they_say_are_one_line(tmp_path, file, how, says):
    folder = folder_copy(tmp_path, "llama")
    if how == "deep":
        (folder / file).write_text('{"a":' * 200_000 + "1" + "}" * 200_000)
    elif how == "large":
        config = json.loads((folder / file).read_text())
        (folder / file).write_text(json.dumps({**config, "note": "x" * (17 << 20)}))
    else:
        _replace(folder / file, how)
    with pytest.raises(GradscopeError, match=re.escape(says)):
        gs.open_engine(folder)
    if file in ("vocab.json", "tokenizer.json"):  # the tokenizer alone, as --vocab FOLDER reads it
        with pytest.raises(GradscopeError, match=re.escape(says)):
            Vocabulary.load(folder)


def test_a_config_that_describes_more_than_its_weights_hold_is_refused_before_building(tmp_path, monkeypatch):
    folder = folder_copy(tmp_path, "llama")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1_000_000}))
    with pytest.raises(ModelLoadError, match=r"about 7\.2 B parameters \(num_hidden_layers 1,000,000\).*do(es)? not"):
        gs.open_engine(folder)
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(memory, "available_bytes", lambda: 1000)  # the weights fit on disk, not in memory
    with pytest.raises(ModelLoadError, match=r"needs about 0\.0 GiB in float32; this machine has 0\.0 GiB available"):
        gs.open_engine(folder)


@pytest.mark.parametrize("family", sorted(p.name for p in HF.iterdir() if p.is_dir()))
def test_the_size_estimate_never_exceeds_the_parameters_a_folder_holds(family):
    """A lower bound, so that the check never refuses a real folder: at most the parameters its weights hold."""
    from safetensors import safe_open

    held = 0
    with safe_open(str(HF / family / "model.safetensors"), framework="np") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open is not a dict
            held += int(np.prod(f.get_slice(key).get_shape()))
    estimate, _ = parameter_estimate(json.loads((HF / family / "config.json").read_text()))
    assert 0.5 * held < estimate <= held


# ------------------------------------------------------------------------------------------- 7-10. text
def test_text_that_is_not_unicode_is_one_line(capsys, tmp_path):
    with pytest.raises(InputError, match="character 4 is a lone surrogate U\\+D800"):
        gs.explain(HF / "gpt2", "the \ud800 cat")
    args = ["explain", str(HF / "gpt2"), "--text", "\udcff", "--out", str(tmp_path / "o.png")]  # argv's b"\xff"
    assert main(args) == EXIT_USER_ERROR
    assert "character 0 is the byte 0xff, which is not UTF-8" in capsys.readouterr().err


def test_a_long_prompt_is_text_not_a_path(tmp_path):
    prompt = "the cat " * 40  # 320 characters without a slash
    e = gs.explain(HF / "llama", prompt)
    assert len(e.labels) > 40
    g = gs.graph(HF / "llama", prompt)
    assert g.flow is not None
    ids = " ".join(["15"] * 100)  # 299 characters: --tokens too
    assert main(["explain", str(HF / "llama"), "--tokens", ids, "--out", str(tmp_path / "o.png"), "-q"]) == 0
    assert len(json.loads((tmp_path / "o.json").read_text())["positions"]) == 100


def test_tokens_are_named_by_their_ids_not_by_the_order_of_vocab_json(tmp_path, capsys):
    folder = folder_copy(tmp_path, "gpt2", "shuffled")
    vocab = json.loads((folder / "vocab.json").read_text())
    (folder / "vocab.json").write_text(json.dumps(dict(sorted(vocab.items(), key=lambda kv: -kv[1]))))
    by_id = {i: t for t, i in vocab.items()}
    ids = [14, 15, 10, 40]
    assert gs.explain(folder, ids).labels == tuple(by_id[i] for i in ids)
    out = tmp_path / "o.png"
    assert main(["explain", str(folder), "--tokens", "14 15 10", "--next", by_id[40], "--out", str(out), "-q"]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["explained_token"]["id"] == 40


def test_a_broken_tokenizer_stops_only_text(tmp_path, capsys):
    folder = folder_copy(tmp_path, "gemma3")
    (folder / "tokenizer.model").write_bytes(os.urandom(500))
    e = gs.explain(folder, "1 2 3")
    assert e.labels == ("1", "2", "3")
    assert gs.explain(folder, [1, 2, 3]).labels == ("1", "2", "3")
    out = str(tmp_path / "o.png")
    assert main(["explain", str(folder), "--tokens", "1 2 3", "--out", out, "-q"]) == 0
    with pytest.raises(InputError, match="cannot convert the tokenizer"):
        gs.explain(folder, "hello there")
    assert main(["explain", str(folder), "--text", "hello there", "--out", out]) == EXIT_USER_ERROR
    assert "cannot convert the tokenizer" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- 11-15
def test_a_generation_refuses_sampling_methods_as_explain_does(tmp_path, capsys):
    with pytest.raises(GradscopeError, match="smoothgrad averages gradients over noisy copies"):
        gs.explain_generation(HF / "gpt2", "1 2 3", steps=2, method="smoothgrad")
    out = tmp_path / "g.png"
    args = ["explain", str(HF / "gpt2"), "--tokens", "1 2 3", "--generate", "2", "--method", "smoothgrad"]
    assert main([*args, "--out", str(out)]) == EXIT_USER_ERROR
    assert not out.exists() and "noisy copies" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("entry", "says"),
    [((5, "zero", {}), "select must be"), (("c1", None, {}), "rule must be"), (("c1", "zero", [1]), "params must")],
)
def test_a_plan_entry_of_the_wrong_types_is_refused_where_it_is_made(entry, says):
    with pytest.raises(PlanError, match=says):
        gs.Plan().with_entry(*entry)
    with pytest.raises(PlanError, match=says):
        gs.PlanEntry(*entry)


def test_evaluation_methods_must_be_names(tmp_path):
    with pytest.raises(EvaluationError, match="methods are names.*got int 1"):
        gs.evaluate(DEMO, "resources/demo/eval", methods=[1, 2], out=tmp_path / "e")
    with pytest.raises(EvaluationError, match="metrics are names"):
        gs.evaluate(DEMO, "resources/demo/eval", metrics=5, out=tmp_path / "e")
    assert not (tmp_path / "e").exists()


def test_two_outputs_that_name_one_file_are_refused_before_any_work(tmp_path, capsys):
    from tests.engine.training.test_plan_model import batch, mlp

    x, y = batch()
    model = mlp()
    model.compile("sgd", "mse")
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[gs.GradientMonitor(tmp_path / "log", every=1)])
    same = str(tmp_path / "a.png")
    assert main(["train-report", str(tmp_path / "log"), "--csv", same, "--png", same]) == EXIT_USER_ERROR
    assert main(["flow", DEMO, "--csv", same, "--png", same]) == EXIT_USER_ERROR
    (events,) = (tmp_path / "log").glob("events.out.tfevents.*")
    assert main(["train-report", str(tmp_path / "log"), "--csv", str(events)]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.count("--png") == 2 and "is also --csv" in err and "is also an input" in err
    assert not Path(same).exists() and events.stat().st_size > 0


def test_a_graph_of_layers_named_with_characters_xml_forbids_is_valid_svg(tmp_path):
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(2, name="a\x01b\x0cc<&>")(keras.layers.Dense(3, name="plain")(inputs))
    model = keras.Model(inputs, outputs, name="m\x02")
    picture = gs.graph(model, np.ones((1, 4), "float32"))
    path = picture.save(tmp_path / "g.svg")
    texts = " ".join(t.text or "" for t in ET.parse(path).iter())  # parses as XML
    assert "a\\x01b\\x0cc<&>" in texts


def test_a_voc_split_names_images_never_paths(tmp_path):
    root = tmp_path / "VOC2012"
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (root / sub).mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "JPEGImages" / "a.jpg")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "outside.png")  # an image, beside the dataset
    (root / "ImageSets/Segmentation/val.txt").write_text("a\n../../outside.png\n")
    data = ImageFolder(root, (None, 8, 8, 3), with_masks=False)
    keys = data.keys()
    assert data.load(keys[0]).key == "a.jpg"
    with pytest.raises(DataProblem, match="not an image name"):
        data.load(keys[1])
