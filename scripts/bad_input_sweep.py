"""Try the CLI on bad inputs, as a new user would make them, and say how each ended.

    .venv/bin/python scripts/bad_input_sweep.py [--jobs 2] [--only TEXT]

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from bad_input_case import Case, api, write
from bad_input_round_six import round_six
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120


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
    out_cases += round_five(d, demo, img)
    out_cases += round_six(d, demo, img)
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


def round_five(d: Path, demo: str, img: str) -> list[Case]:
    """Issue 49's causes: lost monitor records, false training reports, sequences past a model's positions or
    memory, typed numbers, a lone surrogate, an image header of 3.6 gigapixels, VOC split lists, --out naming a
    file, the monitor's own arguments, wrong API types, a headless window that never ended, sanity on an LM."""
    lm = _language_models_and_logs(d)
    gpt2, llama, small = lm["gpt2"], lm["llama"], lm["small"]
    bomb_dir = d / "r5_bomb"
    bomb_dir.mkdir()
    write(bomb_dir / "bomb.png", _png_header(60_000, 60_000))
    (bomb_dir / "good.png").write_bytes(Path(img).read_bytes())
    voc = _voc_with_bad_split(d)
    surrogate = write(d / "surrogate_vocab.json", '["[PAD]", "the", "\\ud800", "cat", "a", "b"]')
    mine = write(d / "mine.txt", "mine")
    np.save(d / "long.npy", np.ones(100_000, np.int64))
    np.save(d / "huge_ids.npy", np.array([3, 2**64 - 1], np.uint64))
    session = write(
        d / "token99.gradscope.json",
        json.dumps({"model": small, "tokens": "1 2 3", "target": {"kind": "token", "index": 99}}),
    )
    ids33, ids4 = " ".join(["5"] * 33), "1 2 3 4"
    out = str(d / "r5.png")

    def intact() -> str:
        return "" if Path(mine).read_text() == "mine" else "replaced the file"

    def good_written() -> str:
        written = sorted(p.name for p in (d / "r5_bomb_out").iterdir()) if (d / "r5_bomb_out").is_dir() else []
        return "" if written == ["good_gradient.json", "good_gradient.png"] else f"--out holds {written}"

    def voc_scored() -> str:
        bad = (d / "r5_voc_out" / "bad_data.csv").read_text() if (d / "r5_voc_out" / "bad_data.csv").is_file() else ""
        per = (d / "r5_voc_out" / "per_image.csv").read_text().splitlines()[1:]
        images = {line.split(",")[0] for line in per}
        if "2007_000404" not in bad or images != {"2007_000001.jpg", "2007_000002.jpg", "2007_000003.jpg"}:
            return f"bad_data: {bad!r}; scored {sorted(images)}"
        return ""

    return [
        Case("training log", "records of a fit interrupted in its step", ["train-report", lm["interrupted"]], "ok",
             "6 records (every 1 steps)"),
        Case("training log", "finite gradients whose squares overflow", ["train-report", lm["overflow"]], "ok",
             "records", must_not_say="nonfinite"),
        Case("training log", "a run that went NaN", ["train-report", lm["nan"]], "strict", "later record(s)",
             must_not_say="random layer"),
        Case("sequence", "33 ids for 32 positions", ["explain", gpt2, "--tokens", ids33, "--out", out],
             must_say="32 positions"),
        Case("sequence", "prompt + generation that fit exactly",
             ["explain", gpt2, "--tokens", ids4, "--generate", "29", "--out", str(d / "gen.png")], "ok"),
        Case("sequence", "generation one past the positions",
             ["explain", gpt2, "--tokens", ids4, "--generate", "30", "--out", str(d / "gen.png")],
             must_say="room to generate 29"),
        Case("sequence", "100,000 ids on a tiny Llama", ["explain", llama, str(d / "long.npy"), "--out", out],
             must_say="GiB"),
        Case("numbers", "--next=--5", ["explain", llama, "--tokens", "1 2 3", "--next=--5", "--out", out],
             must_say="not a token id"),
        Case("numbers", "--next ²", ["explain", llama, "--tokens", "1 2 3", "--next", "²", "--out", out],
             must_say="not a token id"),
        Case("numbers", "Target(index='--5')", [], must_say="whole number",
             python=api("gs.Target(kind='token', index='--5')")),
        Case("numbers", "a uint64 id past int64", ["explain", llama, str(d / "huge_ids.npy"), "--out", out],
             must_say="18446744073709551615"),
        Case("text input", "a lone surrogate in a JSON vocabulary",
             ["explain", small, "--text", "the cat", "--vocab", surrogate, "--out", str(d / "sur.png")], "ok"),
        Case("image", "a header of 60000x60000", ["explain", demo, str(bomb_dir / "bomb.png"), "--out", out],
             must_say="50 MP"),
        Case("image", "that header in a folder", ["explain", demo, str(bomb_dir), "--out", str(d / "r5_bomb_out")],
             must_say="could not be read", check=good_written),
        Case("dataset", "VOC split: BOM, a repeat, a missing image",
             ["evaluate", demo, str(voc), "--class-map", write(d / "r5_map.json", '{"1": 0}'), "--out",
              str(d / "r5_voc_out")], must_say="could not be used", check=voc_scored),
        Case("outputs", "explain FOLDER --out FILE", ["explain", demo, str(bomb_dir), "--out", mine],
             must_say="is a file", check=intact),
        Case("monitor", "every=2**63", [], must_say="every must be at most",
             python=api("GradientMonitor('unused', every=2**63)")),
        Case("monitor", "a log folder it cannot write", [], must_say="Cannot write the log",
             python=api(lm["unwritable"])),
        Case("api", "explain(vocab=123)", [], must_say="vocab must be",
             python=api(f"gs.explain({demo!r}, {img!r}, vocab=123)")),
        Case("api", "explain_generation(steps=True)", [], must_say="steps must be",
             python=api(f"gs.explain_generation({gpt2!r}, '1 2 3', steps=True)")),
        Case("window", "a session's token target the model lacks",
             ["gui", session, "--screenshot", str(d / "r5_shot.png"), "--size", "1024x640"],
             must_say="does not exist"),
        Case("language model", "sanity on a keras_hub GPT-2", ["sanity", gpt2, write(d / "ids5.txt", "3 9 4 17 5")],
             "ok", "Model randomisation", must_not_say="<input>"),
    ]  # fmt: skip


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` pixels: a signature, IHDR and IEND, no pixel data."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def _voc_with_bad_split(d: Path) -> Path:
    """A Pascal VOC folder of three images whose val.txt starts with a byte-order mark, lists one image twice
    and names one that is not there."""
    voc = d / "r5_voc" / "VOC2012"
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (voc / sub).mkdir(parents=True)
    for i in (1, 2, 3):
        Image.new("RGB", (64, 64), "red").save(voc / "JPEGImages" / f"2007_00000{i}.jpg")
        mask = np.zeros((64, 64), np.uint8)
        mask[16:48, 16:48] = 1
        Image.fromarray(mask, mode="L").save(voc / "SegmentationClass" / f"2007_00000{i}.png")
    split = "\ufeff2007_000001\n2007_000002\n2007_000002\n2007_000003\n2007_000404\n"
    (voc / "ImageSets" / "Segmentation" / "val.txt").write_bytes(split.encode())
    return d / "r5_voc"


def _language_models_and_logs(d: Path) -> dict[str, str]:
    """Tiny GPT-2 (32 positions) and Llama from keras_hub, a 64-token language model, and monitor logs: a fit
    interrupted in its 7th step whose process then ends without exit handlers, finite gradients whose squares
    overflow float32, and a run that goes NaN (made in a child process: TensorFlow stays out of the sweep's)."""
    script = f"""
import os, sys
import numpy as np
sys.path.insert(0, {str(ROOT)!r})
from tests.engine.backward.language_models import tiny_causal_lm
from gradscope.backend import keras
from gradscope import GradientMonitor
d = {str(d)!r}
tiny_causal_lm("gpt2").save(d + "/gpt2.keras")
tiny_causal_lm("llama").save(d + "/llama.keras")
keras.utils.set_random_seed(0)
i = keras.Input((None,), dtype="int32", name="tokens")
keras.Model(i, keras.layers.Dense(64)(keras.layers.Embedding(64, 8)(i))).save(d + "/small_lm.keras")
def mlp(lr):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    m.compile(keras.optimizers.SGD(lr), "mse")
    return m
x = np.random.default_rng(0).uniform(size=(16, 8)).astype("float32")
mlp(1e-40).fit(x * 1e12, np.zeros((16, 2), "float32"), batch_size=8, verbose=0,
               callbacks=[GradientMonitor(d + "/log_overflow", every=1)])
mlp(1e10).fit(x, x[:, :2], batch_size=2, verbose=0, callbacks=[GradientMonitor(d + "/log_nan", every=1)])
monitor = GradientMonitor(d + "/log_interrupted", every=1)
class CtrlC(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == 6:
            def interrupted(iterator):
                raise KeyboardInterrupt
            monitor._train_function = interrupted
try:
    mlp(0.01).fit(x, x[:, :2], batch_size=1, verbose=0, callbacks=[monitor, CtrlC()])
except KeyboardInterrupt:
    pass
sys.stdout.flush()
os._exit(0)  # as a killed kernel: no exit handler flushes what the monitor left queued
"""
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, cwd=ROOT)
    unwritable = (
        "m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]); m.compile('sgd', 'mse'); "
        "m.fit(np.zeros((8, 4)), np.zeros((8, 2)), verbose=0, callbacks=[GradientMonitor('/proc/driver')])"
    )
    return {
        "gpt2": str(d / "gpt2.keras"),
        "llama": str(d / "llama.keras"),
        "small": str(d / "small_lm.keras"),
        "interrupted": str(d / "log_interrupted"),
        "overflow": str(d / "log_overflow"),
        "nan": str(d / "log_nan"),
        "unwritable": "import numpy as np; from gradscope.backend import keras; " + unwritable,
    }


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
    cmd = [sys.executable, "-c", case.python] if case.python else [sys.executable, "-m", "gradscope", *case.args]
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
    if case.must_not_say and case.must_not_say.lower() in text.lower():
        problem = problem or f"says {case.must_not_say!r}"
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
    parser.add_argument("--only", default="", help="run the cases whose group or name holds this text")
    args = parser.parse_args()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "QT_QPA_PLATFORM": "offscreen"}
    with tempfile.TemporaryDirectory() as tmp:
        todo = [c for c in cases(Path(tmp)) if args.only.lower() in f"{c.group} {c.name}".lower()]
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
