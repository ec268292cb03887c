"""Round six of ``scripts/bad_input_sweep.py`` (issue 58): code through a plan's name, files leaked into a report,
weights read from outside a checkpoint folder, checkpoint files that are FIFOs, devices or absurd configs, text that
is not Unicode, prompts tried as paths, ``vocab.json`` out of id order, a broken tokenizer, sampling on a
generation, wrong API types, two outputs naming one file, layer names XML forbids."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bad_input_case import Case, api, write

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT / "tests" / "data" / "hf"


def round_six(d: Path, demo: str, img: str) -> list[Case]:
    r6 = d / "r6"
    r6.mkdir()
    marker = r6 / "PWNED"
    name = f'x"""; __import__("os").system("touch {marker}"); """'
    plan = write(
        r6 / "evil_plan.json", json.dumps({"schema": 2, "name": name, "entries": [{"select": "conv1", "rule": "zero"}]})
    )
    script = r6 / "train.py"

    def script_is_harmless() -> str:
        if not script.is_file():
            return "no script written"
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=r6, timeout=120)
        return "the plan's name ran code" if marker.exists() else "" if run.returncode == 0 else run.stderr[-200:]

    maps = _maps_with_links(r6, demo, img)
    page = r6 / "page.html"

    def page_leaks_nothing() -> str:
        import base64
        import re

        text = page.read_text() if page.is_file() else ""
        pictures = [base64.b64decode(m) for m in re.findall(r'src="data:image/(?:png|jpeg);base64,([^"]+)"', text)]
        secret = Path("/etc/hostname").read_bytes() if Path("/etc/hostname").is_file() else b"\0"
        if not text:
            return "no page"
        return "" if len(pictures) == 1 and secret not in pictures else f"{len(pictures)} pictures embedded"

    folders = _checkpoint_folders(r6)
    out = str(r6 / "o.png")
    shuffled, by_id = folders["shuffled"], json.loads((HF / "gpt2" / "vocab.json").read_text())
    by_id = {i: t for t, i in by_id.items()}
    log = str(d / "log_interrupted")  # round five's
    svg = (
        "from gradscope.backend import keras; import numpy as np; import xml.etree.ElementTree as ET\n    "
        "i = keras.Input((4,)); m = keras.Model(i, keras.layers.Dense(2, name='a\\x01b\\x0cc')(i))\n    "
        f"ET.parse(gradscope.graph(m, np.ones((1, 4), 'float32')).save({str(r6 / 'g.svg')!r})); print('valid svg')"
    )
    llama = str(HF / "llama")
    ex = lambda folder, *more: ["explain", str(folders.get(folder, folder)), *more, "--out", out]  # noqa: E731
    return [
        Case("security", "a plan name that closes the docstring",
             ["snippet", demo, "--plan", plan, "--out", str(script)], "ok", "wrote", check=script_is_harmless),
        Case("security", "report: links out of the folder, 50 MB of zeros", ["report", str(maps), "--out", str(page)],
             "ok", "4 file(s) left out", check=page_leaks_nothing),
        Case("security", "index names ../outside", ex("outside", "--tokens", "1 2 3"),
             must_say="not inside the folder"),
        Case("security", "index names an absolute path", ex("absolute", "--tokens", "1 2 3"),
             must_say="not inside the folder"),
        Case("security", "index names ../../../../etc/passwd", ex("passwd", "--tokens", "1 2 3"),
             must_say="not inside the folder"),
        Case("checkpoint", "index names a shard that is missing", ex("missing", "--tokens", "1 2 3"),
             must_say="does not have"),
        Case("checkpoint", "a sharded folder", ex("sharded", "--tokens", "1 2 3"), "ok", "next token"),
        Case("checkpoint", "config.json nested 200,000 deep", ex("deep", "--tokens", "1 2 3"), must_say="levels deep"),
        Case("checkpoint", "config.json -> /dev/zero", ex("zero_config", "--tokens", "1 2 3"),
             must_say="not a regular file"),
        Case("checkpoint", "config.json is a FIFO", ex("fifo_config", "--tokens", "1 2 3"),
             must_say="not a regular file"),
        Case("checkpoint", "model.safetensors is a FIFO", ex("fifo_weights", "--tokens", "1 2 3"),
             must_say="not a regular file"),
        Case("checkpoint", "the index names a FIFO", ex("fifo_shard", "--tokens", "1 2 3"),
             must_say="not a regular file"),
        Case("checkpoint", "vocab.json -> /dev/zero", ex("zero_vocab", "--text", "ab"), must_say="not a regular file"),
        Case("checkpoint", "num_hidden_layers: 1000000", ex("layers", "--tokens", "1 2 3"),
             must_say="does not match the weights"),
        Case("text", "--text $'\\xff'", ex("gpt2", "--text", "\udcff"), must_say="not valid Unicode"),
        Case("text", "a lone surrogate in the API", [], must_say="lone surrogate",
             python=api(f"gs.explain({str(HF / 'gpt2')!r}, 'the \\ud800 cat')")),
        Case("text", "a 320-character prompt in the API", [], "ok", "more than 40 labels: True",
             python=api(f"print('more than 40 labels:', len(gs.explain({llama!r}, 'the cat ' * 40).labels) > 40)")),
        Case("text", "that prompt for a generation and a graph", [], "ok", "done",
             python=api(f"gs.explain_generation({str(HF / 'llama')!r}, 'the cat ' * 40, steps=1); "
                        f"gs.graph({str(HF / 'llama')!r}, 'the cat ' * 40); print('done')")),
        Case("text", "vocab.json keys not in id order", [], "ok", f"labels {(by_id[14], by_id[15], by_id[10])!r}",
             python=api(f"print('labels', gs.explain({str(shuffled)!r}, [14, 15, 10]).labels)")),
        Case("text", "ids beside a broken tokenizer", ex("broken_tokenizer", "--tokens", "1 2 3"), "ok", "next token"),
        Case("text", "text beside a broken tokenizer", ex("broken_tokenizer", "--text", "hello"),
             must_say="cannot convert the tokenizer"),
        Case("generation", "--generate 2 --method smoothgrad",
             ex("gpt2", "--tokens", "1 2 3", "--generate", "2", "--method", "smoothgrad"), must_say="noisy copies"),
        Case("api", "Plan().with_entry(5, 'zero', {})", [], must_say="select must be",
             python=api("gradscope.Plan().with_entry(5, 'zero', {})")),
        Case("api", "evaluate(methods=[1, 2])", [], must_say="methods are names",
             python=api(f"gs.evaluate({demo!r}, {str(ROOT / 'resources/demo/eval')!r}, methods=[1, 2])")),
        Case("outputs", "train-report --csv a.png --png a.png",
             ["train-report", log, "--csv", str(r6 / "a.png"), "--png", str(r6 / "a.png")], must_say="is also --csv"),
        Case("outputs", "flow --csv a.png --png a.png",
             ["flow", demo, "--csv", str(r6 / "a.png"), "--png", str(r6 / "a.png")], must_say="is also --csv"),
        Case("api", "graph of a layer named 'a\\x01b\\x0cc' as SVG", [], "ok", "valid svg", python=api(svg)),
    ]  # fmt: skip


def _maps_with_links(r6: Path, demo: str, img: str) -> Path:
    """An exported map (made in a child process: TensorFlow stays out of the sweep) beside links out of the folder
    and a file of zeros, each with the map's sidecar."""
    maps = r6 / "maps"
    subprocess.run(
        [sys.executable, "-m", "gradscope", "explain", demo, img, "--out", str(maps / "good.png"), "-q"],
        check=True, capture_output=True, cwd=ROOT,
    )  # fmt: skip
    for stem, target in (("hostname", "/etc/hostname"), ("zero", "/dev/zero"), ("photo", img)):
        (maps / f"{stem}.png").symlink_to(target)
    (maps / "zeros.png").write_bytes(bytes(50 << 20))
    for stem in ("hostname", "zero", "photo", "zeros"):
        shutil.copy(maps / "good.json", maps / f"{stem}.json")
    return maps


