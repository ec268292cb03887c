"""``gradscope evaluate``: scores equal independent computations, runs resume, bad data is listed, Ray agrees."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gradscope.api import evaluate, open_engine
from gradscope.app.evaluation.run import EvalSettings, EvaluationError, run_evaluation
from gradscope.core.targets import Target
from gradscope.io.datasets import BACKGROUND, ArraySamples
from gradscope.io.demo import demo_model_path
from gradscope.io.synthetic import make_shapes_dataset
from gradscope.render import reduce_channels
from gradscope.render.normalize import gaussian_smooth, resize_map, smoothing_sigma

SIZE = 64
TOL = 15.0 * SIZE / 224.0


@pytest.fixture(scope="module")
def engine():
    return open_engine(demo_model_path())


@pytest.fixture(scope="module")
def shapes():
    images, labels, _, masks = make_shapes_dataset(24, 4321, size=SIZE)
    return images, labels, np.where(masks, labels[:, None, None], BACKGROUND)


def write_folder(folder: Path, images: np.ndarray, class_masks: np.ndarray) -> Path:
    (folder / "masks").mkdir(parents=True)
    for i, (x, m) in enumerate(zip(images, class_masks)):
        Image.fromarray((x * 255).round().astype(np.uint8)).save(folder / f"img{i:02d}.png")
        Image.fromarray(np.where(m >= 0, m + 1, 0).astype(np.uint8), mode="L").save(
            folder / "masks" / f"img{i:02d}.png"
        )
    return folder


def test_per_sample_classes_are_one_pass_per_class_in_one_trace(engine, shapes):
    x = shapes[0][:6]
    classes = np.array([0, 3, 1, 2, 3, 0])
    got = engine.backward(x, Target(), classes=classes, stats=False, mode="compiled")
    traces = engine.trace_count
    engine.backward(x, Target(), classes=np.array([1, 1, 1, 2, -1, 2]), stats=False, mode="compiled")
    assert engine.trace_count == traces  # another mix of classes (and a top-1): the same trace
    for c in range(4):
        rows = classes == c
        want = engine.backward(x[rows], Target(index=c), stats=False, mode="compiled").input_grad
        np.testing.assert_allclose(got.input_grad[rows], want, rtol=1e-5, atol=1e-7)
    with pytest.raises(Exception, match="out of range"):
        engine.backward(x, Target(), classes=np.array([9, 0, 0, 0, 0, 0]), stats=False)


def test_logits_are_the_output_before_softmax(engine, shapes):
    x = shapes[0][:5]
    logits = engine.logits(x)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(probs / probs.sum(-1, keepdims=True), engine.predict(x), rtol=1e-4, atol=1e-6)


def _reference_pointing(engine, images, labels, masks, preset, smooth):
    """The Pointing Game as the old script computed it: one backward per class, read at the input."""
    from gradscope.rules.methods import build_method

    method = build_method(preset, engine.graph)
    hits = []
    for x, c, m in zip(images, labels, masks):
        r = engine.backward(x[None], Target(index=int(c)), method.plan, stats=False, mode="compiled")
        saliency = resize_map(reduce_channels(r.input_grad[0], method.reduction), (SIZE, SIZE))
        if smooth:
            saliency = gaussian_smooth(saliency, smoothing_sigma(saliency.shape))
        row, col = np.unravel_index(int(np.argmax(saliency)), saliency.shape)
        rr, cc = np.nonzero(m == c)
        hits.append(bool(np.any((rr - row) ** 2 + (cc - col) ** 2 < TOL**2)))
    hits = np.array(hits)
    return float(np.mean([hits[labels == c].mean() for c in np.unique(labels)]))


def test_pointing_game_equals_the_per_class_reference(engine, shapes):
    images, labels, masks = shapes
    report = evaluate(
        engine, images, masks=masks, methods="gradient,guided_backprop,center,random", batch=8, tolerance=TOL
    )
    assert report.value("gradient", "pointing") == pytest.approx(
        _reference_pointing(engine, images, labels, masks, "gradient", smooth=True)
    )
    assert report.value("guided_backprop", "pointing") == pytest.approx(
        _reference_pointing(engine, images, labels, masks, "guided_backprop", smooth=True)
    )
    centre = [np.any((np.argwhere(m == c) - SIZE // 2) ** 2 @ [1, 1] < TOL**2) for m, c in zip(masks, labels)]
    centre = np.array(centre)
    assert report.value("center", "pointing") == pytest.approx(
        np.mean([centre[labels == c].mean() for c in np.unique(labels)])
    )
    assert 0 < report.value("random", "pointing") < report.value("gradient", "pointing")
    table = {(r["method"], r["metric"]): r for r in report.table}
    row = table["gradient", "pointing"]
    assert row["ci_low"] <= row["value"] <= row["ci_high"] and row["n"] == len(images)


def test_a_stopped_run_resumes_to_the_results_of_an_uninterrupted_one(engine, shapes, tmp_path):
    images, _, masks = shapes
    source = ArraySamples(images[:12], masks[:12])
    settings = dict(
        methods=["gradient", "random"],
        metrics=["pointing", "deletion", "mufidelity"],
        batch=4,
        tolerance=TOL,
        steps=5,
        fidelity_samples=12,
    )
    whole = run_evaluation(engine, source, EvalSettings(**settings), tmp_path / "whole")[1]
    calls = []
    state, part = run_evaluation(
        engine,
        source,
        EvalSettings(**settings),
        tmp_path / "part",
        should_stop=lambda: len(calls) > 1,  # the first call reports 0 done
        progress=lambda done, total, left: calls.append(done),
    )
    assert state.stopped and state.computed == 1 and not part.complete and part.images == 4
    state, resumed = run_evaluation(engine, source, EvalSettings(**settings), tmp_path / "part")
    assert (state.resumed, state.computed, state.stopped) == (1, 2, False) and resumed.complete
    assert resumed.table == whole.table and resumed.differences == whole.differences
    with pytest.raises(EvaluationError, match="other settings"):
        run_evaluation(engine, source, EvalSettings(**{**settings, "steps": 6}), tmp_path / "part")
    state, _ = run_evaluation(engine, source, EvalSettings(**{**settings, "steps": 6}), tmp_path / "part", restart=True)
    assert state.resumed == 0 and state.computed == 3


def test_ctrl_c_inside_a_c_function_stops_the_run_as_an_interrupt(engine, shapes, tmp_path):
    """A Ctrl-C landing in numpy's ``__array__`` reaches Python as a SystemError caused by KeyboardInterrupt (seen
    in CI: the CLI said "internal error"); it stops the run like any Ctrl-C, and a real SystemError does not."""
    images, _, masks = shapes
    source = ArraySamples(images[:8], masks[:8])
    settings = EvalSettings(methods=["gradient"], metrics=["pointing"], batch=4, tolerance=TOL, steps=5)

    def interrupted_in_c(done: int, total: int, left: float) -> None:
        if done:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as exc:
                raise SystemError("<built-in method __array__> returned a result with an exception set") from exc

    state, part = run_evaluation(engine, source, settings, tmp_path / "a", progress=interrupted_in_c)
    assert state.stopped and state.computed == 1 and part.images == 4 and not part.complete

    def broken(done: int, total: int, left: float) -> None:
        if done:
            raise SystemError("a real bug")

    with pytest.raises(SystemError, match="a real bug"):
        run_evaluation(engine, source, settings, tmp_path / "b", progress=broken)


def test_a_plan_scores_as_the_preset_whose_rules_it_holds(engine, shapes, tmp_path):
    from gradscope.rules.methods import build_method

    images, _, masks = shapes
    plan = dataclasses.replace(build_method("guided_backprop", engine.graph).plan, name="my_guided")
    report = evaluate(
        engine,
        images[:8],
        masks=masks[:8],
        methods=["guided_backprop"],
        plan=plan,
        metrics="deletion,insertion",
        steps=6,
        batch=4,
    )
    assert report.methods == ["guided_backprop", "my_guided"]
    for metric in ("deletion", "insertion"):
        assert report.value("my_guided", metric) == pytest.approx(report.value("guided_backprop", metric), abs=1e-9)


def test_cli_writes_the_results_and_lists_bad_data_with_exit_2(shapes, tmp_path, capsys):
    from gradscope.cli import main

    images, _, masks = shapes
    folder = write_folder(tmp_path / "data", images[:6], masks[:6])
    (folder / "broken.png").write_bytes(b"not an image")
    Image.fromarray(np.zeros((SIZE, SIZE, 3), np.uint8)).save(folder / "nomask.png")
    Image.fromarray(np.zeros((SIZE, SIZE, 3), np.uint8)).save(folder / "small.png")
    Image.fromarray(np.zeros((10, 10), np.uint8), mode="L").save(folder / "masks" / "small.png")
    Image.fromarray(np.full((SIZE, SIZE), 9, np.uint8), mode="L").save(folder / "masks" / "img05.png")  # class 8
    out = tmp_path / "out"
    code = main(
        [
            "-q",
            "evaluate",
            str(demo_model_path()),
            str(folder),
            "--method",
            "gradient,cmwp",
            "--metric",
            "pointing,deletion",
            "--steps",
            "4",
            "--tolerance",
            str(TOL),
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 2
    bad = {row["key"]: row["reason"] for row in json.loads((out / "results.json").read_text())["bad_data"]}
    assert set(bad) == {"broken.png", "nomask.png", "small.png", "img05.png"}
    assert "does not decode" in bad["broken.png"] and "missing" in bad["nomask.png"]
    assert "10x10" in bad["small.png"] and "4 classes" in bad["img05.png"]
    assert "broken.png" in captured.err and "gradient" in captured.out
    doc = json.loads((out / "results.json").read_text())  # strict JSON: no NaN
    assert (
        doc["settings"]["methods"] == ["gradient", "cmwp"]
        and (doc["images"], doc["total"]) == (5, 9)
        and doc["complete"]
    )
    assert Image.open(out / "curves.png").size[0] > 400
    header = (out / "results.csv").read_text().splitlines()[0]
    assert header == "method,metric,value,ci_low,ci_high,n"
    assert len((out / "per_image.csv").read_text().splitlines()) == 1 + 5 * 2


def test_class_map_maps_mask_values_to_model_classes(shapes, tmp_path):
    images, labels, masks = shapes
    folder = tmp_path / "data"
    (folder / "masks").mkdir(parents=True)
    for i in range(4):  # VOC-like values 10..13 for the four classes
        Image.fromarray((images[i] * 255).round().astype(np.uint8)).save(folder / f"{i}.png")
        Image.fromarray(np.where(masks[i] >= 0, masks[i] + 10, 0).astype(np.uint8), mode="L").save(
            folder / "masks" / f"{i}.png"
        )
    class_map = tmp_path / "map.json"
    class_map.write_text(json.dumps({"10": 0, "11": 1, "12": 2, "13": 3}))
    mapped = evaluate(demo_model_path(), folder, class_map=class_map, tolerance=TOL)
    assert not mapped.bad and mapped.images == 4
    class_map.write_text(json.dumps({"10": 0}))
    partly = evaluate(demo_model_path(), folder, class_map=class_map, tolerance=TOL)
    assert {b["key"] for b in partly.bad} == {f"{i}.png" for i in range(4) if labels[i] != 0}
    assert all("not in the class map" in b["reason"] for b in partly.bad)


@pytest.mark.slow  # ~30 s of Ray start-up: out of the default run, run by CI on its own (.ci/run)
def test_ray_gives_the_scores_of_the_local_run(shapes, tmp_path):
    pytest.importorskip("ray.data")
    from gradscope.app.evaluation.on_ray import RayOptions

    images, _, masks = shapes
    folder = write_folder(tmp_path / "data", images[:8], masks[:8])
    how = dict(
        methods="gradient,cmwp,random",
        metrics="pointing,deletion,mufidelity",
        batch=4,
        steps=4,
        fidelity_samples=10,
        tolerance=TOL,
    )
    local = evaluate(demo_model_path(), folder, out=tmp_path / "local", **how)
    remote = evaluate(demo_model_path(), folder, out=tmp_path / "ray", ray=RayOptions(num_cpus=2, actors=2), **how)
    assert remote.images == local.images == 8
    assert remote.table == local.table and remote.differences == local.differences
    for a, b in zip(
        sorted((tmp_path / "local" / "batches").iterdir()), sorted((tmp_path / "ray" / "batches").iterdir())
    ):
        da, db = json.loads(a.read_text()), json.loads(b.read_text())
        assert da["images"] == db["images"]


def test_ctrl_c_stops_after_a_batch_and_the_same_command_resumes(shapes, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    images, _, masks = shapes
    folder = write_folder(tmp_path / "data", images[:16], masks[:16])
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "gradscope",
        "evaluate",
        str(demo_model_path()),
        str(folder),
        "--out",
        str(out),
        "--batch",
        "1",
        "--metric",
        "pointing,deletion",
        "--steps",
        "200",  # a batch takes long enough for the Ctrl-C to land before the last one (16 of 30 steps: < 1 s)
        "--tolerance",
        str(TOL),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((out / "batches").glob("*.json")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "resume" in err
    doc = json.loads((out / "results.json").read_text())
    assert not doc["complete"] and 0 < doc["images"] < 16
    done = len(list((out / "batches").glob("*.json")))
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] and doc["images"] == 16 and len(list((out / "batches").glob("*.json"))) == 16 > done


@pytest.mark.parametrize("name", ["gradient", "cmwp", "grad_cam", "integrated_gradients"])
def test_evaluation_maps_are_the_maps_explain_shows(engine, shapes, name):
    """Batched, per-sample classes, a read-out node, Grad-CAM's weighting, a sampling method: each map equals
    ``gradscope.explain``'s saliency for that image and class."""
    import gradscope as gs
    from gradscope.engine.evaluation.maps import method_maps
    from gradscope.rules.methods import build_method

    pixels = (shapes[0][:3] * 255).round().astype(np.uint8)
    classes = shapes[1][:3].astype(np.int32)
    maps = method_maps(engine, build_method(name, engine.graph), pixels.astype(np.float32) / 255, classes, batch=2)
    for i in range(3):
        shown = gs.explain(engine, pixels[i], method=name, target=int(classes[i])).saliency
        np.testing.assert_allclose(maps[i], shown, rtol=1e-5, atol=1e-7)


