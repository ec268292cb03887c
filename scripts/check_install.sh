#!/usr/bin/env bash
# Install gradscope as a user would and check it there (CI runs this after the test suite):
#   - build the sdist, and the wheel from the sdist (so the sdist is complete too);
#   - a fresh venv that already holds the OLDEST supported `tensorflow` (the GPU-capable distribution, not
#     -cpu) and the oldest supported Keras; install the wheel; TensorFlow and Keras must be left as they were;
#   - from a folder outside the repository: `gradscope --version`, `explain` on the bundled demo, the GUI
#     offscreen with --screenshot, and the identity == tape tests against the installed package;
#   - a second fresh venv with the newest supported `tensorflow` (the full build, as most users have it): the wheel
#     with `[notebook,hf]`, which must leave TensorFlow as it was, then from a folder of its own the bundled
#     language model explained by the CLI and the example notebook run by nbclient (no error, no stderr output).
# Usage: scripts/check_install.sh [TF_VERSION [KERAS_VERSION]]   (defaults: the oldest supported pair)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
TF_VERSION=${1:-2.19.1}
KERAS_VERSION=${2:-3.10.0}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say() { printf 'check_install: %s\n' "$*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

say "building the sdist and, from it, the wheel"
.venv/bin/python -m build -q --outdir "$work/dist" . >/dev/null 2>"$work/build.log" || { cat "$work/build.log"; fail "build"; }
if grep -i "warning" "$work/build.log" | grep -v "^WARNING: Location" >/dev/null; then
  cat "$work/build.log"; fail "the build printed warnings"
fi
whl=$(ls "$work"/dist/*.whl)
.venv/bin/python -m zipfile -l "$whl" > "$work/wheel.txt"
for member in gradscope/resources/demo/shapes_cnn.keras gradscope/resources/icons/gradscope.svg \
  gradscope/resources/rules/weight_aware_example.py gradscope/resources/demo/images/circle_0.png \
  gradscope/resources/demo/tiny_gpt2/model.safetensors gradscope/resources/demo/tiny_gpt2/tokenizer.json; do
  grep -q "$member" "$work/wheel.txt" || fail "the wheel lacks $member"
done

say "a fresh venv with tensorflow==$TF_VERSION and keras==$KERAS_VERSION (the user's environment)"
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -qq "tensorflow==$TF_VERSION" "keras==$KERAS_VERSION"
"$py" -m pip freeze | grep -iE '^(tensorflow|tensorflow-cpu|tensorflow_cpu|keras)==' | sort > "$work/before.txt"
say "installing the wheel into it"
"$py" -m pip install -qq "$whl"
"$py" -m pip freeze | grep -iE '^(tensorflow|tensorflow-cpu|tensorflow_cpu|keras)==' | sort > "$work/after.txt"
diff "$work/before.txt" "$work/after.txt" || fail "installing gradscope changed the user's TensorFlow/Keras"
say "left as they were: $(tr '\n' ' ' < "$work/after.txt")"

cd "$work"  # outside the repository: only the installed package can be imported
"$py" -c "import gradscope, sys; sys.exit('gradscope' not in gradscope.__file__ or 'site-packages' not in gradscope.__file__)" ||
  fail "gradscope was not imported from the venv"
"$work/venv/bin/gradscope" --version
"$work/venv/bin/gradscope" explain --method guided_backprop --out "$work/overlay.png"
[ -s "$work/overlay.png" ] || fail "explain wrote no overlay"
QT_QPA_PLATFORM=offscreen timeout 180 "$work/venv/bin/gradscope" gui --screenshot "$work/window.png"
[ -s "$work/window.png" ] || fail "the GUI wrote no screenshot"

say "identity == tape checks against the installed package"
"$py" -m pip install -qq pytest
cp -r "$repo/tests" "$work/tests"
printf '[pytest]\naddopts = -p no:cacheprovider\nfilterwarnings = ignore::DeprecationWarning\n' > "$work/pytest.ini"
QT_QPA_PLATFORM=offscreen "$py" -m pytest -q "$work/tests/engine/backward/test_identity.py"

NEW_TF=2.21.0
say "a second fresh venv with tensorflow==$NEW_TF; the wheel with [notebook,hf] (language models, Jupyter)"
python3 -m venv "$work/venv-hf"
hpy="$work/venv-hf/bin/python"
"$hpy" -m pip install -qq "tensorflow==$NEW_TF"
"$hpy" -m pip freeze | grep -iE '^(tensorflow|tensorflow-cpu|tensorflow_cpu)==' | sort > "$work/before-hf.txt"
"$hpy" -m pip install -qq "$whl[notebook,hf]"
"$hpy" -m pip freeze | grep -iE '^(tensorflow|tensorflow-cpu|tensorflow_cpu)==' | sort > "$work/after-hf.txt"
diff "$work/before-hf.txt" "$work/after-hf.txt" || fail "installing gradscope[hf] changed the user's TensorFlow"
mkdir "$work/outside" && cd "$work/outside"
"$work/venv-hf/bin/gradscope" explain demo:tiny_gpt2 --text "the cat sat near the" --method attnlrp \
  --out "$work/outside/strip.png" 2>&1 | tee "$work/outside/said.txt"
grep -q "' mat'" "$work/outside/said.txt" || fail "the bundled language model did not explain ' mat'"
say "its token maps evaluated over texts, read by its own tokenizer (issue 63)"
printf '{"text": "the cat sat near the"}\n{"text": "a dog ran", "target": "cat"}\n' > "$work/outside/texts.jsonl"
"$work/venv-hf/bin/gradscope" evaluate demo:tiny_gpt2 texts.jsonl --method attnlrp,random --out eval --quiet \
  > "$work/outside/eval.txt" || { cat "$work/outside/eval.txt"; fail "evaluate on texts"; }
grep -q "2 of 2 texts scored" "$work/outside/eval.txt" && grep -q "^attnlrp,abpc," eval/results.csv \
  || { cat "$work/outside/eval.txt"; fail "the text evaluation did not score both texts"; }
say "Hugging Face folders from the wheel: a carried config field gives torch's logits, a field keras_hub cannot build is refused in one line (issue 61)"
cp -r "$repo/tests/data/hf_variants/llama_rms_norm_eps" "$repo/tests/data/hf_variants/llama_rms_norm_eps.npz" \
  "$repo/tests/data/hf/gemma" "$work/outside/"
"$hpy" - <<'PY' || fail "a Hugging Face folder from the wheel"
import json

import numpy as np

import gradscope.api as gs
from gradscope.core.errors import ModelLoadError

ref = np.load("llama_rms_norm_eps.npz")
engine = gs.open_engine("llama_rms_norm_eps")
ids = ref["ids"][None]
logits = np.asarray(engine.model({"token_ids": ids, "padding_mask": np.ones_like(ids)}))[0]
assert np.abs(logits - ref["logits"]).max() <= 1e-5 * np.abs(ref["logits"]).max(), "logits differ from torch's"
config = json.load(open("gemma/config.json"))
json.dump({**config, "hidden_act": "gelu"}, open("gemma/config.json", "w"))
try:
    gs.open_engine("gemma")
    raise SystemExit("a Gemma folder with an exact GELU opened")
except ModelLoadError as exc:
    assert "hidden_act = 'gelu'" in str(exc) and "\n" not in str(exc), exc
print("llama_rms_norm_eps: torch's logits; gemma with hidden_act gelu: refused in one line")
PY
"$hpy" -m pip install -qq nbclient nbformat  # the runner, as Jupyter runs a notebook (not a gradscope extra)
cp "$repo/docs/examples/gradscope_in_a_notebook.ipynb" "$work/outside/"
"$hpy" - "$work/outside/gradscope_in_a_notebook.ipynb" <<'PY'
import sys

import nbclient
import nbformat

nb = nbformat.read(sys.argv[1], as_version=4)
nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
for cell in nb.cells:
    for out in cell.get("outputs", []):
        if out.output_type == "error" or (out.output_type == "stream" and out.get("text", "").strip()):
            sys.exit(f"the notebook printed or failed in {cell.source[:60]!r}: {out}")
print("the example notebook ran from", sys.argv[1])
PY
say "passed"
