#!/usr/bin/env bash
# The benchmark modes on a GPU machine (bench/RESULTS.md). Each MODE is one row of bench/modes.py: its
# command, the GPUs it needs, what it reads beside the checkout, the section of bench/RESULTS.md it backs.
#   bash bench/run_device.sh --list            the modes (python3 bench/modes.py list)
#   bash bench/run_device.sh --show MODE...    their commands, not run
#   bash bench/run_device.sh MODE...           run them in order (JSON to $OUT, default /tmp/bench-out)
# A name that is not a mode stops the run before anything starts. The modes that read the synthetic a14b
# NF4 package write it first (~2.5 min, in /dev/shm: a later run on the same machine reuses it).
# What the modes read beside the checkout (ignored paths; the list's carry column says which mode reads which):
#   .whl        the bitsandbytes wheel
#   .whl2       bitsandbytes without the CUDA 11/12 and ROCm libraries, and PyAV (the modes that write an .mp4)
#   .whl3       bitsandbytes and FlashAttention 3's forward-only wheel fa3-fwd
#   .site_xz    PyAV, fa3-fwd and bitsandbytes unpacked and packed again with xz (41 MB against 70 MB as wheels):
#                 mkdir -p site && for w in av-*.whl fa3_fwd-*.whl bitsandbytes-*.whl; do unzip -q -o $w -d site; done
#                 tar cf - -C site . | xz -9e -T8 > .site_xz/site.tar.xz
#   .bench_host, .whl_server   ComfyUI's sources and the wheels of their start-up imports: bash bench/server_carry.sh
#   .bench_data/example00      a start image.jpg with its poses.npy and intrinsics.npy (the reference's example 00)
# STEPS (1-4, default 4): LingBot-World Fast's denoising steps per chunk in the Fast, Play, play_client and fast_kept modes;
# each JSON records it as "steps".
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    --list) exec python3 bench/modes.py list ;;
    --show) shift; python3 bench/modes.py check "$@" || exit 2
            for what in "$@"; do echo "=== $what"; python3 bench/modes.py command "$what"; done
            exit 0 ;;
    ""|-h|--help) sed -n '2,8p' "$0"; exit 2 ;;