def _checkpoint_folders(r6: Path) -> dict[str, Path]:
    from safetensors.numpy import load_file, save_file

    def copy(family: str, name: str) -> Path:
        return Path(shutil.copytree(HF / family, r6 / name))

    def shard(folder: Path, second: str | None = None) -> None:
        tensors = load_file(folder / "model.safetensors")
        (folder / "model.safetensors").unlink()
        keys = sorted(tensors)
        weight_map = {}
        for i, names in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2 :])):
            file = f"model-0000{i + 1}-of-00002.safetensors"
            save_file({k: tensors[k] for k in names}, str(folder / file), metadata={"format": "pt"})
            weight_map.update({k: second if i and second else file for k in names})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    out = {"gpt2": HF / "gpt2"}
    shard(out.setdefault("sharded", copy("llama", "sharded")))
    (r6 / "elsewhere").mkdir()
    for name, second in (("outside", "../elsewhere/x.safetensors"), ("absolute", str(r6 / "elsewhere/x.safetensors")),
                         ("passwd", "../../../../etc/passwd"), ("missing", "model-00003-of-00002.safetensors"),
                         ("fifo_shard", "fifo.safetensors")):  # fmt: skip
        out[name] = copy("llama", name)
        shard(out[name], second)
    shutil.copy(out["outside"] / "model-00002-of-00002.safetensors", r6 / "elsewhere" / "x.safetensors")
    os.mkfifo(out["fifo_shard"] / "fifo.safetensors")
    out["deep"] = copy("llama", "deep")
    (out["deep"] / "config.json").write_text('{"a":' * 200_000 + "1" + "}" * 200_000)
    replaced = (("zero_config", "config.json", "zero"), ("fifo_config", "config.json", "fifo"),
                ("fifo_weights", "model.safetensors", "fifo"), ("zero_vocab", "vocab.json", "zero"))  # fmt: skip
    for name, file, how in replaced:
        out[name] = copy("llama", name)
        (out[name] / file).unlink()
        if how == "fifo":
            os.mkfifo(out[name] / file)
        else:
            (out[name] / file).symlink_to("/dev/zero")
    out["layers"] = copy("llama", "layers")
    config = json.loads((out["layers"] / "config.json").read_text())
    (out["layers"] / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1_000_000}))
    out["shuffled"] = copy("gpt2", "shuffled")
    vocab = json.loads((out["shuffled"] / "vocab.json").read_text())
    (out["shuffled"] / "vocab.json").write_text(json.dumps(dict(sorted(vocab.items(), key=lambda kv: -kv[1]))))
    out["broken_tokenizer"] = copy("gemma3", "broken_tokenizer")
    (out["broken_tokenizer"] / "tokenizer.model").write_bytes(os.urandom(500))
    return out