def test_one_trace_per_method_for_a_whole_run(shapes, tmp_path):
    images, _, masks = shapes
    engine = open_engine(demo_model_path())
    before = engine.trace_count
    evaluate(
        engine,
        images[:20],
        masks=masks[:20],
        methods="gradient,cmwp,center",
        metrics="pointing,deletion",
        batch=8,
        steps=3,
        tolerance=TOL,
    )
    assert engine.trace_count - before == 2  # 3 batches (the last padded), pairs and top-1 maps: one trace each


def test_difficult_pairs_are_scored_on_their_own(engine):
    """Images with a large class 0 and a small class 1 (a distractor present): only the class-1 pairs are
    difficult, so pointing_difficult is the hit rate of class 1 alone."""
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(6, SIZE, SIZE, 3)).astype(np.float32)
    masks = np.full((6, SIZE, SIZE), BACKGROUND)
    masks[:, 32:, :] = 0  # half the image
    masks[:, 4:12, 4:12] = 1  # 1.6 % of it
    report = evaluate(engine, x, masks=masks, methods="gradient", tolerance=TOL)
    per_class = report.classes["pointing"]["gradient"]["per_class"]
    assert report.value("gradient", "pointing_difficult") == pytest.approx(per_class["1"])
    assert report.value("gradient", "pointing") == pytest.approx((per_class["0"] + per_class["1"]) / 2)
    assert report.classes["pointing_difficult"]["gradient"]["pairs"] == {"1": 6}


