"""Try the CLI on bad inputs, as a new user would make them, and say how each ended.

    .venv/bin/python scripts/bad_input_sweep.py [--jobs 2]

Every case runs ``gradscope`` in a fresh process on the bundled demo model (or a tiny model it saves) and ends in
one of: ``clear error`` (exit 2, one line naming the problem, no traceback), ``correct`` (exit 0 and, where the
case says so, the expected text or warning), or ``other`` (anything else: a traceback, exit 1/3, a hang, a
silent success). The script exits 1 if any case ends as ``other``. Cases that are cheap to run are also tests
(``tests/test_strict_files.py``, ``tests/test_user_errors.py``, ``tests/test_hostile_inputs.py``); this sweep is
the wider net the closing notes count.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120


@dataclass
class Case:
    group: str
    name: str
    args: list[str]
    expect: str = "error"  # "error": exit 2 with one line; "ok": exit 0; "strict": exit 1 (--strict's failure)
    must_say: str = ""  # text the output must contain (case-insensitive)
    check: Callable[[], str] | None = None  # after the run: "" when all is well, else what went wrong


def write(path: Path, text: str | bytes) -> str:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def plan_file(d: Path, name: str, data: object, bom: bool = False) -> str:
    text = json.dumps(data)
    return write(d / f"{name}.json", ("\ufeff" + text).encode() if bom else text)


def cases(d: Path) -> list[Case]:
    from gradscope.io.demo import demo_image_paths

    img = str(demo_image_paths()[0])
    out = str(d / "out.png")
    demo = str(ROOT / "resources" / "demo" / "shapes_cnn.keras")
    ex = ["explain", "--out", out, demo]

    def plan(name: str, data: object, expect: str = "error", must: str = "", bom: bool = False) -> Case:
        return Case("plan file", name, [*ex, img, "--plan", plan_file(d, name, data, bom)], expect, must)

    entry = {"select": "conv1", "rule": "zero"}
    out_cases = [
        plan("typo in a key", {"entries": [{"selector": "type:ReLU", "rule": "zero"}]}, must="did you mean 'select'"),
        plan("missing select", {"entries": [{"rule": "zero"}]}, must="select"),
        plan("name is a number", {"name": 5, "entries": [entry]}, must="name"),
        plan("unknown top-level key", {"entrys": [entry]}, must="did you mean"),
        plan("UTF-8 with BOM", {"entries": [entry]}, expect="ok", bom=True),
        plan("bare list", [entry], expect="ok"),
        plan("schema from the future", {"schema": 99, "entries": [entry]}, must="schema 99"),
        plan("schema 0", {"schema": 0, "entries": [entry]}, must="schema"),
        plan("unknown rule", {"entries": [{"select": "conv1", "rule": "zeroo"}]}, must="zero"),
        plan(
            "param of the wrong type",
            {"entries": [{"select": "conv1", "rule": "scale", "params": {"factor": "2"}}]},
            must="factor",
        ),
        plan(
            "unknown param", {"entries": [{"select": "conv1", "rule": "scale", "params": {"factr": 2}}]}, must="factor"
        ),
        plan("params not an object", {"entries": [{"select": "conv1", "rule": "zero", "params": [1]}]}, must="params"),
        plan("entries not a list", {"entries": {"select": "conv1"}}, must="entries"),
        plan("unknown node", {"entries": [{"select": "conv9", "rule": "zero"}]}, must="conv9"),
        plan("old id conv1:act", {"entries": [{"select": "conv1:act", "rule": "zero"}]}, must="now 'conv1'"),
        plan("old id, schema 1", {"schema": 1, "entries": [{"select": "conv1:act", "rule": "zero"}]}, expect="ok"),
        plan("bad regex", {"entries": [{"select": "name:conv[", "rule": "zero"}]}, must="regular expression"),
        plan("selector kind without value", {"entries": [{"select": "type:", "rule": "zero"}]}, must="nothing"),
        plan(
            "rule that cannot run there",
            {"entries": [{"select": "pool1", "rule": "guided_backprop"}]},
            must="cannot run",
        ),
        plan(
            "NaN parameter",
            {"entries": [{"select": "conv1", "rule": "scale", "params": {"factor": float("nan")}}]},
            must="factor",
        ),
        plan(
            "clip low above high",
            {"entries": [{"select": "conv1", "rule": "clip", "params": {"low": 1, "high": 0}}]},
            must="low",
        ),
        Case("plan file", "not JSON", [*ex, img, "--plan", write(d / "broken.json", "{entries: [")], must_say="JSON"),
        Case("plan file", "empty file", [*ex, img, "--plan", write(d / "empty.json", "")], must_say="JSON"),
        Case(
            "plan file",
            "Latin-1 bytes",
            [*ex, img, "--plan", write(d / "latin.json", b'{"name": "\xe9t\xe9"}')],
            must_say="UTF-8",
        ),
        Case("plan file", "missing file", [*ex, img, "--plan", str(d / "nope.json")], must_say="nope.json"),
        Case("plan file", "a folder", [*ex, img, "--plan", str(d)], must_say="not a regular file"),
    ]
    # sizes and images
    big = d / "big.png"
    Image.new("RGB", (8000, 7000)).save(big)  # 56 MP, over the 50 MP limit
    text = write(d / "text.png", "this is not an image")
    trunc = d / "trunc.png"
    Image.new("RGB", (64, 64), "red").save(trunc)
    trunc.write_bytes(trunc.read_bytes()[:60])
    gray16 = d / "gray16.png"
    Image.fromarray(np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) * 16).save(gray16)
    cmyk = d / "cmyk.jpg"
    Image.new("CMYK", (40, 50), (0, 128, 255, 0)).save(cmyk)
    pal = d / "palette.png"
    Image.new("P", (30, 30)).save(pal, transparency=0)
    tiny = d / "one.png"
    Image.new("RGB", (1, 1)).save(tiny)
    gif = d / "anim.gif"
    frames = [Image.new("RGB", (32, 32), c) for c in ("red", "blue")]
    frames[0].save(gif, save_all=True, append_images=frames[1:])
    emptydir = d / "no_images"
    emptydir.mkdir()
    out_cases += [
        Case("size", "--size 0", [*ex, img, "--size", "0"], must_say="long side"),
        Case("size", "--size -5", [*ex, img, "--size", "-5"], must_say="long side"),
        Case("size", "--size 100000", [*ex, img, "--size", "100000"], must_say="8192"),
        Case("size", "--size abc", [*ex, img, "--size", "abc"], must_say="size"),
        Case("image", "56 MP image", [*ex, str(big)], must_say="MP"),
        Case("image", "text named .png", [*ex, text], must_say="text.png"),
        Case("image", "truncated PNG", [*ex, str(trunc)], must_say="trunc.png"),
        Case("image", "16-bit grayscale PNG", [*ex, str(gray16)], expect="ok"),
        Case("image", "CMYK JPEG", [*ex, str(cmyk)], expect="ok"),
        Case("image", "palette PNG with transparency", [*ex, str(pal)], expect="ok"),
        Case("image", "1x1 image", [*ex, str(tiny)], expect="ok"),
        Case("image", "animated GIF", [*ex, str(gif)], expect="ok"),
        Case("image", "missing image", [*ex, str(d / "missing.png")], must_say="missing.png"),
        Case(
            "image",
            "folder without images",
            ["explain", demo, str(emptydir), "--out", str(d / "o")],
            must_say="No images",
        ),
        Case("target", "class out of range", [*ex, img, "--target", "99"], must_say="99"),
        Case("target", "negative class", [*ex, img, "--target", "-1"], must_say="-1"),
        Case("target", "neuron of a missing node", [*ex, img, "--target", "neuron:conv9:0,0,0"], must_say="conv9"),
        Case("target", "neuron index out of range", [*ex, img, "--target", "neuron:conv1:99,0,0"], must_say="99"),
        Case("target", "channel out of range", [*ex, img, "--target", "channel:conv1:999"], must_say="999"),
        Case("target", "garbage", [*ex, img, "--target", "banana"], must_say="banana"),
        Case("layer", "missing layer", [*ex, img, "--method", "grad_cam", "--layer", "conv9"], must_say="conv9"),
        Case("layer", "a layer without a spatial map", [*ex, img, "--layer", "logits"], must_say="spatial"),
        Case("layer", "Grad-CAM at a fused layer", [*ex, img, "--method", "grad_cam", "--layer", "conv4"], "ok"),
        Case("method", "unknown method", [*ex, img, "--method", "gradcam"], must_say="grad_cam"),
        Case("output", "--out not a .png", ["explain", demo, img, "--out", str(d / "x.jpg")], must_say=".png"),
        Case(
            "output",
            "--out replaces the plan",
            ["explain", demo, img, "--plan", plan_file(d, "p", [entry]), "--out", str(d / "p.json")],
            must_say="png",
        ),
    ]
    # arrays for flow
    good = np.random.default_rng(0).uniform(size=(2, 64, 64, 3)).astype("float32")
    arrays = {
        "nan": np.full_like(good, np.nan),
        "inf": np.where(good > 0.5, np.inf, good).astype("float32"),
        "wrong shape": good[:, :32],
        "one sample, no batch axis": good[0],
        "wrong rank": good[0, 0],
        "complex": good.astype(np.complex64),
        "strings": np.array([["a"]]),
        "object (pickle)": np.array([{"a": 1}], dtype=object),
    }
    for name, a in arrays.items():
        path = d / f"{name.replace(' ', '_')}.npy"
        np.save(path, a, allow_pickle=True)
        expect, must = {"nan": ("ok", "NaN"), "inf": ("ok", "Inf"), "one sample, no batch axis": ("ok", "")}.get(
            name, ("error", "")
        )
        out_cases.append(Case("array input", name, ["flow", demo, "--input", str(path), "--label", "0"], expect, must))
    np.save(d / "good.npy", good)
    out_cases += [
        Case(
            "array input",
            "NaN under --strict",
            ["flow", demo, "--input", str(d / "nan.npy"), "--label", "0", "--strict"],
            "strict",
            "NaN",
        ),
        Case(
            "array input",
            "label out of range",
            ["flow", demo, "--input", str(d / "good.npy"), "--label", "7"],
            must_say="7",
        ),
        Case(
            "array input",
            "label not a number",
            ["flow", demo, "--input", str(d / "good.npy"), "--label", "cat"],
            must_say="cat",
        ),
        Case(
            "array input",
            "huge .npy header",
            ["flow", demo, "--input", write(d / "huge.npy", _huge_npy_header()), "--label", "0"],
            must_say="GiB",
        ),
        Case(
            "array input",
            "npz with no arrays",
            ["flow", demo, "--input", _empty_npz(d), "--label", "0"],
            must_say="npz",
        ),
    ]
    # the window, headless (--screenshot): a bad file must say so and still end, never wait for a click
    shot = ["gui", "--screenshot", str(d / "shot.png"), "--size", "1024x640"]
    model = demo
    out_cases += [
        Case(
            "window",
            "session with an unknown key",
            [*shot[:1], write(d / "a.gradscope.json", json.dumps({"model": model, "modl": 1})), *shot[1:]],
            must_say="did you mean",
        ),
        Case(
            "window",
            "session naming a missing model",
            [*shot[:1], write(d / "b.gradscope.json", json.dumps({"model": str(d / "gone.keras")})), *shot[1:]],
            must_say="gone.keras",
        ),
        Case(
            "window",
            "session selecting a missing node",
            [*shot[:1], write(d / "c.gradscope.json", json.dumps({"model": model, "selected": "conv9"})), *shot[1:]],
            "ok",  # opens without the selection; the status bar names it (tests/app/test_session.py)
        ),
        Case(
            "window",
            "an array as the input",
            [*shot[:1], model, str(d / "good.npy"), *shot[1:]],
            "ok",  # arrays are inputs too (issue 23): the window explains it
        ),
        Case(
            "window",
            "an array of the wrong shape",
            [*shot[:1], model, write(d / "wrong.npy", _npy(np.zeros((2, 3), np.float32))), *shot[1:]],
            must_say="takes shape",
        ),
        Case("window", "a text file as the image", [*shot[:1], model, text, *shot[1:]], must_say="text.png"),
        Case(
            "window",
            "session nested 100,000 deep",
            [*shot[:1], write(d / "deep.gradscope.json", '{"model": ' * 100_000 + "1" + "}" * 100_000), *shot[1:]],
            must_say="levels deep",
        ),
    ]
    out_cases += round_four(d, demo, img)
    return out_cases


def round_four(d: Path, demo: str, img: str) -> list[Case]:
    """Issue 35's classes: names that became paths, internal errors, lossy writes, silent surprises."""
    images = d / "r4_images"
    images.mkdir()
    for i in range(3):
        (images / f"im{i}.png").write_bytes(Path(img).read_bytes())
    victim = d / "victimdir"
    victim.mkdir()
    (victim / "settings.json").write_text("precious")

    def untouched() -> str:
        if (victim / "settings.json").read_text() != "precious" or len(list(victim.iterdir())) != 1:
            return "wrote outside --out"
        return ""

    def named(name: str, tag: str) -> Case:
        out = d / f"r4_out_{tag}"

        def check() -> str:
            files = list(out.iterdir()) if out.is_dir() else []
            if untouched() or len([f for f in files if f.suffix == ".png"]) != 3 or len(files) != 6:
                return untouched() or f"{len(files)} files in --out, expected 3 overlays + 3 sidecars"
            return ""

        plan = plan_file(d, f"named_{tag}", {"name": name, "entries": [{"select": "conv1", "rule": "zero"}]})
        return Case(
            "output names",
            f"plan name {tag}",
            ["explain", demo, str(images), "--plan", plan, "--out", str(out)],
            "ok",
            check=check,
        )

    deep = write(d / "deep.json", "[" * 100_000 + "]" * 100_000)
    vocab_noise = write(d / "noise_vocab.txt", bytes(range(256)) * 8)
    repeated = write(d / "repeated_vocab.txt", "[PAD]\nthe\ncat\nthe\n")
    class_map = write(d / "twice_map.json", '{"1": 0,\n"1": 2}')
    masks = d / "r4_data"
    (masks / "masks").mkdir(parents=True)
    Image.open(img).save(masks / "a.png")
    Image.fromarray(np.ones((64, 64), np.uint8)).save(masks / "masks" / "a.png")
    a_file = write(d / "results.txt", "mine")
    twice_rules = write(
        d / "twice_rules.py",
        "from gradscope.rules.base import Rule, register_rule\n@register_rule('r4')\nclass A(Rule):\n    pass\n"
        "@register_rule('r4')\nclass B(Rule):\n    pass\n",
    )
    text_model, ids_npy, log = _text_model_and_log(d)
    ev = ["evaluate", demo, str(masks)]
    return [
        named("../../../victimdir/settings", "with .."),
        named(str(victim / "settings"), "absolute"),
        named("a\x00b", "with NUL"),
        named("x" * 200, "of 200 characters"),
        named("sub/dir\\name", "with separators"),
        Case(
            "output names",
            "plan name of 5 MB",
            [
                "explain",
                demo,
                img,
                "--plan",
                plan_file(d, "huge_name", {"name": "n" * 5_000_000, "entries": []}),
                "--out",
                str(d / "h.png"),
            ],
            must_say="200",
        ),
        Case(
            "deep JSON",
            "plan nested 100,000 deep",
            ["explain", demo, img, "--plan", deep, "--out", str(d / "o.png")],
            must_say="levels deep",
        ),
        Case(
            "deep JSON",
            "class map nested 100,000 deep",
            [*ev, "--class-map", deep, "--out", str(d / "e1")],
            must_say="levels deep",
        ),
        Case(
            "numbers",
            "evaluate --batch 100000000",
            [*ev, "--batch", "100000000", "--out", str(d / "e2")],
            must_say="4096",
        ),
        Case(
            "outputs",
            "evaluate --out naming a file",
            [*ev, "--out", a_file],
            must_say="is a file",
            check=lambda: "" if Path(a_file).read_text() == "mine" else "replaced the file",
        ),
        Case(
            "outputs",
            "flow --png naming a folder",
            ["flow", demo, "--label", "0", "--png", str(d)],
            must_say="is a folder",
        ),
        Case(
            "outputs",
            "flow --csv on a read-only file system",
            ["flow", demo, "--label", "0", "--csv", "/proc/flow.csv"],
            must_say="cannot write",
        ),
        Case(
            "text input",
            "vocabulary of random bytes",
            ["explain", text_model, "--text", "a b", "--vocab", vocab_noise, "--out", str(d / "t.png")],
            must_say="UTF-8",
        ),
        Case(
            "text input",
            "a word twice in the vocabulary",
            ["explain", text_model, "--text", "the cat", "--vocab", repeated, "--out", str(d / "t.png")],
            must_say="line 2",
        ),
        Case(
            "text input",
            "token id past int64",
            ["explain", text_model, "--tokens", "1 " + "9" * 30, "--out", str(d / "t.png")],
            must_say="far beyond",
        ),
        Case(
            "text input",
            "token ids as .npy",
            ["explain", text_model, ids_npy, "--out", str(d / "npy.png")],
            "ok",
            check=lambda: _per_token(d / "npy.png"),
        ),
        Case(
            "class map",
            "a mask value given twice",
            [*ev, "--class-map", class_map, "--out", str(d / "e3")],
            must_say="given twice",
        ),
        Case(
            "rule file",
            "one rule name on two classes",
            ["explain", demo, img, "--rules", twice_rules, "--out", str(d / "r.png")],
            must_say="two classes",
        ),
        Case(
            "training log",
            "train-report --step 99999",
            ["train-report", log, "--step", "99999"],
            must_say="not recorded",
        ),
        Case("training log", "train-report --step -1", ["train-report", log, "--step", "-1"], must_say="not recorded"),
        Case(
            "training log",
            "a record changed without its checksum",
            ["train-report", _damaged(d, log)],
            "ok",
            must_say="checksum",
        ),
        Case("cli", "--debug after the command", ["explain", demo, img, "--out", str(d / "dbg.png"), "--debug"], "ok"),
    ]


