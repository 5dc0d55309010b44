#!/usr/bin/env bash
# The main job, end to end on a fresh machine: install the pack's requirements, write a tiny
# synthetic LingBot-World package, and generate a short camera-controlled video from it with
# the same pipeline the ComfyUI nodes use. Real packages work the same way:
#   python . generate --package /path/to/lingbot-world-nf4 --image photo.jpg --prompt "..." --out out.mp4
#
#   LINGBOT_VENV   virtual environment to create or reuse (default: .venv)
#   DEMO_OUT       where the video goes (default: test-artifacts/demo.mp4)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
VENV="${LINGBOT_VENV:-.venv}"
PY="$VENV/bin/python"
OUT="${DEMO_OUT:-test-artifacts/demo.mp4}"

if [[ ! -x "$PY" ]]; then
    "${LINGBOT_PYTHON:-python3}" -m venv "$VENV"
fi
if ! "$PY" -c 'import torch, bitsandbytes, safetensors, tokenizers, av, scipy' 2>/dev/null; then
    # torch 2.14.1 is the build these machines carry locally; any torch >= 2.4 works.
    "$PY" -m pip install -q "torch==2.14.1" -r requirements.txt
fi

WORK=.cache/demo
mkdir -p "$WORK" "$(dirname "$OUT")"
[[ -d "$WORK/tiny_nf4/tokenizer" ]] || "$PY" . make_checkpoint --preset tiny --layout nf4 --out "$WORK/tiny_nf4"

IMAGE=../shared/lingbot_examples/00/image.jpg
if [[ ! -f "$IMAGE" ]]; then
    IMAGE="$WORK/gradient.png"
    "$PY" -c "from PIL import Image; Image.radial_gradient('L').resize((320, 192)).save('$IMAGE')"
fi

"$PY" . generate --package "$WORK/tiny_nf4" --image "$IMAGE" --device cpu \
    --prompt "a soaring flight towards a castle" --preset dolly_in --frames 17 --size 96x160 \
    --steps 6 --out "$OUT"
