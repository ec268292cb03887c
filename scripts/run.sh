#!/usr/bin/env bash
# Set up (first time) and run gradscope. No arguments: the GUI on the bundled demo model and image.
# With arguments: the CLI, e.g. `scripts/run.sh explain --method guided_backprop --out overlay.png`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ $# -eq 0 ]; then
  exec .venv/bin/python main.py
fi
exec .venv/bin/gradscope "$@"
