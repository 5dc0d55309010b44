"""The modes of ``bench/run_device.sh`` as data: one row per mode, naming the section of
bench/RESULTS.md whose figures it reproduces. Adding a mode is adding one row to MODES.

    python bench/modes.py list              every mode: GPUs, what to carry, the section it backs
    python bench/modes.py command NAME      a mode's bash command (what run_device.sh evaluates)
    python bench/modes.py check NAME...     exit 2 naming the names that are not modes

A command is bash that run_device.sh evaluates after its set-up, so it may use what that set-up
defines: ``$OUT`` (where the JSON goes), ``$PKG`` (the synthetic a14b NF4 package), ``$CAM``
(the start image and poses in .bench_data/), ``$VAEPKG``, ``$FASTPKG`` and ``$FP8PKG`` (the
client bench's Fast packages), ``$PLAY_TAG``, and the functions ``ensure_package``,
``ensure_vae``, ``ensure_fast_package``, ``ensure_fp8_package``, ``server_wheels``, ``bench``,
``fast``, ``play``, ``play_syn``, ``play_client``, ``multi``, ``gpu_pytest``, ``long_video``,
``ttv`` and ``ttv_save``. The environment variables a command reads (``PLAY_MODES``, ``PIPES``,
``SWAP_VARIANTS``, ``ATTENTIONS``, ``STEPS``, ``CLIENT_ARGS``, ...) have their defaults written in
it. ``carry``: the ignored paths beside the checkout that the command reads (the header of
run_device.sh says how each is made). Only the standard library is imported here.
"""
from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    name: str
    section: str  # a "## " heading of bench/RESULTS.md, without the "## "
    command: str  # bash, evaluated by run_device.sh
    gpus: int = 1  # GPUs the command needs on the machine
    carry: tuple[str, ...] = ()


# The sections of bench/RESULTS.md the modes back (its headings, newest first).
HOW_TO = "How to run these benchmarks"
KEPT_FP8 = "2026-11-28, one and two H200s: fp8 keys and values kept between a chunk's passes"
SWAP_PLAN = ("2026-11-28, one H100 and two H200s: block swap that hides its copies, Play's memory plan with the "
             "live decoder, 12 GiB caps, the exact video in fp8")
FA3 = ("2026-11-28, two H100s (one run on two H200s): FlashAttention 3 in bf16 and fp8, real-time Play on "
       "two GPUs")
FOUR_H100 = "2026-11-28, four H100s: whole exact videos on 2 and 4 GPUs, the exchanges overlapped"
PLAY_TWO = ("2026-11-27, one H100, two H100s and two H200s: Play on two GPUs, the live decoder, the drift walk, "
            "16 GiB caps")
GRAPHS = ("2026-11-27, one H100, two and four H200s: CUDA graphs, fp8 fast accumulation, Play's frames sent per "
          "latent frame")
TERMS = ("2026-11-27, one H100, two and four H200s: kept camera terms, 16 and 12 GiB caps, a server on two "
         "GPUs")
EIGHT_BIT = "2026-11-27, four H200s: 8-bit weights, the decode overlapped, sequence parallel"
FAST_24 = "2026-11-24, one H100: LingBot-World Fast and Play under a 24 GiB cap"
BASE_23 = "2026-11-23, one H100: time to video, the step cache, small cards, long videos, checks"
BASE_22 = "2026-11-22, one H100: 480×832×81 and other sizes"
BLOCK = "2026-11-22, one H100: where a block's time went, and what changed"
LOADING = "2026-11-22, one H100: loading one NF4 expert (8.9 GB file) to the GPU"
SOAK = ("2026-11-22, one H100: soak (5 whole runs, 240×416×17, 4 steps, prompt changed every run so T5 "
        "reloads)")
GPU_TESTS = "2026-11-22 to 2026-11-24, one H100: GPU tests"

# What the commands read beside the checkout.
NF4 = (".whl", ".bench_data")  # bitsandbytes (the NF4 package), the start image and poses
MP4 = (".whl2", ".bench_data")  # bitsandbytes and PyAV (Play writes its .mp4)
HOST = (".whl2", ".whl_server", ".bench_host", ".bench_data")  # + ComfyUI's sources and their start-up wheels
FA3_HOST = (".site_xz", ".whl_server", ".bench_host", ".bench_data")  # HOST with FlashAttention 3
FA3_WHEELS = (".whl3",)  # bitsandbytes and FlashAttention 3's forward-only wheel

