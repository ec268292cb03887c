#!/usr/bin/env bash
# Install gradscope as a user would and check it there (CI runs this after the test suite):
#   - build the sdist, and the wheel from the sdist (so the sdist is complete too);
#   - a fresh venv that already holds the OLDEST supported `tensorflow` (the GPU-capable distribution, not
#     -cpu) and the oldest supported Keras; install the wheel; TensorFlow and Keras must be left as they were;
#   - from a folder outside the repository: `gradscope --version`, `explain` on the bundled demo, the GUI
#     offscreen with --screenshot, and the identity == tape tests against the installed package.
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
  gradscope/resources/rules/weight_aware_example.py gradscope/resources/demo/images/circle_0.png; do
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
say "passed"