def _per_token(png: Path) -> str:
    side = json.loads(png.with_suffix(".json").read_text())
    scores = [p["score"] for p in side.get("positions", [])]
    return "" if scores and any(s != 0 for s in scores) else "no per-token scores"


def _text_model_and_log(d: Path) -> tuple[str, str, str]:
    """A saved text model, its token ids as .npy, and a GradientMonitor log (made in a child process: TensorFlow
    stays out of the sweep's own process)."""
    script = f"""
import numpy as np
from gradscope.backend import keras
from gradscope import GradientMonitor
i = keras.Input((6,), dtype="int32", name="tokens")
h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(20, 4)(i))
m = keras.Model(i, keras.layers.Dense(3)(h))
m.save({str(d / "text.keras")!r})
np.save({str(d / "ids.npy")!r}, np.array([2, 3, 4, 5, 6, 7]))
x = np.random.rand(16, 4).astype("float32")
mlp = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"), keras.layers.Dense(2)])
mlp.compile("sgd", "mse")
mlp.fit(x, x[:, :2], batch_size=4, epochs=2, verbose=0, callbacks=[GradientMonitor({str(d / "log")!r}, every=2)])
"""
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, cwd=ROOT)
    return str(d / "text.keras"), str(d / "ids.npy"), str(d / "log")