_FP8_TERMS = "--weights fp8 --camera-terms 40"  # fp8 linears, every block's camera terms kept for a chunk
_GRAPHED = "--cuda-graphs --fast-chunks 10 --warmup 4"  # the Fast passes as CUDA graphs, 10 chunks after 4
_PLAY60_FP8 = f"--size 480x832 --seconds 60 --kv-dtype bf16 --vae-precision bf16 {_FP8_TERMS}"
_TTV_REF = '--save-reference "/dev/shm/ttv_ref_${TTV_STEPS:-40}"'
_TTV_LORA = "/dev/shm/synthetic_lora_r64.safetensors"

MODES: tuple[Mode, ...] = (
    # ---- general
    Mode("package", HOW_TO, "ensure_package", carry=(".whl",)),
    # Play at a client of a real ComfyUI server (bench/play_client.py); STEPS, CLIENT_ARGS, CLIENT_TAG
    Mode("fast_package", HOW_TO, "ensure_fast_package", carry=(".whl2",)),
    Mode("fast_package_fp8", HOW_TO, 'ensure_fp8_package; du -sh "$FP8PKG"/*', carry=(".whl2",)),
    Mode("play_client", HOW_TO, 'ensure_fast_package; play_client --package "$FASTPKG" --weights fp8 '
         '--sessions "${CLIENT_SESSIONS:-continuous,turn}" --seconds "${CLIENT_SECONDS:-60}" '
         '--out "$OUT/play_client_steps${STEPS:-4}${CLIENT_TAG:-}.json"', carry=FA3_HOST),
    # each part of a Fast run measured beside the memory plan's estimate (bench/memory_fit.py)
    Mode("memory_fit", HOW_TO, 'ensure_vae; python3 bench/memory_fit.py --synthetic a14b --weights fp8 '
         '--vae "$VAEPKG/Wan2.1_VAE.pth" --comfy .bench_host --cuda-graphs --attention "${ATTENTION:-flash_fp8}" '
         '--out "$OUT/memory_fit.json" 2>&1 | grep -v "^Failed to load" | tail -3', carry=FA3_HOST),
    Mode("play_client_fp8", HOW_TO, 'ensure_fp8_package; play_client --package "$FP8PKG" '
         '--sessions "${CLIENT_SESSIONS:-continuous}" --seconds "${CLIENT_SECONDS:-20}" '
         '--out "$OUT/play_client_fp8_package_steps${STEPS:-4}${CLIENT_TAG:-}.json"', carry=FA3_HOST),
    Mode("gputests", GPU_TESTS, "gpu_pytest -m gpu tests/unit $(ls -d tests/gpu 2>/dev/null) | tail -40",
         carry=(".whl2",)),
    Mode("gpulog", EIGHT_BIT, 'gpu_pytest -rfE --tb=long -m gpu tests/unit tests/gpu >"$OUT/gputests.log" 2>&1; '
         'tail -25 "$OUT/gputests.log"', carry=(".whl2",)),
    # ---- 2026-11-22: the exact path, loading, the block, soak
    Mode("block", BLOCK, 'python3 bench/block_profile.py --out "$OUT/block_profile.json" 2>&1 | grep -v "^Failed to load"'),
    Mode("load", BASE_23, 'bench load-expert --out "$OUT/load_expert.json"', carry=NF4),
    Mode("naive", LOADING, 'bench naive-load --out "$OUT/naive_load.json"', carry=NF4),
    Mode("p480", BASE_22, 'bench pipeline --size 480x832 --frames 81 --steps 4 --vram-cap-gb 24 --kernel-floor '
         '--image "$CAM/image.jpg" --camera-dir "$CAM" --out "$OUT/p480_cap24.json"', carry=NF4),
    Mode("p480seq", BASE_22, 'bench pipeline --size 480x832 --frames 81 --steps 4 --vram-cap-gb 24 --kernel-floor '
         '--no-batch-cfg --image "$CAM/image.jpg" --camera-dir "$CAM" --out "$OUT/p480_cap24_sequential_cfg.json"',
         carry=NF4),
    Mode("swap12", BASE_22, 'bench pipeline --size 480x832 --frames 81 --steps 4 --vram-cap-gb 12 --block-swap '
         '"${SWAP_BLOCKS:-20}" --kernel-floor --image "$CAM/image.jpg" --camera-dir "$CAM" '
         '--out "$OUT/p480_cap12_swap.json"', carry=NF4),
    Mode("p720", BASE_22, 'bench pipeline --size 720x1280 --frames 81 --steps 3 --vram-cap-gb 24 --kernel-floor '
         '--decode-tile 32 --image "$CAM/image.jpg" --camera-dir "$CAM" --out "$OUT/p720_cap24.json"', carry=NF4),
    Mode("frames", BASE_22, 'for f in 41 161; do bench pipeline --size 480x832 --frames $f --steps 3 --vram-cap-gb 24 '
         '--kernel-floor --image "$CAM/image.jpg" --camera-dir "$CAM" --out "$OUT/p480_f${f}_cap24.json"; done',
         carry=NF4),
    Mode("soak", SOAK, 'bench soak --size 240x416 --frames 17 --steps 4 --runs 5 --camera-dir "$CAM" '
         '--out "$OUT/soak_gpu.json"', carry=NF4),
    # ---- 2026-11-23: time to video, checks, small cards, long videos
    Mode("attn", BASE_23, 'python3 bench/attention_error.py --size 480x832 --frames 81 --out "$OUT/attention_480p.json" '
         '2>&1 | grep -v "^Failed to load"'),
    Mode("preview", BASE_23, 'python3 bench/preview_cost.py --comfy .bench_host --out "$OUT/preview_cost_480p.json" '
         '2>&1 | grep -v "^WARNING" | tail -4', carry=(".bench_host",)),
    Mode("nonfinite", BASE_23, 'python3 bench/nonfinite_cost.py --out "$OUT/nonfinite_cost.json" 2>&1 | tail -4'),
    Mode("vae480", BASE_23, 'python3 bench/vae_precision.py --cases 480p --out "$OUT/vae_precision_480p.json" 2>&1 '
         '| tail -4'),
    Mode("vae720", BASE_23, 'python3 bench/vae_precision.py --cases 720p --out "$OUT/vae_precision_720p.json" 2>&1 '
         '| tail -4'),
    Mode("small8", BASE_23, 'bench pipeline --size 480x832 --frames 81 --steps 4 --vram-cap-gb 8 --block-swap '
         '"${SWAP_BLOCKS:-4}" --no-batch-cfg --text-device cpu --decode-tile 32 --image "$CAM/image.jpg" '
         '--camera-dir "$CAM" --out "$OUT/p480_cap8_swap_seqcfg.json"', carry=NF4),
    Mode("long", BASE_23, 'long_video --frames 81 321 --out "$OUT/long_video_81_321_cap24.json"', carry=NF4),
    Mode("long961", BASE_23, 'long_video --frames 961 --out "$OUT/long_video_961_cap24.json"', carry=NF4),
    # time to video, 40 steps (TTV_STEPS); the exact run saves the reference the others are compared with
    Mode("ttv_exact", BASE_23, f'ttv --vram-cap-gb 24 --variant exact {_TTV_REF} 2>&1 | tail -2', carry=NF4),
    Mode("ttv_exact_light", BASE_23, f'ttv --vram-cap-gb 24 --variant exact {_TTV_REF} '
         '--variant light4=preset=lightning_4step,attention=auto '
         '--variant light4_bf16vae=preset=lightning_4step,attention=auto,vae=bf16 2>&1 | tail -4', carry=NF4),
    Mode("ttv_fast", BASE_23, 'ttv --vram-cap-gb 24 --reference "/dev/shm/ttv_ref_${TTV_STEPS:-40}" '
         '--variant ec005_trunc02_auto=cache=0.05,cfg_truncate=0.2,attention=auto 2>&1 | tail -3', carry=NF4),
    Mode("ttv_light", BASE_23, f'ttv --vram-cap-gb 24 --reference "/dev/shm/ttv_ref_${{TTV_STEPS:-40}}" '
         f'--synthetic-lora {_TTV_LORA} --variant light4_lora=preset=lightning_4step,lora={_TTV_LORA},attention=auto '
         f'--variant light4_lora_bf16vae=preset=lightning_4step,lora={_TTV_LORA},attention=auto,vae=bf16 2>&1 '
         '| tail -3', carry=NF4),
    # ---- 2026-11-24: LingBot-World Fast and Play under a 24 GiB cap
    Mode("fast81", FAST_24, 'fast --frames 81 --prefetch-y --no-clip --vram-cap-gb 24 '
         '--out "$OUT/fast_81_w9s3_bf16_cap24_prefetch.json"', carry=NF4),
    Mode("fast81_int8", FAST_24, 'fast --frames 81 --kv-dtype int8 --vram-cap-gb 24 '
         '--out "$OUT/fast_81_w9s3_int8_cap24.json"', carry=NF4),
    Mode("fast81_full", FAST_24, 'fast --frames 81 --kv-window 0 --no-clip --out "$OUT/fast_81_full_bf16.json"',
         carry=NF4),
    Mode("fast957", FAST_24, 'fast --frames 957 --kv-dtype int8 --stream-decode --prefetch-y --no-clip '
         '--vram-cap-gb 24 --out "$OUT/fast_957_w9s3_int8_cap24_stream_prefetch.json"', carry=NF4),
    Mode("play30_cap24", FAST_24, 'play --size 480x832 --seconds 30 --vram-cap-gb 24 --kv-dtype int8 '
         '--vae-precision bf16 --out "$OUT/play30_${PLAY_TAG:-both}_cap24_int8_bf16vae.json"', carry=MP4),
    # ---- 2026-11-27, four H200s: 8-bit weights, the decode overlapped, sequence parallel
    Mode("gemm8", EIGHT_BIT, 'python3 bench/gemm8.py --out "$OUT/gemm8_4680.json" 2>&1 | grep -v "^Failed to load"'),
    Mode("fast81_fp8", EIGHT_BIT, 'fast --frames 81 --prefetch-y --no-clip --weights fp8 '
         '--out "$OUT/fast_81_w9s3_bf16_fp8w.json"', carry=NF4),
    Mode("play20_fp8_pipes", EIGHT_BIT, 'for p in ${PIPES:-overlap sequential}; do play --size 480x832 --seconds 20 '
         '--kv-dtype bf16 --vae-precision bf16 --weights fp8 --pipeline "$p" '
         '--out "$OUT/play20_${PLAY_TAG:-both}_fp8w_bf16kv_$p.json"; done', carry=MP4),
    Mode("sp4", EIGHT_BIT, 'multi --mode sp --ranks 2 --ranks 4 --out "$OUT/sp_4gpu.json" | tail -5', gpus=4),
    Mode("sp4_fp8", EIGHT_BIT, 'multi --mode sp --ranks 2 --ranks 4 --weights fp8 --exact-steps 2 --warmup 1 '
         '--out "$OUT/sp_4gpu_fp8.json" | tail -5', gpus=4),
    # ---- 2026-11-27: kept camera terms, 16 and 12 GiB caps, a server on two GPUs
    Mode("fast81_fp8_terms", TERMS, f'fast --frames 81 --prefetch-y --no-clip {_FP8_TERMS} '
         '--out "$OUT/fast_81_w9s3_bf16_fp8w_terms.json"', carry=NF4),
    Mode("fast81_cap16", TERMS, 'fast --frames 81 --prefetch-y --no-clip --memory auto --vram-cap-gb 16 '
         '--out "$OUT/fast_81_w9s3_auto_cap16.json"', carry=NF4),
    Mode("fast81_cap12", TERMS, 'fast --frames 81 --prefetch-y --no-clip --memory auto --vram-cap-gb 12 '
         '--out "$OUT/fast_81_w9s3_auto_cap12.json"', carry=NF4),
    Mode("play60_fp8_terms", TERMS, f'play {_PLAY60_FP8} --pipeline overlap '
         '--out "$OUT/play60_${PLAY_TAG:-both}_bf16kv_bf16vae_fp8w_terms.json"', carry=MP4),
    Mode("attn_backends", TERMS, 'python3 bench/attention_backends.py --out "$OUT/attention_backends.json" 2>&1 '
         '| grep -v "^Failed to load" | tail -6'),
    Mode("sp2_fp8", TERMS, 'multi --mode sp --ranks 2 --weights fp8 --skip-exact --out "$OUT/sp_2gpu_fp8.json" '
         '| tail -4', gpus=2),
    Mode("sp2_fp8_terms", TERMS, f'multi --mode sp --ranks 2 {_FP8_TERMS} --skip-exact '
         '--out "$OUT/sp_2gpu_fp8_terms.json" | tail -4', gpus=2),
    Mode("sp2_fp8_terms_sync1", TERMS, 'LINGBOT_CANCEL_SYNC_BLOCKS=1 multi --mode sp --ranks 2 --weights fp8 '
         '--camera-terms 40 --skip-exact --out "$OUT/sp_2gpu_fp8_terms_sync1.json" | tail -4', gpus=2),
    Mode("sp2_fp8_terms_profile", TERMS, 'python3 bench/multi_gpu.py --mode sp --ranks 2 --weights fp8 '
         '--camera-terms 40 --skip-exact --fast-chunks 4 --profile --out "$OUT/sp_2gpu_fp8_terms_profile.json" '
         '>"$OUT/sp_2gpu_profile.log" 2>&1; tail -45 "$OUT/sp_2gpu_profile.log"', gpus=2),
    Mode("sp2_fp8_terms_p2p_off", TERMS, f'NCCL_P2P_DISABLE=1 multi --mode sp --ranks 2 {_FP8_TERMS} '
         '--skip-exact --out "$OUT/sp_2gpu_fp8_terms_p2p_off.json" | tail -4', gpus=2),
    Mode("sp4only_fp8_terms", TERMS, f'multi --mode sp --ranks 4 {_FP8_TERMS} --skip-exact '
         '--fast-chunks 5 --warmup 1 --out "$OUT/sp_4gpu_only_fp8_terms.json" | tail -4', gpus=4),
    Mode("gpumulti", TERMS, 'gpu_pytest -m gpu tests/gpu/test_placements.py tests/gpu/test_sequence_parallel_gpu.py '
         'tests/unit/test_placement.py | tail -30', gpus=2, carry=(".whl2",)),
    Mode("gpu8", TERMS, 'gpu_pytest -rfE -m gpu tests/gpu/test_weights8_cuda.py | tail -15', carry=(".whl2",)),
    # A real ComfyUI server on two GPUs (tests/gpu/test_server_two_gpus.py, ~3 min): .whl_server and .bench_host
    # are built here by `bash bench/server_carry.sh`.
    Mode("server2", TERMS, 'server_wheels; nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader; '
         'nvidia-smi topo -m | head -4; LINGBOT_COMFY_ROOT="$PWD/.bench_host" LINGBOT_TEST_ARTIFACTS="$OUT/server2" '
         'timeout 560 python3 -m pytest -q -s -rfEs --tb=long -p no:cacheprovider -m gpu '
         'tests/gpu/test_server_two_gpus.py >"$OUT/server2.log" 2>&1; echo "pytest exit $?"; '
         'grep -v "^Failed to load" "$OUT/server2.log" | tail -40', gpus=2, carry=HOST[:3]),
    # ---- 2026-11-27: CUDA graphs, fp8 fast accumulation
    Mode("cgraphs", GRAPHS, 'gpu_pytest -rfE -m gpu tests/gpu/test_cuda_graphs_cuda.py | tail -15', carry=(".whl2",)),
    Mode("gpusp", GRAPHS, 'gpu_pytest -rfE -m gpu tests/gpu/test_sequence_parallel_gpu.py tests/gpu/test_cuda_graphs_cuda.py '
         'tests/gpu/test_weights8_cuda.py | tail -15', gpus=2, carry=(".whl2",)),
    Mode("fp8gemm", GRAPHS, 'python3 bench/fp8_gemm.py --out "$OUT/fp8_gemm.json" 2>&1 | grep -v "^Failed to load" '
         '| tail -9'),
    Mode("fast201_fp8_terms", GRAPHS, f'fast --frames 201 --prefetch-y --no-clip {_FP8_TERMS} '
         '--out "$OUT/fast_201_w9s3_bf16_fp8w_terms.json"', carry=NF4),
    Mode("fast201_fp8_terms_graphs", GRAPHS, f'fast --frames 201 --prefetch-y --no-clip {_FP8_TERMS} '
         '--cuda-graphs --out "$OUT/fast_201_w9s3_bf16_fp8w_terms_graphs.json"', carry=NF4),
    Mode("play60_fp8_terms_graphs", GRAPHS, f'play {_PLAY60_FP8} --cuda-graphs --pipeline overlap '
         '--out "$OUT/play60_${PLAY_TAG:-both}_bf16kv_bf16vae_fp8w_terms_graphs.json"', carry=MP4),
    Mode("sp2_fp8_terms_graphs", GRAPHS, f'multi --mode sp --ranks 2 {_FP8_TERMS} --skip-exact '
         f'{_GRAPHED} --out "$OUT/sp_2gpu_fp8_terms_graphs.json" | tail -4', gpus=2),
    Mode("sp4_fp8_terms_graphs", GRAPHS, f'multi --mode sp --ranks 2 --ranks 4 {_FP8_TERMS} '
         f'--skip-exact {_GRAPHED} --out "$OUT/sp_4gpu_fp8_terms_graphs.json" | tail -5',
         gpus=4),
    Mode("sp2_fp8_terms_graphs_profile", GRAPHS, 'python3 bench/multi_gpu.py --mode sp --ranks 2 --weights fp8 '
         '--camera-terms 40 --skip-exact --cuda-graphs --fast-chunks 6 --warmup 4 --profile '
         '--out "$OUT/sp_2gpu_fp8_terms_graphs_profile.json" >"$OUT/sp_2gpu_graphs_profile.log" 2>&1; '
         'tail -45 "$OUT/sp_2gpu_graphs_profile.log"', gpus=2),
    # ---- 2026-11-27: Play on two GPUs, the live decoder, the drift walk, 16 GiB caps
    Mode("dev957_fp8", PLAY_TWO, 'ensure_package; python3 bench/weights_deviation.py --package "$PKG" '
         '--image "$CAM/image.jpg" --frames 957 --kv-dtype int8 --kinds bf16 fp8 '
         '--out "$OUT/weights_deviation_957_fp8.json" 2>&1 | grep -v "^Failed to load" | tail -3', carry=NF4),
    Mode("fast957_cap16", PLAY_TWO, 'fast --frames 957 --pipeline overlap --memory auto --vae-precision bf16 --no-clip '
         '--vram-cap-gb 16 --out "$OUT/fast_957_w9s3_auto_cap16.json"', carry=NF4),
    Mode("play60_cap16", PLAY_TWO, 'play --size 480x832 --seconds 60 --memory auto --vae-precision bf16 '
         '--vram-cap-gb 16 --out "$OUT/play60_${PLAY_TAG:-both}_auto_cap16.json"', carry=MP4),
    Mode("play60_sp2", PLAY_TWO, 'play_syn --ranks 2 --seconds 60 --modes "${PLAY_MODES:-turn,continuous}" '
         '--decoders "${DECODERS:-wan,tiny}" --out "$OUT/play60_sp2_fp8w_terms_graphs.json"', gpus=2, carry=HOST),
    Mode("play30_sp1_tiny", PLAY_TWO, 'play_syn --ranks 1 --seconds 30 --modes "${PLAY_MODES:-continuous}" '
         '--decoders tiny --out "$OUT/play30_sp1_fp8w_terms_graphs_tiny.json"', carry=HOST),
    Mode("play30_sp1_vae1", PLAY_TWO, 'play_syn --ranks 1 --seconds 30 --modes "${PLAY_MODES:-continuous}" '
         '--decoders wan --vae-device cuda:1 --out "$OUT/play30_sp1_fp8w_terms_graphs_vae_cuda1.json"', gpus=2,
         carry=HOST),
    Mode("play30_sp2_vae1", PLAY_TWO, 'play_syn --ranks 2 --seconds 30 --modes "${PLAY_MODES:-continuous}" '
         '--decoders wan --vae-device cuda:1 --out "$OUT/play30_sp2_fp8w_terms_graphs_vae_cuda1.json"', gpus=2,
         carry=HOST),
    Mode("play20_sp2_tiny_priority", PLAY_TWO, 'play_syn --ranks 2 --seconds 20 --modes continuous --decoders tiny '
         '--stream-priority on,off --out "$OUT/play20_sp2_fp8w_terms_graphs_tiny_priority.json"', gpus=2, carry=HOST),
    # The VAE on the second GPU, the tiny decoder on CUDA, then /free with expert_per_gpu on a real server.
    Mode("gpuplay2", PLAY_TWO, 'server_wheels; LINGBOT_COMFY_ROOT="$PWD/.bench_host" gpu_pytest -rfEs -m gpu '
         'tests/gpu/test_fast_overlap_cuda.py tests/gpu/test_tiny_vae_cuda.py | tail -12; '
         'LINGBOT_COMFY_ROOT="$PWD/.bench_host" LINGBOT_TEST_ARTIFACTS="$OUT/server2" timeout "${SERVER_TIMEOUT:-300}" '
         'python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -m gpu tests/gpu/test_server_two_gpus.py '
         '-k expert_per_gpu >"$OUT/server2_expert_per_gpu.log" 2>&1; echo "server test exit $?"; '
         'grep -v "^Failed to load" "$OUT/server2_expert_per_gpu.log" | tail -15', gpus=2, carry=HOST),
    # ---- 2026-11-28, four H100s: whole exact videos, the exchanges overlapped
    Mode("exact_video4", FOUR_H100, 'ensure_vae; multi --mode sp --ranks 2 --ranks 4 --weights fp8 --skip-fast '
         '--exact-steps 2 --warmup 1 --exact-video "${VIDEO_STEPS:-40}" --vae "$VAEPKG/Wan2.1_VAE.pth" '
         '--out "$OUT/sp_4gpu_fp8_exact_video.json" | tail -4', gpus=4),
    Mode("exact720_4", FOUR_H100, 'multi --mode sp --ranks 4 --weights fp8 --skip-fast --size 720x1280 '
         '--exact-steps 2 --warmup 1 --out "$OUT/sp_4gpu_fp8_exact_720x1280.json" | tail -4', gpus=4),
    # the k/v/q exchanges overlapped (the default) and waited for one by one, on 2 GPUs and 4 where there are
    Mode("sp_overlap_ab", FOUR_H100, 'ranks=(--ranks 2); (( $(nvidia-smi -L | wc -l) >= 4 )) && ranks+=(--ranks 4); '
         f'for o in 0 1; do LINGBOT_SP_OVERLAP=$o multi --mode sp "${{ranks[@]}}" {_FP8_TERMS} '
         f'--skip-exact {_GRAPHED} '
         '--out "$OUT/sp_fast_fp8_terms_graphs_overlap$o.json" | tail -5; done', gpus=2),
    # ---- 2026-11-28, two H100s: FlashAttention 3
    Mode("fa3_attn", FA3, 'python3 bench/attention_backends.py --out "$OUT/attention_backends_fa3.json" 2>&1 '
         '| grep -v "^Failed to load" | tail -6', carry=FA3_WHEELS),
    Mode("fa3_gputests", FA3, 'gpu_pytest -rfE -m gpu tests/gpu/test_attention_fp8_cuda.py '
         '"tests/gpu/test_weights8_cuda.py::test_cuda_attention_rows" | tail -12', carry=FA3_WHEELS),
    Mode("sp2_flash", FA3, f'LINGBOT_ATTENTION=flash multi --mode sp --ranks 2 {_FP8_TERMS} '
         f'--skip-exact {_GRAPHED} '
         '--out "$OUT/sp_2gpu_fp8_terms_graphs_flash.json" | tail -4', gpus=2, carry=FA3_WHEELS),
    Mode("sp2_flash_fp8", FA3, f'LINGBOT_ATTENTION=flash_fp8 multi --mode sp --ranks 2 {_FP8_TERMS} '
         f'--skip-exact {_GRAPHED} '
         '--out "$OUT/sp_2gpu_fp8_terms_graphs_flash_fp8.json" | tail -4', gpus=2, carry=FA3_WHEELS),
    # one GPU's Fast chunk under each attention kernel, the same weights and noise: time and deviation
    Mode("fast_attn_compare", FA3, f'multi --mode sp {_FP8_TERMS} --cuda-graphs --fast-chunks 10 '
         '--warmup 4 --attention-compare "${ATTENTIONS:-sdpa,flash,flash_fp8}" '
         '--out "$OUT/fast_1gpu_fp8w_terms_graphs_attention.json" | tail -4', carry=(".site_xz",)),
    # Play on two GPUs with FlashAttention 3: the tiny live decoder, ATTENTION flash (bf16) or flash_fp8
    Mode("play60_sp2_fa3", FA3, 'LINGBOT_ATTENTION=${ATTENTION:-flash} play_syn --ranks 2 --seconds 60 '
         '--modes "${PLAY_MODES:-continuous}" --decoders tiny '
         '--out "$OUT/play60_sp2_fp8w_${ATTENTION:-flash}_tiny_${PLAY_TAG:-continuous}.json"', gpus=2,
         carry=FA3_HOST),
    # ---- 2026-11-28: block swap, Play's memory plan, 12 GiB caps, the exact video in fp8
    Mode("gpu_swap", SWAP_PLAN, 'gpu_pytest -rfE -m gpu tests/gpu/test_kv_cache_cuda.py tests/unit/test_block_swap.py '
         'tests/gpu/test_cuda_graphs_cuda.py | tail -12', carry=(".whl2",)),
    Mode("swap_rates", SWAP_PLAN, 'python3 bench/swap_rates.py --out "$OUT/swap_rates.json" 2>&1 '
         '| grep -v "^Failed to load" | tail -2'),
    # the Fast chunk per SWAP_VARIANTS blocks_on_gpu:camera_terms:spread (spread 0: LINGBOT_SWAP_SPREAD=0)
    Mode("swap_ab", SWAP_PLAN, 'for v in ${SWAP_VARIANTS:-31:4:1 31:4:0 21:40:1}; do IFS=: read -r b t s <<<"$v"; '
         'LINGBOT_SWAP_SPREAD=$s fast --frames 81 --prefetch-y --no-clip --weights fp8 --kv-dtype int8 '
         '--vram-cap-gb 24 --blocks-on-gpu "$b" --camera-terms "$t" '
         '--out "$OUT/fast_81_int8_fp8w_cap24_swap${b}_terms${t}_spread${s}.json"; done', carry=NF4),
    # Play on one 24 GB card: fp8 weights, the nodes' memory plan for a 24 GiB cap, the tiny live decoder
    Mode("play60_fp8_auto24_tiny", SWAP_PLAN, 'server_wheels; play --size 480x832 --seconds 60 --vram-cap-gb 24 '
         '--memory auto --pipeline overlap --vae-precision bf16 --weights fp8 --cuda-graphs --decoders tiny '
         '--comfy .bench_host --out "$OUT/play60_${PLAY_TAG:-both}_auto24_fp8w_tiny.json"', carry=HOST),
    Mode("fast957_cap12", SWAP_PLAN, 'fast --frames 957 --pipeline overlap --memory auto --vae-precision bf16 '
         '--no-clip --vram-cap-gb 12 --out "$OUT/fast_957_w9s3_auto_cap12.json"', carry=NF4),
    Mode("play60_tiny_cap12", SWAP_PLAN, 'server_wheels; play --size 480x832 --seconds 60 --memory auto '
         '--vae-precision bf16 --vram-cap-gb 12 --decoders tiny --comfy .bench_host '
         '--out "$OUT/play60_${PLAY_TAG:-both}_tiny_auto_cap12.json"', carry=HOST),
    # the exact 40-step video, bf16 products and fp8 GEMMs, each saved in /dev/shm (one GPU each), then compared
    Mode("ttv_save_exact", SWAP_PLAN, "ttv_save exact exact", carry=NF4),
    Mode("ttv_save_fp8", SWAP_PLAN, "ttv_save fp8 fp8=weights=fp8", carry=NF4),
    Mode("ttv_compare", SWAP_PLAN, 'python3 bench/ttv_compare.py /dev/shm/ttv_exact /dev/shm/ttv_fp8 '
         '--out "$OUT/ttv_fp8_vs_exact.json"'),
    # ---- 2026-11-28, H200s: fp8 keys and values kept between passes
    Mode("gpu_kept", KEPT_FP8, 'gpu_pytest -rfE -m gpu tests/gpu/test_kv_cache_cuda.py tests/gpu/test_cuda_graphs_cuda.py '
         'tests/gpu/test_attention_fp8_cuda.py | tail -12', carry=(".site_xz",)),
    Mode("fast_kept", KEPT_FP8, f'multi --mode sp --ranks 1 {_FP8_TERMS} --cuda-graphs --fast-chunks 10 '
         '--warmup 4 --steps "${STEPS:-4}" --attention-compare "${ATTENTIONS:-flash,flash_fp8:cast,flash_fp8}" '
         '--out "$OUT/fast_1gpu_fp8w_terms_graphs_kept_fp8_operands_steps${STEPS:-4}.json" | tail -5',
         carry=(".site_xz",)),
)

