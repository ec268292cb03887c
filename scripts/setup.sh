#!/usr/bin/env bash
# Create .venv and install gradscope with its test tools. Safe to run again: it only reinstalls when
# pyproject.toml changed since the last install.
#
# System libraries (Debian/Ubuntu package names), installed with apt when run as root, else listed:
#   offscreen Qt (tests, exports): libegl1 libgl1 libxkbcommon0 libfontconfig1 libdbus-1-3
#   a real window under X11 (Qt's xcb plugin refuses to start without these):
#     libxcb-cursor0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-randr0 libxcb-render-util0
#     libxcb-shape0 libxcb-xinerama0 libxcb-xkb1 libxkbcommon-x11-0
#   fonts for every script in token strips and exports (render/fonts.py finds them through fontconfig):
#     fontconfig fonts-dejavu-core fonts-noto-cjk fonts-noto-color-emoji
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

QT_LIBS="libegl1 libgl1 libxkbcommon0 libfontconfig1 libdbus-1-3"
X11_LIBS="libxcb-cursor0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-randr0 libxcb-render-util0 \
libxcb-shape0 libxcb-xinerama0 libxcb-xkb1 libxkbcommon-x11-0"
FONTS="fontconfig fonts-dejavu-core fonts-noto-cjk fonts-noto-color-emoji"
# Probe a few sonames; install only when one is missing (apt is slow even when there is nothing to do).
missing=0
if command -v ldconfig >/dev/null; then
  for so in libEGL.so.1 libxkbcommon.so.0 libxcb-cursor.so.0 libxcb-icccm.so.4 libxkbcommon-x11.so.0; do
    ldconfig -p | grep -q "$so" || missing=1
  done
fi
# A CJK and an emoji face (Latin, Greek, Cyrillic and Arabic come with DejaVu).
if ! command -v fc-list >/dev/null || [ -z "$(fc-list :lang=zh file)" ] || [ -z "$(fc-list 'Noto Color Emoji' file)" ]; then
  missing=1
fi
if [ "$missing" = 1 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing the system libraries Qt needs and fonts (apt): $QT_LIBS $X11_LIBS $FONTS" >&2
    # shellcheck disable=SC2086
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $QT_LIBS $X11_LIBS $FONTS >/dev/null; } ||
      echo "warning: apt could not install them; the GUI may not start." >&2
  else
    echo "note: Qt needs these system libraries, and text in other scripts these fonts (apt install ...):" \
      "$QT_LIBS $X11_LIBS $FONTS" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.gradscope-installed
want=$(cat pyproject.toml setup.py scripts/setup.sh | sha1sum | cut -d" " -f1)  # what the install depends on
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -qq --upgrade pip
  # -qq: the build backend notes that every flat-layout editable install gets are not shown (errors are)
  .venv/bin/python -m pip install -qq -e ".[cpu,dev]"  # the CPU build of TensorFlow for its own .venv
  # keras_hub for the tests of its tokenizers and transformer blocks. --no-deps: keras-hub requires
  # tensorflow-text, which would replace tensorflow-cpu with the full tensorflow build; the parts the tests use
  # (tokenizers in NumPy, layers, backbones) need only these; sentencepiece for its SentencePiece tokenizers
  # (Gemma, Llama 2), and to train a tiny one in the tests; safetensors for keras_hub's Hugging Face converters
  # (checkpoint folders).
  .venv/bin/python -m pip install -qq --no-deps "keras-hub>=0.32,<0.33" regex tokenizers kagglehub sentencepiece \
    "kagglesdk>=0.1.38,<1" tqdm "safetensors>=0.4"
  echo "$want" > "$stamp"
fi
