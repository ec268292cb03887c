#!/usr/bin/env bash
# Set up (first time) and run the test suite (slow cases excluded; add `-m slow` to run only those).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export QT_QPA_PLATFORM=offscreen
exec .venv/bin/python -m pytest -q "$@"