BY_NAME: dict[str, Mode] = {m.name: m for m in MODES}


def unknown(names: list[str]) -> list[str]:
    """The names that are not modes, each with the nearest modes ("fast81_cap8 (fast81_cap12?)")."""
    out = []
    for name in names:
        if name not in BY_NAME:
            near = difflib.get_close_matches(name, BY_NAME, n=3)
            out.append(f"{name} ({', '.join(near)}?)" if near else name)
    return out


def table() -> str:
    """The modes as a plain-text table: name, GPUs, carry, the section they back."""
    rows = [("mode", "GPUs", "carry", "bench/RESULTS.md section")]
    rows += [(m.name, str(m.gpus), " ".join(m.carry) or "-", m.section) for m in MODES]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in rows)


def main(argv: list[str]) -> int:
    if len(argv) == 1 and argv[0] == "list":
        print(table())
        return 0
    if argv[:1] in (["command"], ["check"]) and len(argv) >= 2:
        wrong = unknown(argv[1:])
        if wrong:
            print(f"not a benchmark mode: {'; '.join(wrong)} (python bench/modes.py list)", file=sys.stderr)
            return 2
        if argv[0] == "command":
            if len(argv) != 2:
                print("modes.py command takes one mode name", file=sys.stderr)
                return 2
            print(BY_NAME[argv[1]].command)
        return 0
    print(__doc__.split("\n\n", 2)[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