def _damaged(d: Path, log: str) -> str:
    """A copy of the log with one record's body changed and its checksum left as it was."""
    import shutil

    copy = d / "log_damaged"
    shutil.copytree(log, copy)
    (path,) = copy.glob("events.out.tfevents.*")
    data = bytearray(path.read_bytes())
    at = data.find(b"gradscope/loss")
    data[at + 40] ^= 0xFF
    path.write_bytes(bytes(data))
    return str(copy)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _huge_npy_header() -> bytes:
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 224, 224, 3), }"
    header += " " * (118 - len(header)) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()


def _empty_npz(d: Path) -> str:
    path = d / "empty.npz"
    np.savez(path)
    return str(path)


def run(case: Case, env: dict[str, str]) -> tuple[Case, str, str]:
    cmd = [sys.executable, "-m", "gradscope", *case.args]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return case, "other", f"no answer in {TIMEOUT_S} s"
    text = (p.stdout + p.stderr).strip()
    said = case.must_say.lower() in text.lower()
    last = text.splitlines()[-1] if text else ""
    if "Traceback" in text:
        return case, "other", f"exit {p.returncode}, traceback: {last}"
    problem = case.check() if case.check is not None else ""
    if problem:
        return case, "other", f"exit {p.returncode}: {problem}"
    if len(text) > 20_000:
        return case, "other", f"exit {p.returncode}: {len(text)} characters of output"
    if case.expect in ("ok", "strict"):
        outcome = "correct" if p.returncode == {"ok": 0, "strict": 1}[case.expect] and said else "other"
        return case, outcome, f"exit {p.returncode}: {last}"
    errors = [line for line in text.splitlines() if line.startswith("error")]
    clear = p.returncode == 2 and said and len(errors) <= 1
    return case, "clear error" if clear else "other", f"exit {p.returncode}: {last}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "QT_QPA_PLATFORM": "offscreen"}
    with tempfile.TemporaryDirectory() as tmp:
        todo = cases(Path(tmp))
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda c: run(c, env), todo))
    counts: dict[str, int] = {}
    for case, outcome, detail in results:
        counts[outcome] = counts.get(outcome, 0) + 1
        print(f"{outcome:12} {case.group:12} {case.name:34} {detail[:150]}")
    print(f"\n{len(results)} inputs: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return 1 if counts.get("other") else 0


if __name__ == "__main__":
    sys.exit(main())
