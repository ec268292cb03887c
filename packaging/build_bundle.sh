#!/usr/bin/env bash
# Build the desktop bundle (a one-folder PyInstaller app) and check it: the built program runs `explain` on
# its bundled demo and opens its GUI offscreen, from outside the repository. Prints its size and start times.
# Usage: packaging/build_bundle.sh        -> dist/gradscope/gradscope
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pip install -qq "pyinstaller>=6.10"
QT_QPA_PLATFORM=offscreen .venv/bin/pyinstaller --noconfirm --clean --log-level WARN --distpath dist --workpath build/pyinstaller \
  packaging/gradscope.spec
app="$(pwd)/dist/gradscope/gradscope"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
echo "bundle: $(du -sh "$(dirname "$app")" | cut -f1) in $(dirname "$app")"
"$app" --version
t0=$(date +%s%N)
"$app" explain --method guided_backprop --out "$work/overlay.png"
t1=$(date +%s%N)
[ -s "$work/overlay.png" ] || { echo "bundle: explain wrote no overlay" >&2; exit 1; }
QT_QPA_PLATFORM=offscreen timeout 300 "$app" --screenshot "$work/window.png"
t2=$(date +%s%N)
[ -s "$work/window.png" ] || { echo "bundle: the GUI wrote no screenshot" >&2; exit 1; }
echo "bundle: explain on the demo $(( (t1 - t0) / 1000000 )) ms; GUI start -> demo result -> screenshot" \
  "$(( (t2 - t1) / 1000000 )) ms"
