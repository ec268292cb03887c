#!/usr/bin/env bash
# Create .venv and install gradscope with its test tools. Safe to run again: it only reinstalls when
# pyproject.toml changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# Qt needs a few system libraries even offscreen; install them where we can (root with apt, e.g. CI).
if command -v ldconfig >/dev/null && ! ldconfig -p | grep -q 'libEGL.so.1'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq libegl1 libgl1 libxkbcommon0 libfontconfig1 libdbus-1-3 >/dev/null
  else
    echo "note: Qt needs libEGL, libGL, libxkbcommon, fontconfig and dbus libraries (apt: libegl1 libgl1" \
         "libxkbcommon0 libfontconfig1 libdbus-1-3)." >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.gradscope-installed
want=$(sha1sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
fi