def test_a_model_that_is_no_image_classifier_is_refused_in_one_line(tmp_path):
    from gradscope.backend import keras

    inp = keras.Input((12,))
    table = keras.Model(inp, keras.layers.Dense(3)(inp))
    with pytest.raises(EvaluationError, match="image classifiers"):
        evaluate(table, np.zeros((4, 12), np.float32), metrics="deletion")
    img = keras.Input((8, 8, 3))
    dense = keras.Model(img, keras.layers.Conv2D(2, 3, padding="same")(img))  # a map out, no classes
    with pytest.raises(EvaluationError, match="classes"):
        evaluate(dense, np.zeros((4, 8, 8, 3), np.float32), metrics="deletion")


def test_images_of_other_sizes_are_scored_at_their_own_size(engine, tmp_path):
    """A folder of mixed sizes: each map is resized to its image (bilinear) and the hit is judged against the
    mask at the image's size; equal to scoring each image alone."""
    from gradscope.engine.evaluation import faithfulness as fm
    from gradscope.engine.evaluation.maps import method_maps
    from gradscope.io.images import load_image, prepare_input
    from gradscope.rules.methods import build_method

    folder = tmp_path / "mixed"
    (folder / "masks").mkdir(parents=True)
    rng = np.random.default_rng(5)
    sizes = [(64, 64), (96, 80), (50, 70), (96, 80)]
    for i, (h, w) in enumerate(sizes):
        Image.fromarray((rng.uniform(size=(h, w, 3)) * 255).astype(np.uint8)).save(folder / f"{i}.png")
        mask = np.zeros((h, w), np.uint8)
        mask[h // 4 : h // 2, w // 3 : w // 2] = 1 + i % 4
        Image.fromarray(mask, mode="L").save(folder / "masks" / f"{i}.png")
    report = evaluate(engine, folder, methods="gradient", batch=3, tolerance=6.0)
    method = build_method("gradient", engine.graph)
    x = np.concatenate([prepare_input(load_image(folder / f"{i}.png"), (None, SIZE, SIZE, 3)) for i in range(4)])
    maps = method_maps(engine, method, x, np.arange(4, dtype=np.int32) % 4, batch=3)  # the run's batches
    hits = []
    for i, (h, w) in enumerate(sizes):
        point = fm.pointing_point(maps[i], (h, w), smooth=True)
        mask = np.asarray(Image.open(folder / "masks" / f"{i}.png")) == 1 + i % 4
        hits.append(fm.pointing_hit(point, mask, 6.0))
    per_class = report.classes["pointing"]["gradient"]["per_class"]
    assert per_class == {str(c): float(hits[c]) for c in range(4)}


def test_unknown_methods_and_metrics_are_one_line_before_anything_is_written(shapes, tmp_path, capsys):
    from gradscope.cli import main

    images, _, masks = shapes
    folder = write_folder(tmp_path / "data", images[:2], masks[:2])
    for extra, said in (
        (["--method", "gradient,nope"], "Unknown method 'nope'"),
        (["--metric", "pointing,speed"], "Unknown metric(s) speed"),
        (["--method", "cmwp@no_such_node"], "no_such_node"),
    ):
        code = main(["-q", "evaluate", str(demo_model_path()), str(folder), "--out", str(tmp_path / "out"), *extra])
        err = capsys.readouterr().err
        assert code == 2 and said in err and "Traceback" not in err
        assert not (tmp_path / "out").exists()


def test_a_torchray_difficult_file_decides_the_pairs_it_lists(engine, tmp_path):
    """TorchRay's format (stem, a 0/1 flag per dataset class = mask value - 1): listed images take their flags,
    the others are judged from the masks."""
    folder = tmp_path / "two"
    (folder / "masks").mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(4):
        Image.fromarray((rng.uniform(size=(SIZE, SIZE, 3)) * 255).astype(np.uint8)).save(folder / f"{i:06d}.png")
        mask = np.zeros((SIZE, SIZE), np.uint8)
        mask[32:, :] = 1  # class 0, half the image
        mask[4:12, 4:12] = 2  # class 1, small: difficult by the masks' rule
        Image.fromarray(mask, mode="L").save(folder / "masks" / f"{i:06d}.png")
    flags = tmp_path / "difficult.txt"
    flags.write_text("000000\t1\t0\t0\t0\n000001\t0\t0\t0\t0\n")
    report = evaluate(engine, folder, difficult=flags, tolerance=TOL)
    assert report.classes["pointing_difficult"]["gradient"]["pairs"] == {"0": 1, "1": 2}
    flags.write_text("000000\t1\tx\n")
    with pytest.raises(Exception, match="line 1"):
        evaluate(engine, folder, difficult=flags, tolerance=TOL)
