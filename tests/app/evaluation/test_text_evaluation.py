"""Evaluating token maps over a text dataset (issue 63): every curve point against a forward computed by hand (NumPy
on a linear text classifier, the Keras model with its embedding layer's output zeroed on Hugging Face folders in
float32 and bfloat16), comprehensiveness and sufficiency against ferret's definitions on a worked example, ABPC's
guarantee on a linear model, the three file kinds, bad samples, resume, the report's files and the CLI."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

import gradscope as gs
from gradscope.engine.evaluation import token_metrics as tm

keras = pytest.importorskip("keras")

HF = Path(__file__).resolve().parents[2] / "data" / "hf"
WORDS = ["[PAD]", "[UNK]", "[MASK]", "the", "movie", "was", "great", "bad", "plot", "acting", "!"] + [
    f"w{i}" for i in range(9)
]


@pytest.fixture(scope="module")
def linear_text(tmp_path_factory):
    """Embedding -> mean over the positions -> Dense: a token's zeroed embedding moves the logit by exactly its
    gradient x input share (divided by the length)."""
    keras.utils.set_random_seed(3)
    i = keras.Input((None,), dtype="int32", name="ids")
    e = keras.layers.Embedding(len(WORDS), 8, name="embed")(i)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(e)
    o = keras.layers.Dense(3, name="out")(h)
    folder = tmp_path_factory.mktemp("text")
    keras.Model(i, o).save(folder / "clf.keras")
    (folder / "clf.vocab.txt").write_text("\n".join(WORDS))
    rng = np.random.default_rng(0)
    with open(folder / "data.jsonl", "w") as fh:
        fh.write(json.dumps({"text": "the movie was great !", "rationale": [3], "id": "great"}) + "\n")
        fh.write(json.dumps({"text": "the plot was bad", "target": 2}) + "\n")
        for n in range(4):
            fh.write(json.dumps({"ids": rng.integers(3, len(WORDS), size=5 + 3 * n).tolist()}) + "\n")
        fh.write(json.dumps({"ids": [3, 99]}) + "\n")  # beyond the vocabulary: listed, the run goes on
        fh.write(json.dumps({"text": "the movie", "target": "zebra"}) + "\n")  # no such token
        fh.write(json.dumps({"ids": [3, 4], "target": 7}) + "\n")  # the classifier has 3 classes
    return folder


def _records(out: Path) -> list[dict]:
    return [r for p in sorted((out / "batches").glob("*.json")) for r in json.loads(p.read_text())["images"]]


def _linear_logit(model, ids: np.ndarray, removed: np.ndarray, cls: int, replacement: np.ndarray | None) -> float:
    """By hand: the embedding rows, the removed ones replaced, averaged, times the kernel, plus the bias."""
    table = model.get_layer("embed").embeddings.numpy().astype(np.float64)
    e = table[ids].copy()
    e[removed] = 0.0 if replacement is None else replacement
    kernel, bias = (w.numpy().astype(np.float64) for w in model.get_layer("out").weights)
    return float((e.mean(axis=0) @ kernel + bias)[cls])


@pytest.mark.parametrize("baseline", ["zero", "pad", "mask"])
def test_every_curve_point_is_the_model_with_those_embeddings_replaced(linear_text, tmp_path, baseline):
    model = keras.models.load_model(linear_text / "clf.keras")
    out = tmp_path / "run"
    report = gs.evaluate(
        linear_text / "clf.keras",
        linear_text / "data.jsonl",
        methods=["gradient_x_input", "gradient", "random"],
        out=out,
        baseline=baseline,
        batch=3,
    )
    records = _records(out)
    assert report.images == len(records) == 6 and report.unit == "texts"
    bad = {b["key"]: b["reason"] for b in report.bad}
    assert sorted(bad) == ["line 7", "line 8", "line 9"]
    assert "outside the embedding's vocabulary" in bad["line 7"] and "'zebra' is not a token" in bad["line 8"]
    assert "the target 7 does not exist: the output has 3 entries" in bad["line 9"]
    table = model.get_layer("embed").embeddings.numpy().astype(np.float64)
    replacement = {"zero": None, "pad": table[0], "mask": table[2]}[baseline]
    for rec in records:
        ids = np.asarray([WORDS.index(t) for t in rec["tokens"]], int)  # the vocabulary shows every id
        n = rec["length"]
        assert len(ids) == n and rec["class"] == (2 if rec["key"] == "line 2" else rec["class"])
        for method in ("gradient_x_input", "gradient", "random"):
            got = rec["scores"][method]
            order = tm.token_order(np.asarray(got["map"]))
            for curve, ranked in (("morf", order), ("lerf", order[::-1])):
                want = [_linear_logit(model, ids, ranked[:k], rec["class"], replacement) for k in range(n + 1)]
                np.testing.assert_allclose(got[curve], want, rtol=1e-5, atol=1e-6 * max(map(abs, want)))
            assert got["abpc"] == pytest.approx(tm.area(got["lerf"]) - tm.area(got["morf"]))
        if baseline == "zero":  # a linear model: gradient x input's order is the best there is
            best = rec["scores"]["gradient_x_input"]["abpc"]
            assert best >= rec["scores"]["random"]["abpc"] - 1e-9 and best >= rec["scores"]["gradient"]["abpc"] - 1e-9
    assert report.value("gradient_x_input", "abpc") == pytest.approx(
        np.mean([r["scores"]["gradient_x_input"]["abpc"] for r in records])
    )


def _ferret_aopc(scores: np.ndarray, p_full: float, p_of, *, keep: bool) -> float:
    """ferret 0.5's AOPC (``based_on="perc"``, ``remove_tokens=False``), written from its source: for each
    fraction, v = int(q n) (skipped when 0), the top v by ``argsort()[-v:][::-1]``, a rationale equal to the one
    before skipped; comprehensiveness removes it, sufficiency keeps only it; the mean of p(full) - p(perturbed)."""
    n = len(scores)
    last, drops = None, []
    for q in (0.01, 0.05, 0.10, 0.20, 0.50):
        v = int(q * n)
        if not 0 < v <= n:
            continue
        top = np.array(scores).argsort()[-v:][::-1]
        if last is not None and set(top) == last:
            continue
        last = set(top)
        removed = set(range(n)) - last if keep else last
        drops.append(p_full - p_of(frozenset(removed)))
    return float(np.mean(drops)) if drops else float("nan")


@pytest.mark.parametrize("n", [1, 7, 20, 33])
def test_comprehensiveness_and_sufficiency_are_ferrets_on_a_worked_example(n):
    rng = np.random.default_rng(n)
    scores = rng.permutation(n).astype(float) + rng.uniform(0, 0.5, n)  # distinct: no tie to order
    weights = rng.normal(size=n)

    def p_of(removed: frozenset) -> float:  # any model: a probability of what is left
        kept = [w for i, w in enumerate(weights) if i not in removed]
        return float(1 / (1 + np.exp(-sum(kept))))

    order = tm.token_order(scores)
    morf = [p_of(frozenset(order[:k].tolist())) for k in range(n + 1)]
    lerf = [p_of(frozenset(order[::-1][:k].tolist())) for k in range(n + 1)]
    want_c = _ferret_aopc(scores, morf[0], p_of, keep=False)
    want_s = _ferret_aopc(scores, morf[0], p_of, keep=True)
    if n == 1:  # no fraction removes a token
        assert np.isnan(tm.comprehensiveness(morf)) and np.isnan(want_c)
        return
    assert tm.comprehensiveness(morf) == pytest.approx(want_c, abs=1e-12)
    assert tm.sufficiency(lerf) == pytest.approx(want_s, abs=1e-12)
    assert tm.aopc_ks(20) == [1, 2, 4, 10] and tm.aopc_ks(7) == [1, 3]


def test_csv_and_a_folder_of_texts_are_datasets_and_a_second_run_resumes(linear_text, tmp_path):
    from gradscope.io.sequences import Vocabulary
    from gradscope.io.text_datasets import TextDataset

    vocab = Vocabulary.load(linear_text / "clf.vocab.txt")
    with open(tmp_path / "data.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "text", "target"])
        w.writerows([["a", "the movie was bad", "1"], ["b", "great acting !", ""]])
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "one.txt").write_text("the plot was great")
    (folder / "two.txt").write_text("bad acting")
    csv_set, txt_set = TextDataset(tmp_path / "data.csv", vocab), TextDataset(folder, vocab)
    assert csv_set.keys() == ["a", "b"] and txt_set.keys() == ["one.txt", "two.txt"]
    assert csv_set.load("a").target == 1 and csv_set.load("b").target is None
    assert txt_set.load("two.txt").ids.tolist() == vocab.encode("bad acting").tolist()
    out = tmp_path / "run"
    first = gs.evaluate(linear_text / "clf.keras", tmp_path / "data.csv", methods="gradient_x_input", out=out)
    again = gs.evaluate(linear_text / "clf.keras", tmp_path / "data.csv", methods="gradient_x_input", out=out)
    assert first.to_dict()["results"] == again.to_dict()["results"] and first.images == 2
    for name in ("results.csv", "per_image.csv", "curves.csv", "curves.png", "results.json"):
        assert (out / name).is_file(), name
    rows = list(csv.DictReader((out / "curves.csv").read_text().splitlines()))
    texts = json.loads((out / "results.json").read_text())["texts"]  # as docs/evaluation.md says
    assert [t["key"] for t in texts] == ["a", "b"] and texts[0]["tokens"] == ["the", "movie", "was", "bad"]
    assert {r["curve"] for r in rows} == {"morf", "lerf"} and {r["key"] for r in rows} == {"a", "b"}
    html = first._repr_html_()
    assert "MoRF / LeRF" in html and "token map" in html and "texts scored" in html


def test_token_pointing_scores_the_top_token_against_the_rationale(linear_text, tmp_path):
    report = gs.evaluate(
        linear_text / "clf.keras",
        linear_text / "data.jsonl",
        methods=["gradient_x_input"],
        metrics=["token_pointing", "abpc"],
        out=tmp_path / "run",
    )
    (rec,) = [r for r in _records(tmp_path / "run") if r["key"] == "great"]
    top = int(np.argmax(rec["scores"]["gradient_x_input"]["map"]))
    assert rec["scores"]["gradient_x_input"]["token_pointing"] == float(top == 3)
    row = next(r for r in report.table if r["metric"] == "token_pointing")
    assert row["n"] == 1 and row["value"] == float(top == 3)  # only the text with a rationale counts


def _by_hand_in_keras(engine, arrays, removed: np.ndarray) -> np.ndarray:
    """The Keras model itself with its token embedding layer's output zeroed at ``removed`` (a reverse call, the
    tied output projection, left alone): the logits."""
    node = engine.graph.embedding_of(engine.graph.token_input).id
    layer = next(la for la in engine.model._flatten_layers() if la.name == node.split("/")[-1])
    keep = np.ones(arrays[0].shape[1], np.float32)
    keep[removed] = 0.0
    original = layer.call

    def call(inputs, *args, **kwargs):
        y = original(inputs, *args, **kwargs)
        if kwargs.get("reverse") or (args and args[0] is True):
            return y
        return y * keras.ops.cast(keep[None, :, None], y.dtype)

    layer.call = call
    try:
        out = engine.model(dict(zip(engine.graph.input_ids, arrays)))
    finally:
        del layer.call
    return np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(out, "float32")))


@pytest.mark.parametrize("family,dtype", [("llama", "float32"), ("gpt2", "float32"), ("llama", "bfloat16")])
def test_a_language_models_curves_are_the_keras_model_with_embeddings_zeroed(family, dtype, tmp_path):
    from gradscope.engine.backward.generation import token_arrays

    engine = gs.open_engine(HF / family, dtype=dtype)
    (tmp_path / "data.jsonl").write_text(
        json.dumps({"text": "the cat sat on the mat"}) + "\n" + json.dumps({"text": "a dog ran", "target": 5}) + "\n"
    )
    out = tmp_path / "run"
    report = gs.evaluate(engine, tmp_path / "data.jsonl", methods=["attnlrp", "random"], out=out, vocab=HF / family)
    assert report.images == 2 and not report.bad
    records = _records(out)
    assert records[1]["class"] == 5
    tol = {"float32": 1e-4, "bfloat16": 2.0**-6}[dtype]
    from gradscope.io.sequences import Vocabulary

    vocab = Vocabulary.load(HF / family)
    for rec, text in zip(records, ["the cat sat on the mat", "a dog ran"]):
        ids = vocab.encode(text)
        n = len(ids)
        assert rec["length"] == n
        arrays = token_arrays(engine.graph, ids, n)
        got = rec["scores"]["attnlrp"]
        order = tm.token_order(np.asarray(got["map"]))
        for k in (0, 1, n // 2, n):
            logits = _by_hand_in_keras(engine, arrays, order[:k])
            want = logits[0, n - 1, rec["class"]]
            scale = max(abs(want), np.abs(logits[0, n - 1]).max())
            assert abs(got["morf"][k] - want) <= tol * scale, (k, got["morf"][k], want)
        assert np.isfinite(report.value("attnlrp", "abpc"))


def test_the_cli_evaluates_a_text_dataset(linear_text, tmp_path, capsys):
    from gradscope.cli import main

    code = main(
        [
            "evaluate",
            str(linear_text / "clf.keras"),
            str(linear_text / "data.jsonl"),
            "--method",
            "gradient_x_input,random",
            "--baseline",
            "pad",
            "--out",
            str(tmp_path / "run"),
            "--quiet",
        ]
    )
    printed = capsys.readouterr()
    assert code == 2  # two samples could not be used, named on stderr
    assert "abpc" in printed.out and "comprehensiveness" in printed.out and "6 of 9 texts scored" in printed.out
    assert "line 7" in printed.err
    settings = json.loads((tmp_path / "run" / "settings.json").read_text())["settings"]
    assert settings["baseline"] == "pad" and settings["metrics"] == ["abpc", "comprehensiveness", "sufficiency"]
    # gradscope report: the page shows the table, the mean curves and the first texts' token maps beside theirs
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "page.html"), "--quiet"]) == 0
    page = (tmp_path / "page.html").read_text()
    assert "6 of 9 texts scored" in page and "Mean MoRF / LeRF curves over the texts" in page
    assert page.count("<figcaption>gradient_x_input: token map</figcaption>") == 4
    assert page.count("<figcaption>random: token map</figcaption>") == 4


def test_mixed_metrics_and_a_model_without_tokens_are_refused_in_one_line(linear_text, tmp_path):
    from gradscope.app.evaluation.scoring import EvaluationError

    with pytest.raises(EvaluationError, match="not evaluated together"):
        gs.evaluate(linear_text / "clf.keras", linear_text / "data.jsonl", metrics=["abpc", "deletion"])
    with pytest.raises(EvaluationError, match="token ids cannot be made noisy"):
        gs.evaluate(linear_text / "clf.keras", linear_text / "data.jsonl", methods=["smoothgrad"])
    with pytest.raises(EvaluationError, match="'center' is an image baseline"):
        gs.evaluate(linear_text / "clf.keras", linear_text / "data.jsonl", methods=["center"])
    with pytest.raises(EvaluationError, match="needs a vocabulary with a mask token"):  # before any text is read
        gs.evaluate(HF / "gpt2", linear_text / "data.jsonl", baseline="mask", out=tmp_path / "no_mask")
    assert not (tmp_path / "no_mask" / "batches").exists()
    i = keras.Input((4,))
    dense = tmp_path / "dense.keras"
    keras.Model(i, keras.layers.Dense(2)(i)).save(dense)
    with pytest.raises(EvaluationError, match="reads token ids"):
        gs.evaluate(dense, linear_text / "data.jsonl")


@pytest.mark.slow  # ~30 s of Ray start-up: out of the default run, run by CI on its own (.ci/run)
def test_ray_gives_the_text_scores_of_the_local_run(tmp_path):
    """A checkpoint folder's language model on a local Ray instance: every actor reads the texts with the folder's
    tokenizer (loaded again in the worker) and writes the local run's records."""
    pytest.importorskip("ray.data")
    from gradscope.app.evaluation.on_ray import RayOptions

    texts = ["the cat sat on the mat", "a dog ran", "the mat sat", "on the cat"]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    how = dict(methods="attnlrp,gradient,random", metrics="abpc,comprehensiveness,sufficiency", batch=2)
    local = gs.evaluate(HF / "gpt2", tmp_path / "data.jsonl", out=tmp_path / "local", **how)
    remote = gs.evaluate(
        HF / "gpt2", tmp_path / "data.jsonl", out=tmp_path / "ray", ray=RayOptions(num_cpus=2, actors=2), **how
    )
    assert remote.images == local.images == 4
    a, b = _records(tmp_path / "local"), _records(tmp_path / "ray")
    assert [r["key"] for r in a] == [r["key"] for r in b] and [r["tokens"] for r in a] == [r["tokens"] for r in b]
    for ra, rb in zip(a, b):
        for method in ("attnlrp", "gradient", "random"):
            for field in ("map", "morf", "lerf"):
                np.testing.assert_allclose(
                    rb["scores"][method][field], ra["scores"][method][field], rtol=1e-5, atol=1e-6
                )
    for row_a, row_b in zip(local.table, remote.table):
        assert row_a["method"] == row_b["method"] and row_a["value"] == pytest.approx(
            row_b["value"], rel=1e-5, abs=1e-7
        )