esac
python3 bench/modes.py check "$@" || exit 2
# The wheels (see above) into /tmp/site, which stays on a warm machine: a later run keeps what an earlier
# one unpacked.
for wheels in .whl .whl2 .whl3; do
    if [[ -d $wheels ]]; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/site $wheels/*.whl 2>&1 | grep -v "^WARNING: Target"
        export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
    fi
done
for packed in .site_xz/*.tar.xz; do  # once per machine: runs started side by side (one per GPU) share it
    [[ -f $packed ]] || continue
    mkdir -p /tmp/site
    [[ -f /tmp/site/.unpacked ]] || { tar xJf "$packed" -C /tmp/site && touch /tmp/site/.unpacked; }
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
done
export PYTHONUNBUFFERED=1
PLAY_TAG=${PLAY_MODES:-}; PLAY_TAG=${PLAY_TAG//,/-}  # PLAY_MODES in file names: a "," in a name does not come back
OUT="${OUT:-/tmp/bench-out}"; mkdir -p "$OUT"
PKG="${LINGBOT_BENCH_PACKAGE:-/dev/shm/lingbot_a14b_nf4}"
CAM=.bench_data/example00
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
ensure_package() {  # only the modes that read a checkpoint need it (~2.5 min to write)
    [[ -f "$PKG/low_noise_model_bnb_nf4/model.safetensors" ]] && return
    /usr/bin/time -v python3 . make_checkpoint --preset a14b --layout nf4 --out "$PKG" --device cuda --overwrite 2>"$OUT/make_checkpoint.time" \
        | tee "$OUT/make_checkpoint.log"
    grep -E "Elapsed|Maximum resident" "$OUT/make_checkpoint.time"
}
# The wheels of what ComfyUI's sources (.bench_host) import at start-up, carried as .whl_server: only those
# whose module the machine lacks are installed.
server_wheels() {
    [[ -d .whl_server ]] || return 0
    python3 - .whl_server /tmp/site <<'EOF'
import importlib.util, pathlib, subprocess, sys
MODULES = {"attrs": "attr", "pyyaml": "yaml", "python_dotenv": "dotenv", "websocket_client": "websocket"}
missing = [str(w) for w in sorted(pathlib.Path(sys.argv[1]).glob("*.whl"))
           if importlib.util.find_spec(MODULES.get(w.name.split("-")[0].lower(), w.name.split("-")[0].lower())) is None]
print("installing", [pathlib.Path(w).name.split("-")[0] for w in missing] or "nothing")
if missing:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", sys.argv[2],
                    *missing], check=True)
EOF
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
}
# The synthetic a14b Fast package (NF4 layout, ~2 min), and one written by `quantize --format fp8` from a bf16
# Fast release (~6 min): what the client bench (bench/play_client.py) puts in the server's models folder.
FASTPKG="${LINGBOT_FAST_PACKAGE:-/dev/shm/lingbot_a14b_fast_nf4}"
FP8PKG=/tmp/lingbot_a14b_fast_fp8
ensure_fast_package() {
    [[ -f "$FASTPKG/lingbot_world_fast_bnb_nf4/model.safetensors" ]] && return
    python3 . make_checkpoint --model fast --preset a14b --layout nf4 --out "$FASTPKG" --device cuda --overwrite | tail -2
}
ensure_fp8_package() {
    [[ -d "$FP8PKG/lingbot_world_fast_fp8" ]] && return
    python3 . make_checkpoint --model fast --preset a14b --layout bf16 --out /tmp/lingbot_a14b_fast_bf16 --device cuda \
        --overwrite | tail -2
    python3 . quantize --src /tmp/lingbot_a14b_fast_bf16 --out "$FP8PKG" --format fp8 --device cuda --overwrite | tail -6
    rm -rf /tmp/lingbot_a14b_fast_bf16/lingbot_world_fast
}
# Play at a client of a real server (bench/play_client.py): fp8 linears (made on load from the NF4 package, or as
# the fp8 package stores them), the live tiny decoder, bf16 VAE; the cold start is the first session's Run -> first
# frame with the package read into the page cache first. CLIENT_ARGS adds or overrides flags ("--vram-cap-gb 24",
# "--weights nf4", "--server-args=--disable-cuda-malloc": ComfyUI on PyTorch's own allocator, with CUDA graphs);
# CLIENT_TAG goes into the JSON's name.
play_client() { server_wheels; python3 bench/play_client.py --comfy .bench_host --image "$CAM/image.jpg" \
                    --size 480x832 --steps "${STEPS:-4}" --live-decoder --vae-precision bf16 "$@" ${CLIENT_ARGS:-} 2>&1 \
                    | grep -v "^Failed to load" | tail -4; }
VAEPKG=/dev/shm/lingbot_vae_only
ensure_vae() {  # the synthetic Wan 2.1 VAE alone (seconds): what the synthetic Play sessions read
    [[ -f "$VAEPKG/Wan2.1_VAE.pth" ]] || python3 . make_checkpoint --preset a14b --layout nf4 --parts vae --out "$VAEPKG" \
        --overwrite >/dev/null
}
# Play with the transformer built in memory (synthetic fp8 A14B on every rank, random prompt states) and
# either the Wan VAE or ComfyUI's tiny video VAE as the live decoder (carry .bench_host: ComfyUI's sources).
play_syn() { ensure_vae; server_wheels; python3 bench/play_session.py --synthetic a14b --weights fp8 --vae "$VAEPKG/Wan2.1_VAE.pth" \
                 --image "$CAM/image.jpg" --size 480x832 --kv-dtype bf16 --vae-precision bf16 --camera-terms 40 \
                 --steps "${STEPS:-4}" --cuda-graphs --pipeline overlap --comfy .bench_host "$@" 2>&1 | grep -v "^Failed to load" | tail -3; }
play() { ensure_package; python3 bench/play_session.py --package "$PKG" --image "$CAM/image.jpg" --steps "${STEPS:-4}" \
             --modes "${PLAY_MODES:-turn,continuous}" "$@" 2>&1 | grep -v "^Failed to load" | tail -3; }
bench() { ensure_package; python3 bench/bench_pipeline.py "$@" --package "$PKG" 2>&1 | tail -3; }
fast() { ensure_package; python3 bench/fast_chunks.py --package "$PKG" --image "$CAM/image.jpg" --steps "${STEPS:-4}" "$@" 2>&1 \
             | grep -v "^Failed to load" | tail -3; }
multi() { python3 bench/multi_gpu.py "$@" 2>&1 | grep -v "^Failed to load"; }
gpu_pytest() { python3 -m pytest -q -p no:cacheprovider --tb=short "$@" 2>&1 | grep -v "^Failed to load"; }
ttv() { ensure_package; python3 bench/time_to_video.py --package "$PKG" --steps "${TTV_STEPS:-40}" --image "$CAM/image.jpg" \
            --camera-dir "$CAM" --out-dir "$OUT/ttv" "$@"; }
ttv_save() {  # NAME VARIANT: the video saved in /dev/shm/ttv_NAME (what ttv_compare reads), its latent also in $OUT
    ttv --variant "$2" --save-reference "/dev/shm/ttv_$1" 2>&1 | grep -v "^Failed to load" | tail -2
    mkdir -p "$OUT/ttv_$1" && cp "/dev/shm/ttv_$1/latent.pt" "/dev/shm/ttv_$1/name.txt" "$OUT/ttv_$1/"
}
long_video() { ensure_package; python3 bench/long_video.py --package "$PKG" --steps "${LONG_STEPS:-3}" --vram-cap-gb 24 \
                   --image "$CAM/image.jpg" "$@" 2>&1 | tail -4; }
for what in "$@"; do
    echo "=== $what"
    eval "$(python3 bench/modes.py command "$what")"
done
