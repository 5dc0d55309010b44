#!/usr/bin/env bash
# Run on the lent GPU machine (see bench/RESULTS.md): makes an a14b synthetic NF4 package
# (once per machine) and runs the benchmark modes given as arguments, writing JSON to $OUT.
#   bash bench/run_device.sh load naive p480 p720 swap12 frames
#   bash bench/run_device.sh long; bash bench/run_device.sh long961   (two calls: each < 10 min)
#   bash bench/run_device.sh fast81 fast81_int8 fast81_full; bash bench/run_device.sh fast957
#   (LingBot-World Fast, bench/fast_chunks.py: the a14b expert has the Fast transformer's shapes)
#   bash bench/run_device.sh gemm8 fast81_fp8 fast81_int8w   (8-bit weights: per-layer GEMMs, the Fast chunk
#   with fp8 / int8 weights made on load from the NF4 package, each with its floor measured in the same run)
#   PLAY_MODES=turn bash bench/run_device.sh play30_cap24   (LingBot-World Play, bench/play_session.py; carry .whl2:
#   the session writes its .mp4 with PyAV. A 60-second session per mode takes ~4 minutes: one mode per call)
#   bash bench/run_device.sh fast957_pipe; PLAY_MODES=turn bash bench/run_device.sh play60_pipe   (decode overlapped)
#   bash bench/run_device.sh fast81_cap16 fast81_cap12; bash bench/run_device.sh fast957_cap16   (16 / 12 GB cards)
#   STEPS=2 bash bench/run_device.sh fast_kept   (LingBot-World Fast's steps per chunk, 4 by default, for the fast*,
#   play*, fast_kept and play_client modes; each JSON records it as "steps")
set -uo pipefail
cd "$(dirname "$0")/.."
# Wheels carried to the machine: .whl (bitsandbytes), or .whl2 (bitsandbytes without the
# CUDA 11/12 and ROCm libraries, plus PyAV for the modes that write an .mp4: both fit 64 MiB),
# .whl3 (bitsandbytes and FlashAttention 3's forward-only wheel fa3-fwd, for the fa3_* modes).
# /tmp/site stays on a warm machine: a call after a .whl3 call keeps FlashAttention 3.
for wheels in .whl .whl2 .whl3; do
    if [[ -d $wheels ]]; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/site $wheels/*.whl 2>&1 | grep -v "^WARNING: Target"
        export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
    fi
done
# .site_xz/*.tar.xz: wheels unpacked and packed again with xz (PyAV + fa3-fwd + bitsandbytes is 41 MB this way
# against 70 MB as wheels), so that the Play modes with FlashAttention 3 fit the 64 MiB carry with ComfyUI's sources.
#   mkdir -p site && for w in av-*.whl fa3_fwd-*.whl bitsandbytes-*.whl; do unzip -q -o $w -d site; done
#   tar cf - -C site . | xz -9e -T8 > .site_xz/site.tar.xz
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
# LingBot-World Fast packages of the A14B shapes: NF4 (make_checkpoint --model fast, ~10 GB transformer + T5 in
# /dev/shm), and fp8 as `quantize --format fp8` writes it from a bf16 release (both on the disk: the bf16 release's
# transformer, 28 GB, is deleted once converted; the fp8 package hard-links its T5, VAE and tokenizer).
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
# "--weights nf4"); CLIENT_TAG goes into the JSON's name.
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
                 --steps "${STEPS:-4}" \
                 --image "$CAM/image.jpg" --size 480x832 --kv-dtype bf16 --vae-precision bf16 --camera-terms 40 \
                 --cuda-graphs --pipeline overlap --comfy .bench_host "$@" 2>&1 | grep -v "^Failed to load" | tail -3; }
play() { ensure_package; python3 bench/play_session.py --package "$PKG" --image "$CAM/image.jpg" --steps "${STEPS:-4}" \
             --modes "${PLAY_MODES:-turn,continuous}" "$@" 2>&1 | grep -v "^Failed to load" | tail -3; }
bench() { ensure_package; python3 bench/bench_pipeline.py "$@" --package "$PKG" 2>&1 | tail -3; }
fast() { ensure_package; python3 bench/fast_chunks.py --package "$PKG" --image "$CAM/image.jpg" --steps "${STEPS:-4}" "$@" 2>&1 \
             | grep -v "^Failed to load" | tail -3; }
for what in "$@"; do
    echo "=== $what"
    case "$what" in
        package) ensure_package ;;  # the a14b NF4 package alone (/dev/shm: a later call on the warm machine reads it)
        block) python3 bench/block_profile.py --out "$OUT/block_profile.json" 2>&1 | grep -v "^Failed to load" ;;
        load) bench load-expert --out "$OUT/load_expert.json" ;;
        naive) bench naive-load --out "$OUT/naive_load.json" ;;
        p480) bench pipeline --size 480x832 --frames 81 --steps 4 --vram-cap-gb 24 --kernel-floor \
                  --image "$CAM/image.jpg" --camera-dir "$CAM" --out "$OUT/p480_cap24.json" ;;
        p480seq) bench pipeline --size 480x832 --frames 81 --steps 4 --vram-cap-gb 24 --kernel-floor --no-batch-cfg \
                  --image "$CAM/image.jpg" --camera-dir "$CAM" --out "$OUT/p480_cap24_sequential_cfg.json" ;;
        p480eager) LINGBOT_FUSED=0 bench pipeline --size 480x832 --frames 81 --steps 4 --vram-cap-gb 24 --kernel-floor \
                  --image "$CAM/image.jpg" --camera-dir "$CAM" --out "$OUT/p480_cap24_eager.json" ;;
        soak) bench soak --size 240x416 --frames 17 --steps 4 --runs 5 --camera-dir "$CAM" --out "$OUT/soak_gpu.json" ;;
        # Several GPUs (bench/multi_gpu.py): sequence parallel with the 1-GPU figure of the same run, on
        # nvidia-h100-x2 (sp2, sp2_p2p_off, placements2) and nvidia-h100-x4 (sp4); synthetic bf16 A14B weights.
        sp2) python3 bench/multi_gpu.py --mode sp --ranks 2 --out "$OUT/sp_2gpu.json" 2>&1 | grep -v "^Failed to load" | tail -4 ;;
        sp2_p2p_off) NCCL_P2P_DISABLE=1 python3 bench/multi_gpu.py --mode sp --ranks 2 --out "$OUT/sp_2gpu_p2p_off.json" \
                  2>&1 | grep -v "^Failed to load" | tail -4 ;;
        sp4) python3 bench/multi_gpu.py --mode sp --ranks 2 --ranks 4 --out "$OUT/sp_4gpu.json" 2>&1 | grep -v "^Failed to load" | tail -5 ;;
        # fp8 x sequence parallel (every linear fp8 on every rank, the 1-GPU figure in fp8): nvidia-h100-x4
        # fp8 and kept camera terms (a Fast chunk's camera layers once a chunk) x sequence parallel: nvidia-h100-x2
        sp2_fp8) python3 bench/multi_gpu.py --mode sp --ranks 2 --weights fp8 --skip-exact \
                  --out "$OUT/sp_2gpu_fp8.json" 2>&1 | grep -v "^Failed to load" | tail -4 ;;
        sp2_fp8_terms) python3 bench/multi_gpu.py --mode sp --ranks 2 --weights fp8 --camera-terms 40 --skip-exact \
                  --out "$OUT/sp_2gpu_fp8_terms.json" 2>&1 | grep -v "^Failed to load" | tail -4 ;;
        sp2_fp8_terms_sync1) LINGBOT_CANCEL_SYNC_BLOCKS=1 python3 bench/multi_gpu.py --mode sp --ranks 2 --weights fp8 \
                  --camera-terms 40 --skip-exact --out "$OUT/sp_2gpu_fp8_terms_sync1.json" 2>&1 | grep -v "^Failed to load" | tail -4 ;;
        sp2_fp8_terms_profile) python3 bench/multi_gpu.py --mode sp --ranks 2 --weights fp8 --camera-terms 40 --skip-exact \
                  --fast-chunks 4 --profile --out "$OUT/sp_2gpu_fp8_terms_profile.json" >"$OUT/sp_2gpu_profile.log" 2>&1
                  tail -45 "$OUT/sp_2gpu_profile.log" ;;
        sp2_fp8_terms_p2p_off) NCCL_P2P_DISABLE=1 python3 bench/multi_gpu.py --mode sp --ranks 2 --weights fp8 \
                  --camera-terms 40 --skip-exact --out "$OUT/sp_2gpu_fp8_terms_p2p_off.json" 2>&1 | grep -v "^Failed to load" | tail -4 ;;
        sp4_fp8_terms) python3 bench/multi_gpu.py --mode sp --ranks 2 --ranks 4 --weights fp8 --camera-terms 40 --skip-exact \
                  --out "$OUT/sp_4gpu_fp8_terms.json" 2>&1 | grep -v "^Failed to load" | tail -5 ;;
        sp4only_fp8_terms) python3 bench/multi_gpu.py --mode sp --ranks 4 --weights fp8 --camera-terms 40 --skip-exact \
                  --fast-chunks 5 --warmup 1 --out "$OUT/sp_4gpu_only_fp8_terms.json" 2>&1 | grep -v "^Failed to load" | tail -4 ;;
        sp4_fp8) python3 bench/multi_gpu.py --mode sp --ranks 2 --ranks 4 --weights fp8 --exact-steps 2 --warmup 1 \
                  --out "$OUT/sp_4gpu_fp8.json" 2>&1 | grep -v "^Failed to load" | tail -5 ;;
        # The exact path on 2 and 4 GPUs (nvidia-h100-x4): a whole 40-step 480x832x81 video per group size
        # (the start frame encoded, both experts resident, the decode; fp8 weights), and 720x1280x81 steps on four.
        exact_video4) ensure_vae; python3 bench/multi_gpu.py --mode sp --ranks 2 --ranks 4 --weights fp8 --skip-fast \
                  --exact-steps 2 --warmup 1 --exact-video "${VIDEO_STEPS:-40}" --vae "$VAEPKG/Wan2.1_VAE.pth" \
                  --out "$OUT/sp_4gpu_fp8_exact_video.json" 2>&1 | grep -v "^Failed to load" | tail -4 ;;
        exact720_4) python3 bench/multi_gpu.py --mode sp --ranks 4 --weights fp8 --skip-fast --size 720x1280 \
                  --exact-steps 2 --warmup 1 --out "$OUT/sp_4gpu_fp8_exact_720x1280.json" 2>&1 | grep -v "^Failed to load" | tail -4 ;;
        placements2) ensure_package; python3 bench/multi_gpu.py --package "$PKG" --size 480x832 --frames 81 --steps 4 \
                  --out "$OUT/multi_gpu_480x832x81_4steps.json" 2>&1 | grep -v "^Failed to load" | tail -4 ;;
        gpumulti) python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_placements.py \
                  tests/gpu/test_sequence_parallel_gpu.py tests/unit/test_placement.py -m gpu 2>&1 | tail -30 ;;
        # A real ComfyUI server on two GPUs (nvidia-h100-x2): the Fast clip template and Play on devices=sequence_parallel
        # queued over HTTP, a worker killed mid-session, POST /free back to every GPU's idle level, no worker left
        # after shutdown (tests/gpu/test_server_two_gpus.py, ~3 min). Carry .whl2 .whl_server .bench_host, built
        # here by `bash bench/server_carry.sh` (ComfyUI 0.3.75 trimmed, the wheels of its start-up imports; ~56 MiB
        # with the tree). Only the wheels whose module the machine lacks are installed. Log and server log in $OUT.
        server2) server_wheels
                 nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader; nvidia-smi topo -m | head -4
                 LINGBOT_COMFY_ROOT="$PWD/.bench_host" LINGBOT_TEST_ARTIFACTS="$OUT/server2" timeout 560 \
                     python3 -m pytest -q -s -rfEs --tb=long -p no:cacheprovider -m gpu tests/gpu/test_server_two_gpus.py \
                     >"$OUT/server2.log" 2>&1
                 echo "pytest exit $?"; grep -v "^Failed to load" "$OUT/server2.log" | tail -40 ;;
        # The Play pieces of issue 26 on two GPUs: the VAE on the second GPU, the tiny live decoder on CUDA
        # (ComfyUI's sources from .bench_host), /free with expert_per_gpu on a real server (nvidia-h100-x2).
        gpuplay2) server_wheels
                  LINGBOT_COMFY_ROOT="$PWD/.bench_host" python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -m gpu \
                      tests/gpu/test_fast_overlap_cuda.py tests/gpu/test_tiny_vae_cuda.py 2>&1 | grep -v "^Failed to load" | tail -12
                  LINGBOT_COMFY_ROOT="$PWD/.bench_host" LINGBOT_TEST_ARTIFACTS="$OUT/server2" timeout "${SERVER_TIMEOUT:-300}" \
                      python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -m gpu tests/gpu/test_server_two_gpus.py \
                      -k expert_per_gpu >"$OUT/server2_expert_per_gpu.log" 2>&1
                  echo "server test exit $?"; grep -v "^Failed to load" "$OUT/server2_expert_per_gpu.log" | tail -15 ;;
        gpulog) python3 -m pytest -q -rfE --tb=long -p no:cacheprovider -m gpu tests/unit tests/gpu >"$OUT/gputests.log" 2>&1
                tail -25 "$OUT/gputests.log" ;;  # the whole log comes back as a file
        gputests) python3 -m pytest -q -p no:cacheprovider --tb=short -m gpu tests/unit $(ls -d tests/gpu 2>/dev/null) 2>&1 | tail -40 ;;
        preview) python3 bench/preview_cost.py --comfy .bench_host --out "$OUT/preview_cost_480p.json" 2>&1 | grep -v "^WARNING" | tail -4 ;;
        nonfinite) python3 bench/nonfinite_cost.py --out "$OUT/nonfinite_cost.json" 2>&1 | tail -4 ;;
        vae480) python3 bench/vae_precision.py --cases 480p --out "$OUT/vae_precision_480p.json" 2>&1 | tail -4 ;;
        vae720) python3 bench/vae_precision.py --cases 720p --out "$OUT/vae_precision_720p.json" 2>&1 | tail -4 ;;
        small8)  # the smallest card: 8 GB, text encoder on the CPU, block swap, sequential CFG
            bench pipeline --size 480x832 --frames 81 --steps 4 --vram-cap-gb 8 --block-swap "${SWAP_BLOCKS:-4}" \
                --no-batch-cfg --text-device cpu --decode-tile 32 --image "$CAM/image.jpg" --camera-dir "$CAM" \
                --out "$OUT/p480_cap8_swap_seqcfg.json" ;;
        p720) bench pipeline --size 720x1280 --frames 81 --steps 3 --vram-cap-gb 24 --kernel-floor --decode-tile 32 \
                  --image "$CAM/image.jpg" --camera-dir "$CAM" --out "$OUT/p720_cap24.json" ;;
        swap12) bench pipeline --size 480x832 --frames 81 --steps 4 --vram-cap-gb 12 --block-swap "${SWAP_BLOCKS:-20}" \
                  --kernel-floor --image "$CAM/image.jpg" --camera-dir "$CAM" --out "$OUT/p480_cap12_swap.json" ;;
        frames) for f in 41 161; do
                    bench pipeline --size 480x832 --frames $f --steps 3 --vram-cap-gb 24 --kernel-floor \
                        --image "$CAM/image.jpg" --camera-dir "$CAM" --out "$OUT/p480_f${f}_cap24.json"
                done ;;
        long) ensure_package; python3 bench/long_video.py --package "$PKG" --frames 81 321 --steps "${LONG_STEPS:-3}" \
                  --vram-cap-gb 24 --image "$CAM/image.jpg" --out "$OUT/long_video_81_321_cap24.json" 2>&1 | tail -4 ;;
        long961) ensure_package; python3 bench/long_video.py --package "$PKG" --frames 961 --steps "${LONG_STEPS:-3}" \
                  --vram-cap-gb 24 --image "$CAM/image.jpg" --out "$OUT/long_video_961_cap24.json" 2>&1 | tail -4 ;;
        longkeep) ensure_package; python3 bench/long_video.py --package "$PKG" --frames 321 --steps "${LONG_STEPS:-3}" \
                  --keep-experts --vram-cap-gb 24 --image "$CAM/image.jpg" --out "$OUT/long_video_321_cap24_keep_experts.json" 2>&1 | tail -4 ;;
        # LingBot-World Fast (window 9 + sink 3) under a 24 GiB cap: the clip with the image encoded first
        # (as VAE Encode before the Fast Sampler) in bf16 and int8, the official full cache uncapped, and the
        # 957-frame stream as Fast Long Video runs it (int8, condition prefetched, each chunk decoded as it comes).
        fast81) fast --frames 81 --prefetch-y --no-clip --vram-cap-gb 24 --out "$OUT/fast_81_w9s3_bf16_cap24_prefetch.json" ;;
        fast81_int8) fast --frames 81 --kv-dtype int8 --vram-cap-gb 24 --out "$OUT/fast_81_w9s3_int8_cap24.json" ;;
        fast81_full) fast --frames 81 --kv-window 0 --no-clip --out "$OUT/fast_81_full_bf16.json" ;;
        # 8-bit weights (issue 25): the per-layer microbench at a chunk's 4,680 tokens, then the Fast clip's chunk
        # loop with the transformer in fp8 / int8 (converted on load from the NF4 package; ~18.5 GB) beside the
        # bf16 and fp8 floors of the same run, under a 24 GiB cap with 20 blocks on the GPU (fp8 needs block swap
        # there) and uncapped.
        attn_backends) python3 bench/attention_backends.py --out "$OUT/attention_backends.json" 2>&1 | grep -v "^Failed to load" | tail -6 ;;
        gemm8) python3 bench/gemm8.py --out "$OUT/gemm8_4680.json" 2>&1 | grep -v "^Failed to load" ;;
        fast81_fp8) fast --frames 81 --prefetch-y --no-clip --weights fp8 --out "$OUT/fast_81_w9s3_bf16_fp8w.json" ;;
        # Kept camera terms (wan/runtime/camera_terms.py): each block's camera scale/shift once a chunk, not per
        # forward; the floors of the same run count the camera layers once a chunk too.
        fast81_fp8_terms) fast --frames 81 --prefetch-y --no-clip --weights fp8 --camera-terms 40 \
                     --out "$OUT/fast_81_w9s3_bf16_fp8w_terms.json" ;;
        fast81_terms) fast --frames 81 --prefetch-y --no-clip --camera-terms 40 --out "$OUT/fast_81_w9s3_bf16_nf4_terms.json" ;;
        play60_fp8_terms) play --size 480x832 --seconds 60 --kv-dtype bf16 --vae-precision bf16 --weights fp8 \
                     --camera-terms 40 --pipeline overlap --out "$OUT/play60_${PLAY_TAG:-both}_bf16kv_bf16vae_fp8w_terms.json" ;;
        # CUDA graphs of the Fast passes (FastParams.cuda_graphs): the GPU tests, a 201-frame walk (17 chunks:
        # 2 fill the cache, 2 capture, 13 replay) with and without, Play with them; several GPUs below
        fp8gemm) python3 bench/fp8_gemm.py --out "$OUT/fp8_gemm.json" 2>&1 | grep -v "^Failed to load" | tail -9 ;;
        cgraphs) python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -m gpu tests/gpu/test_cuda_graphs_cuda.py 2>&1 | tail -15 ;;
        fast201_fp8_terms) fast --frames 201 --prefetch-y --no-clip --weights fp8 --camera-terms 40 \
                     --out "$OUT/fast_201_w9s3_bf16_fp8w_terms.json" ;;
        fast201_fp8_terms_graphs) fast --frames 201 --prefetch-y --no-clip --weights fp8 --camera-terms 40 --cuda-graphs \
                     --out "$OUT/fast_201_w9s3_bf16_fp8w_terms_graphs.json" ;;
        play60_fp8_terms_graphs) play --size 480x832 --seconds 60 --kv-dtype bf16 --vae-precision bf16 --weights fp8 \
                     --camera-terms 40 --cuda-graphs --pipeline overlap \
                     --out "$OUT/play60_${PLAY_TAG:-both}_bf16kv_bf16vae_fp8w_terms_graphs.json" ;;
        sp2_fp8_terms_graphs) python3 bench/multi_gpu.py --mode sp --ranks 2 --weights fp8 --camera-terms 40 --skip-exact \
                  --cuda-graphs --fast-chunks 10 --warmup 4 --out "$OUT/sp_2gpu_fp8_terms_graphs.json" 2>&1 \
                  | grep -v "^Failed to load" | tail -4 ;;
        sp4_fp8_terms_graphs) python3 bench/multi_gpu.py --mode sp --ranks 2 --ranks 4 --weights fp8 --camera-terms 40 \
                  --skip-exact --cuda-graphs --fast-chunks 10 --warmup 4 --out "$OUT/sp_4gpu_fp8_terms_graphs.json" 2>&1 \
                  | grep -v "^Failed to load" | tail -5 ;;
        # The sequence-parallel Fast chunk with the k/v/q exchanges overlapping the projections (the default) and
        # waited for one by one (LINGBOT_SP_OVERLAP=0), on 2 GPUs (and 4 where there are), each beside one GPU.
        sp_overlap_ab) ranks=(--ranks 2); (( $(nvidia-smi -L | wc -l) >= 4 )) && ranks+=(--ranks 4)
                  for o in 0 1; do
                      LINGBOT_SP_OVERLAP=$o python3 bench/multi_gpu.py --mode sp "${ranks[@]}" --weights fp8 --camera-terms 40 \
                          --skip-exact --cuda-graphs --fast-chunks 10 --warmup 4 \
                          --out "$OUT/sp_fast_fp8_terms_graphs_overlap$o.json" 2>&1 | grep -v "^Failed to load" | tail -5
                  done ;;
        # FlashAttention 3 (carry .whl3): the kernels at the model's shapes (bf16 and fp8 with the per-head
        # quantization, each against float32), their GPU tests, and the Fast chunk on one and two GPUs with fp8
        # attention (flash_fp8) and FA3 in bf16 (flash), fp8 linears, terms kept, graphs.
        fa3_attn) python3 bench/attention_backends.py --out "$OUT/attention_backends_fa3.json" 2>&1 \
                  | grep -v "^Failed to load" | tail -6 ;;
        fa3_gputests) python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -m gpu tests/gpu/test_attention_fp8_cuda.py \
                  "tests/gpu/test_weights8_cuda.py::test_cuda_attention_rows" 2>&1 | grep -v "^Failed to load" | tail -12 ;;
        sp2_flash_fp8|sp2_flash) attention=${what#sp2_}
                  LINGBOT_ATTENTION=$attention python3 bench/multi_gpu.py --mode sp --ranks 2 --weights fp8 --camera-terms 40 \
                      --skip-exact --cuda-graphs --fast-chunks 10 --warmup 4 \
                      --out "$OUT/sp_2gpu_fp8_terms_graphs_$attention.json" 2>&1 | grep -v "^Failed to load" | tail -4 ;;
        # One GPU's Fast chunk under each attention kernel, same weights and noise: time and deviation.
        fast_attn_compare) python3 bench/multi_gpu.py --mode sp --weights fp8 --camera-terms 40 --cuda-graphs \
                  --fast-chunks 10 --warmup 4 --attention-compare "${ATTENTIONS:-sdpa,flash,flash_fp8}" \
                  --out "$OUT/fast_1gpu_fp8w_terms_graphs_attention.json" 2>&1 | grep -v "^Failed to load" | tail -4 ;;
        # Play on two GPUs with FlashAttention 3 (carry .site_xz .whl_server .bench_host .bench_data): the tiny
        # live decoder, PLAY_MODES (continuous by default), ATTENTION flash (bf16) or flash_fp8.
        play60_sp2_fa3) LINGBOT_ATTENTION=${ATTENTION:-flash} play_syn --ranks 2 --seconds 60 \
                  --modes "${PLAY_MODES:-continuous}" --decoders tiny \
                  --out "$OUT/play60_sp2_fp8w_${ATTENTION:-flash}_tiny_${PLAY_TAG:-continuous}.json" ;;
        gpusp) python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -m gpu tests/gpu/test_sequence_parallel_gpu.py \
                  tests/gpu/test_cuda_graphs_cuda.py tests/gpu/test_weights8_cuda.py 2>&1 | grep -v "^Failed to load" | tail -15 ;;
        sp2_fp8_terms_graphs_profile) python3 bench/multi_gpu.py --mode sp --ranks 2 --weights fp8 --camera-terms 40 \
                  --skip-exact --cuda-graphs --fast-chunks 6 --warmup 4 --profile \
                  --out "$OUT/sp_2gpu_fp8_terms_graphs_profile.json" >"$OUT/sp_2gpu_graphs_profile.log" 2>&1
                  tail -45 "$OUT/sp_2gpu_graphs_profile.log" ;;
        gpu8) python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -m gpu tests/gpu/test_weights8_cuda.py 2>&1 | tail -15 ;;
        fast81_int8w) fast --frames 81 --prefetch-y --no-clip --weights int8 --out "$OUT/fast_81_w9s3_bf16_int8w.json" ;;
        fast81_fp8_cap24) fast --frames 81 --prefetch-y --no-clip --weights fp8 --kv-dtype int8 --vram-cap-gb 24 \
                     --blocks-on-gpu "${SWAP_BLOCKS:-20}" --out "$OUT/fast_81_w9s3_int8_fp8w_cap24_swap.json" ;;
        fast957_fp8) fast --frames 957 --kv-dtype int8 --stream-decode --prefetch-y --no-clip --weights fp8 \
                     --out "$OUT/fast_957_w9s3_int8_fp8w_stream_prefetch.json" ;;
        # The 8-bit kinds' drift from bf16 (the NF4 weights dequantized) on one seed over a 957-frame walk:
        # relative latent error per chunk (bench/weights_deviation.py); one kind per call (~5 min each).
        dev957_fp8|dev957_int8) ensure_package; python3 bench/weights_deviation.py --package "$PKG" --image "$CAM/image.jpg" \
                     --frames 957 --kv-dtype int8 --kinds bf16 "${what#dev957_}" \
                     --out "$OUT/weights_deviation_957_${what#dev957_}.json" 2>&1 | grep -v "^Failed to load" | tail -3 ;;
        fast957) fast --frames 957 --kv-dtype int8 --stream-decode --prefetch-y --no-clip --vram-cap-gb 24 \
                     --out "$OUT/fast_957_w9s3_int8_cap24_stream_prefetch.json" ;;
        # LingBot-World Play as the node runs it on a 24 GB card: int8 cache, bf16 VAE streams.
        play30_cap24) play --size 480x832 --seconds 30 --vram-cap-gb 24 --kv-dtype int8 --vae-precision bf16 \
                          --out "$OUT/play30_${PLAY_TAG:-both}_cap24_int8_bf16vae.json" ;;
        play30_fp8_auto24) play --size 480x832 --seconds 30 --vram-cap-gb 24 --memory auto --pipeline overlap \
                          --vae-precision bf16 --weights fp8 --out "$OUT/play30_${PLAY_TAG:-both}_auto24_fp8w.json" ;;
        play20_fp8_pipes) for p in ${PIPES:-overlap sequential}; do  # no cap: fp8 weights (18.5 GB), bf16 cache
                play --size 480x832 --seconds 20 --kv-dtype bf16 --vae-precision bf16 --weights fp8 --pipeline "$p" \
                     --out "$OUT/play20_${PLAY_TAG:-both}_fp8w_bf16kv_$p.json"; done ;;
        # Play on one 24 GB card as issue 25 asks: fp8 weights, the nodes' memory plan for a 24 GiB cap, ComfyUI's
        # tiny video VAE as the live decoder (carry .whl2 .whl_server .bench_host .bench_data).
        play60_fp8_auto24_tiny) server_wheels
                  play --size 480x832 --seconds 60 --vram-cap-gb 24 --memory auto --pipeline overlap --vae-precision bf16 \
                      --weights fp8 --cuda-graphs --decoders tiny --comfy .bench_host \
                      --out "$OUT/play60_${PLAY_TAG:-both}_auto24_fp8w_tiny.json" ;;
        # Block swap and the int8 cache under a 24 GiB cap: the copy rate of one fp8 block and the int8 dequantization
        # (bench/swap_rates.py); the Fast chunk per SWAP_VARIANTS blocks_on_gpu:camera_terms:spread (spread 0: the
        # swapped blocks in a row, LINGBOT_SWAP_SPREAD=0); the GPU tests of the swap schedule and the int8 kernel.
        swap_rates) python3 bench/swap_rates.py --out "$OUT/swap_rates.json" 2>&1 | grep -v "^Failed to load" | tail -2 ;;
        swap_ab) for v in ${SWAP_VARIANTS:-31:4:1 31:4:0 21:40:1}; do
                     IFS=: read -r b t s <<<"$v"
                     LINGBOT_SWAP_SPREAD=$s fast --frames 81 --prefetch-y --no-clip --weights fp8 --kv-dtype int8 \
                         --vram-cap-gb 24 --blocks-on-gpu "$b" --camera-terms "$t" \
                         --out "$OUT/fast_81_int8_fp8w_cap24_swap${b}_terms${t}_spread${s}.json"
                 done ;;
        # The cache's kept fp8 attention operands (flash_fp8): the kernel and sessions against casting every pass,
        # eager and graphed; then one GPU's Fast chunk with FA3 bf16, fp8 casting every pass, fp8 kept, with
        # the fp8 floor measured in the same process (carry .site_xz: FlashAttention 3).
        gpu_kept) python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -m gpu tests/gpu/test_kv_cache_cuda.py \
                   tests/gpu/test_cuda_graphs_cuda.py tests/gpu/test_attention_fp8_cuda.py 2>&1 \
                   | grep -v "^Failed to load" | tail -12 ;;
        fast_kept) python3 bench/multi_gpu.py --mode sp --ranks 1 --weights fp8 --camera-terms 40 --cuda-graphs --steps "${STEPS:-4}" \
                  --fast-chunks 10 --warmup 4 --attention-compare "${ATTENTIONS:-flash,flash_fp8:cast,flash_fp8}" \
                  --out "$OUT/fast_1gpu_fp8w_terms_graphs_kept_fp8_operands_steps${STEPS:-4}.json" 2>&1 | grep -v "^Failed to load" | tail -5 ;;
        gpu25) python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -m gpu tests/gpu/test_kv_cache_cuda.py \
                   tests/unit/test_block_swap.py tests/gpu/test_cuda_graphs_cuda.py 2>&1 | grep -v "^Failed to load" | tail -12 ;;
        play60_fp8) play --size 480x832 --seconds 60 --kv-dtype int8 --vae-precision bf16 --weights fp8 \
                          --out "$OUT/play60_${PLAY_TAG:-both}_int8_bf16vae_fp8w.json" ;;
        play60_cap24) play --size 480x832 --seconds 60 --vram-cap-gb 24 --kv-dtype int8 --vae-precision bf16 \
                          --out "$OUT/play60_${PLAY_TAG:-both}_cap24_int8_bf16vae.json" ;;
        # Chunk n decoded beside chunk n+1 (issue 25 item 3): Fast Long Video's own path, 957 frames, int8 cache,
        # bf16 VAE, 24 GiB cap, overlapped and sequential in the same call; Play (PLAY_MODES picks the mode).
        fast957_pipe) for p in ${PIPES:-overlap sequential}; do
                          fast --frames 957 --kv-dtype int8 --pipeline $p --vae-precision bf16 --no-clip --vram-cap-gb 24 \
                              --out "$OUT/fast_957_w9s3_int8_cap24_${p}.json"
                      done ;;
        play60_pipe) for p in ${PIPES:-overlap sequential}; do
                         play --size 480x832 --seconds 60 --vram-cap-gb 24 --kv-dtype int8 --vae-precision bf16 \
                             --pipeline $p --out "$OUT/play60_${PLAY_TAG:-both}_cap24_int8_bf16vae_${p}.json"
                     done ;;
        # 16 and 12 GB cards (issue 25 item 4): the settings the nodes' auto takes for the cap (kv dtype, blocks on
        # the GPU, overlap: pipeline.memory.plan_fast_memory, printed and in the JSON's memory_plan).
        fast81_cap16|fast81_cap12) cap=${what#fast81_cap}
                      fast --frames 81 --prefetch-y --no-clip --memory auto --vram-cap-gb $cap \
                          --out "$OUT/fast_81_w9s3_auto_cap${cap}.json" ;;
        fast957_cap16|fast957_cap12) cap=${what#fast957_cap}
                      fast --frames 957 --pipeline overlap --memory auto --vae-precision bf16 --no-clip \
                          --vram-cap-gb $cap --out "$OUT/fast_957_w9s3_auto_cap${cap}.json" ;;
        play60_tiny_cap16|play60_tiny_cap12) cap=${what#play60_tiny_cap}; server_wheels  # Play's live decoder
                      play --size 480x832 --seconds 60 --memory auto --vae-precision bf16 --vram-cap-gb $cap \
                          --decoders tiny --comfy .bench_host --out "$OUT/play60_${PLAY_TAG:-both}_tiny_auto_cap${cap}.json" ;;
        play60_cap16|play60_cap12) cap=${what#play60_cap}
                      play --size 480x832 --seconds 60 --memory auto --vae-precision bf16 --vram-cap-gb $cap \
                          --out "$OUT/play60_${PLAY_TAG:-both}_auto_cap${cap}.json" ;;
        # Play on two GPUs (issue 26): sequence parallel, the Wan VAE or the tiny live decoder; one GPU with the
        # tiny decoder; the transformer on one GPU and the Wan VAE's decode on the other; sequence parallel with
        # the decode on the second GPU (nvidia-h100-x2; carry .whl2 .whl_server .bench_host .bench_data).
        # LingBot-World Play measured at a client (issue 37): the test host (.bench_host) with the pack, the Play
        # template over HTTP, keys through the Play routes, frames timed on the websocket; a 60 s continuous session
        # then 20 turn-based presses in the same server. One call each (a package is written once per machine, by its
        # own call: fast_package ~2 min, fast_package_fp8 ~6 min). Carry .whl2 .whl_server .bench_host .bench_data
        # (.site_xz instead of .whl2 for FlashAttention 3).
        #   bash bench/run_device.sh fast_package; STEPS=2 bash bench/run_device.sh play_client
        #   CLIENT_ARGS="--vram-cap-gb 24" bash bench/run_device.sh play_client
        #   bash bench/run_device.sh fast_package_fp8; bash bench/run_device.sh play_client_fp8
        fast_package) ensure_fast_package ;;
        fast_package_fp8) ensure_fp8_package; du -sh "$FP8PKG"/* ;;
        play_client) ensure_fast_package
                  play_client --package "$FASTPKG" --weights fp8 --sessions "${CLIENT_SESSIONS:-continuous,turn}" \
                      --seconds "${CLIENT_SECONDS:-60}" \
                      --out "$OUT/play_client_steps${STEPS:-4}${CLIENT_TAG:-}.json" ;;
        play_client_fp8) ensure_fp8_package
                  play_client --package "$FP8PKG" --sessions "${CLIENT_SESSIONS:-continuous}" --seconds "${CLIENT_SECONDS:-20}" \
                      --out "$OUT/play_client_fp8_package_steps${STEPS:-4}${CLIENT_TAG:-}.json" ;;
        play60_sp2) play_syn --ranks 2 --seconds 60 --modes "${PLAY_MODES:-turn,continuous}" --decoders "${DECODERS:-wan,tiny}" \
                        --out "$OUT/play60_sp2_fp8w_terms_graphs.json" ;;
        play30_sp1_tiny) play_syn --ranks 1 --seconds 30 --modes "${PLAY_MODES:-continuous}" --decoders tiny \
                        --out "$OUT/play30_sp1_fp8w_terms_graphs_tiny.json" ;;
        # The generation on a highest-priority stream beside the tiny decode, on and off in one process.
        play20_sp2_tiny_priority) play_syn --ranks 2 --seconds 20 --modes continuous --decoders tiny --stream-priority on,off \
                        --out "$OUT/play20_sp2_fp8w_terms_graphs_tiny_priority.json" ;;
        play30_sp1_vae1) play_syn --ranks 1 --seconds 30 --modes "${PLAY_MODES:-continuous}" --decoders wan --vae-device cuda:1 \
                        --out "$OUT/play30_sp1_fp8w_terms_graphs_vae_cuda1.json" ;;
        play30_sp2_vae1) play_syn --ranks 2 --seconds 30 --modes "${PLAY_MODES:-continuous}" --decoders wan --vae-device cuda:1 \
                        --out "$OUT/play30_sp2_fp8w_terms_graphs_vae_cuda1.json" ;;
        attn) python3 bench/attention_error.py --size 480x832 --frames 81 --out "$OUT/attention_480p.json" 2>&1 \
                  | grep -v "^Failed to load" ;;
        ttv_exact|ttv_fast|ttv_light|ttv_exact_light)  # time to video, 40 steps; the exact row is the reference of the others
            ensure_package
            REF=/dev/shm/ttv_ref_${TTV_STEPS:-40}
            TTV=(python3 bench/time_to_video.py --package "$PKG" --steps "${TTV_STEPS:-40}" --vram-cap-gb 24 --image "$CAM/image.jpg"
                 --camera-dir "$CAM" --out-dir "$OUT/ttv")
            case "$what" in
                ttv_exact) "${TTV[@]}" --variant exact --save-reference "$REF" 2>&1 | tail -2 ;;
                ttv_exact_light) "${TTV[@]}" --variant exact --save-reference "$REF" \
                              --variant light4=preset=lightning_4step,attention=auto \
                              --variant light4_bf16vae=preset=lightning_4step,attention=auto,vae=bf16 2>&1 | tail -4 ;;
                ttv_fast) "${TTV[@]}" --reference "$REF" \
                              --variant ec005_trunc02_auto=cache=0.05,cfg_truncate=0.2,attention=auto 2>&1 | tail -3 ;;
                ttv_light) "${TTV[@]}" --reference "$REF" --synthetic-lora /dev/shm/synthetic_lora_r64.safetensors \
                              --variant light4_lora=preset=lightning_4step,lora=/dev/shm/synthetic_lora_r64.safetensors,attention=auto \
                              --variant light4_lora_bf16vae=preset=lightning_4step,lora=/dev/shm/synthetic_lora_r64.safetensors,attention=auto,vae=bf16 2>&1 | tail -3 ;;
            esac ;;
        # The exact 40-step 480x832x81 video with fp8 GEMMs (made on load from the NF4 package) beside the exact
        # one (bf16 products), uncapped; each saved in /dev/shm (latent.pt also in $OUT), one GPU each
        # (CUDA_VISIBLE_DEVICES) side by side or one after the other; ttv_compare: the fp8 one's deviation.
        ttv_save_exact|ttv_save_fp8) name=${what#ttv_save_}; variant=exact; [[ $name == exact ]] || variant="$name=weights=$name"
                  ensure_package
                  python3 bench/time_to_video.py --package "$PKG" --steps "${TTV_STEPS:-40}" --image "$CAM/image.jpg" \
                      --camera-dir "$CAM" --out-dir "$OUT/ttv" --variant "$variant" --save-reference "/dev/shm/ttv_$name" \
                      2>&1 | grep -v "^Failed to load" | tail -2
                  mkdir -p "$OUT/ttv_$name" && cp /dev/shm/ttv_$name/latent.pt /dev/shm/ttv_$name/name.txt "$OUT/ttv_$name/" ;;
        ttv_compare) python3 bench/ttv_compare.py /dev/shm/ttv_exact /dev/shm/ttv_fp8 --out "$OUT/ttv_fp8_vs_exact.json" ;;
        *) echo "unknown benchmark $what" ;;
    esac
done
