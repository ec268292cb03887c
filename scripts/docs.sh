#!/usr/bin/env bash
# Build the documentation site (README's guides under docs/, the example notebook executed by a real kernel) into
# build/site with --strict: a broken link, anchor or page, or a notebook cell that fails, fails the build.
# `.venv/bin/mkdocs serve` shows it while you write.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
rm -rf .cache/mkdocs-jupyter  # its cache would show the outputs of an older gradscope
NO_MKDOCS_2_WARNING=1 QT_QPA_PLATFORM=offscreen .venv/bin/mkdocs build --strict
