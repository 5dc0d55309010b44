#!/usr/bin/env bash
# The main job, end to end on a fresh machine: install the pack's requirements, write a tiny
# synthetic LingBot-World package, and generate a short camera-controlled video from it with
# the same pipeline the ComfyUI nodes use. Real packages work the same way:
#   python . generate --package /path/to/lingbot-world-nf4 --image photo.jpg --prompt "..." --out out.mp4
#
# Runs any number of times: the first run installs (a few minutes, ~6 GB for torch) and writes
# the package (seconds); later runs reuse both. The demo replaces its own video at the default
# path; a DEMO_OUT of yours that exists is kept (the run stops and says so).
#
#   LINGBOT_VENV   virtual environment to create or reuse (default: .venv)
#   DEMO_OUT       where the video goes (default: test-artifacts/demo.mp4, replaced on each run)
#   DEMO_WORK      where the synthetic package and the fallback image go (default: .cache/demo)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
VENV="${LINGBOT_VENV:-.venv}"
PY="$VENV/bin/python"
DEFAULT_OUT=test-artifacts/demo.mp4
OUT="${DEMO_OUT:-$DEFAULT_OUT}"
WORK="${DEMO_WORK:-.cache/demo}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

say() { printf '[demo] %s\n' "$*"; }

# A DEMO_OUT of yours is never replaced: said now, before any install or work.
if [[ "$OUT" != "$DEFAULT_OUT" && ( -e "$OUT" || -L "$OUT" ) ]]; then
    say "DEMO_OUT=$OUT exists; it is kept. Remove it, or set DEMO_OUT to a name that does not exist" >&2
    exit 2
fi

if [[ ! -x "$PY" ]]; then
    say "creating the virtual environment $VENV"
    "${LINGBOT_PYTHON:-python3}" -m venv "$VENV"
fi
if ! "$PY" -c 'import torch, bitsandbytes, safetensors, tokenizers, av, scipy' 2>/dev/null; then
    # torch 2.14.1 is the build these machines carry locally; any torch >= 2.4 works.
    say "first run: installing torch 2.14.1 and requirements.txt into $VENV (a few minutes, about 6 GB)"
    "$PY" -m pip install "torch==2.14.1" -r requirements.txt
    say "installed"
fi

mkdir -p "$WORK" "$(dirname "$OUT")"
if [[ ! -d "$WORK/tiny_nf4/tokenizer" ]]; then
    say "writing a tiny synthetic package (random weights) to $WORK/tiny_nf4"
    # --overwrite: the demo's own folder; an interrupted first run may have left some parts
    "$PY" . make_checkpoint --preset tiny --layout nf4 --out "$WORK/tiny_nf4" --overwrite
fi

IMAGE=../shared/lingbot_examples/00/image.jpg
if [[ ! -f "$IMAGE" ]]; then
    IMAGE="$WORK/gradient.png"
    "$PY" -c "from PIL import Image; Image.radial_gradient('L').resize((320, 192)).save('$IMAGE')"
fi

# The demo's own video is replaced; a file the user named with DEMO_OUT never is.
REPLACE=()
[[ "$OUT" == "$DEFAULT_OUT" ]] && REPLACE=(--overwrite)
say "generating 17 frames at 160x96 on the CPU into $OUT"
"$PY" . generate --package "$WORK/tiny_nf4" --image "$IMAGE" --device cpu \
    --prompt "a soaring flight towards a castle" --preset dolly_in --frames 17 --size 96x160 \
    --steps 6 --out "$OUT" "${REPLACE[@]}"
