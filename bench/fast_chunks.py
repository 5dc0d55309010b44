"""Benchmark LingBot-World Fast: seconds per chunk, time to the first chunk, frames per
second, memory, an 81-frame clip end to end, and the kernel floor of one chunk.

    python bench/fast_chunks.py --package DIR --frames 81 --kv-window 9 --kv-sink 3 \
        --kv-dtype bf16 --vram-cap-gb 24 --out $OUT/fast_81_w9s3_bf16_cap24.json

The DiT is any expert-shaped folder (NF4 or bf16, ``--dit``; by default the package's
low-noise folder): the synthetic A14B expert of ``python . make_checkpoint --preset a14b
--layout nf4`` has the Fast transformer's exact shapes. The run, in one process:

1. T5 encodes the prompt (a fresh text cache, so the encoder really loads), then the DiT loads;
2. the measured stream: ``--frames`` frames chunk by chunk through ``FastGenerator`` with the
   image condition encoded lazily by the VAE's causal stream (``StreamedI2V``) and the
   camera made per chunk (``KeyframeCamera``; an action path, or ``--camera-dir``);
   ``--stream-decode`` also decodes each chunk as it comes (the long-video streaming mode);
3. unless ``--no-clip``: an 81-frame clip end to end with the DiT resident (T5 load and
   encode of a new prompt → VAE encode → ``sample_fast`` → VAE decode);
4. on CUDA, the kernel floor of one chunk: the block's bf16 GEMMs and SDPA timed alone at
   the chunk's query tokens and the cache's key tokens, x blocks x (steps + 1) forwards (the text
   keys/values are cached, so their projections are not counted); on a card with fp8 tensor
   cores (sm89+) also the fp8 floor (the same with the linears as fp8 GEMMs, activation
   quantization included), and with ``--weights int8`` the int8 floor, in the same run.

``--weights fp8|int8|nf4|bf16`` loads the DiT in that kind (converted layer by layer on load
from whatever the folder stores; an fp8 package folder loads as it is); the JSON's
``weights`` says which, and ``ratio_to_floor`` is against the floor of that kind.

The JSON holds ``chunk_s`` (median and per chunk), ``time_to_first_chunk_s``, ``fps``
(generated video frames per second of the chunk loop, the lazy image encode and, with
``--stream-decode``, the decode included), ``peak_vram_allocated_gb`` (the chunk loop), ``peak_rss_anon_gb``, ``kv_policy``, ``kv_dtype``, ``frames``, ``cap_gb``,
``cache_bytes``, ``clip81`` and ``kernel_floor``. Checked on the CPU with a tiny package:

    python . make_checkpoint --preset tiny --layout nf4 --out /tmp/tiny
    python bench/fast_chunks.py --package /tmp/tiny --device cpu --size 32x48 --frames 21 --out /tmp/fast.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import _pack  # noqa: F401  (registers the checkout as comfyui_lingbot_world)
from comfyui_lingbot_world.loaders.layout import layout_of, read_config  # noqa: E402
from comfyui_lingbot_world.wan import geometry  # noqa: E402
from comfyui_lingbot_world.loaders.package import find_package  # noqa: E402
from comfyui_lingbot_world.loaders.trajectory import read_trajectory  # noqa: E402
from comfyui_lingbot_world.wan.camera_actions import cut_actions  # noqa: E402
from comfyui_lingbot_world.pipeline.camera import (camera_condition, path_from_actions, path_from_files,  # noqa: E402
                                                   path_from_preset)
from comfyui_lingbot_world.pipeline.decode import decode  # noqa: E402
from comfyui_lingbot_world.pipeline.experts import load_expert  # noqa: E402
from comfyui_lingbot_world.pipeline.fast import (FastGenerator, FastParams, KeyframeCamera, StreamedI2V, path_camera,  # noqa: E402
                                                 fast_latent_frames, sample_fast, stream_fast_video)
from comfyui_lingbot_world.pipeline.image import as_pil, encode_image, open_vae, vae_dtype  # noqa: E402
from comfyui_lingbot_world.pipeline.memory import release_module  # noqa: E402
from comfyui_lingbot_world.pipeline.text import encode_text  # noqa: E402
from comfyui_lingbot_world.wan.conditioning import image_to_tensor  # noqa: E402
from bench_pipeline import env_record  # noqa: E402
from memory_plan import apply_memory_plan  # noqa: E402
from comfyui_lingbot_world.wan.runtime.attention import CHOICES as ATTENTION_CHOICES  # noqa: E402
from comfyui_lingbot_world.wan.runtime.kv_cache import KV_DTYPES, CachePolicy  # noqa: E402
from comfyui_lingbot_world.wan.scheduler import DEFAULT_FAST_STEPS, FAST_STEPS, fast_step_indices  # noqa: E402
from memwatch import GB, MemoryWatch  # noqa: E402
from comfyui_lingbot_world.pipeline.guards import VAE_PRECISIONS  # noqa: E402

PROMPT = "A walk through a sunlit pine forest towards a wooden cabin by a lake, mountains behind it."
# Enough walking for 961 frames (the path wraps as needed): forward, look around, turn, strafe.
# A long scripted walk, cut to the video (the camera refuses a string longer than the video).
ACTIONS = "w-120,l-30,w-120,j-45,w-100,d-40,w-120,i-10,k-10,w-100,l-20,s-20,w-125,j-30,w-70"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cap_vram(cap_gb: float | None, device: torch.device) -> None:
    if cap_gb and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()  # "cuda" has none
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gb * GB / total), index)


def policy_of(args: argparse.Namespace) -> CachePolicy:
    window = None if args.kv_window == 0 else args.kv_window
    return CachePolicy(window=window, sink=0 if window is None else args.kv_sink, dtype=args.kv_dtype)


def policy_name(policy: CachePolicy) -> str:
    return "full" if policy.full else f"window{policy.window}_sink{policy.sink}"


def fast_params(args: argparse.Namespace, policy: CachePolicy, seed: int) -> FastParams:
    """The flags' ``FastParams`` (``--steps``: the first N official timesteps)."""
    return FastParams(seed=seed, shift=args.shift, policy=policy, timestep_indices=fast_step_indices(args.steps),
                      attention=args.attention, camera_terms=args.camera_terms, cuda_graphs=args.cuda_graphs)


def load_image(path: str | None, height: int, width: int):
    from PIL import Image
    from comfyui_lingbot_world.loaders.image_file import open_image  # upright, as Load Image

    return open_image(path) if path else Image.fromarray(
        np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8))


def stream_camera(args: argparse.Namespace, frames: int, height: int, width: int) -> KeyframeCamera:
    if args.camera_dir:
        poses, intrinsics = read_trajectory(Path(args.camera_dir) / "poses.npy", Path(args.camera_dir) / "intrinsics.npy")
        return KeyframeCamera(poses, intrinsics, frames, height, width, source=args.camera_dir)
    return path_camera(path_from_actions(cut_actions(ACTIONS, frames), frames, height, width), frames, height, width)


def run_stream(args, model, text: torch.Tensor, vae_file: Path, image, policy: CachePolicy,
               device: torch.device, watch: MemoryWatch) -> dict:
    """The measured chunk loop (and, with --stream-decode, each chunk decoded as it comes)."""
    height, width = (int(v) for v in args.size.lower().split("x"))
    frames = args.frames
    latent_frames = fast_latent_frames(frames)
    camera = stream_camera(args, frames, height, width)
    pixels = image_to_tensor(as_pil(image), height, width)
    params = fast_params(args, policy, seed=0)
    chunk_s, decode_s = [], []
    record: dict = {}
    with watch.phase("chunks") as phase:
        started = time.perf_counter()
        # The VAE where the memory plan puts it (--memory auto on a small card: maybe the CPU).
        vae_device = device if getattr(args, "vae_on_gpu", True) else torch.device("cpu")
        vae = open_vae(vae_file, vae_device, vae_dtype(vae_device))
        decoder = vae.stream_decoder(tile=args.decode_tile or None) if args.stream_decode else None
        # Without streaming decode the VAE goes once the image condition is proven constant.
        release = None if decoder is not None else (lambda: release_module(vae))
        source = StreamedI2V(vae, pixels.to(vae_device), latent_frames, release_vae=release)
        if args.prefetch_y:  # encode the condition up to its fixed point now: the encoder's state goes first
            source.prefetch()
        with FastGenerator(model, text, source, params, latent_frames=latent_frames) as session:
            record["cache_bytes"] = None
            for c in range(latent_frames // 3):
                sync(device)
                t0 = time.perf_counter()
                x0 = session.next_chunk(camera.chunk(3 * c, 3), commit=c + 1 < latent_frames // 3)
                sync(device)
                t1 = time.perf_counter()
                chunk_s.append(t1 - t0)
                if c == 0:
                    record["time_to_first_chunk_s"] = t1 - started
                if decoder is not None:
                    with torch.inference_mode():
                        video = decoder.decode_next(x0[None].to(vae_device, vae.dtype))
                    sync(device)
                    decode_s.append(time.perf_counter() - t1)
                    if c == 0:
                        record["time_to_first_frames_s"] = time.perf_counter() - started
                    del video
                del x0
            record["cache_bytes"] = session.cache.nbytes()
            graphs = session.cache.graphs
            record["cuda_graphs"] = None if graphs is None else {
                "captures": graphs.captures, "replays": graphs.replays, "disabled": graphs.disabled}
        record["y_encoded_latent_frames"] = source.encoded
        record["y_constant_from"] = source.constant_from
        if decoder is not None:
            decoder.close()
        source.close()
        release_module(vae)
        del vae, decoder, source
        sync(device)
        loop_s = time.perf_counter() - started
    record.update({
        # tail: the second half of the chunks (with CUDA graphs: replays only, the captures are
        # in chunks 2 and 3).
        "chunk_s": {"median": statistics.median(chunk_s), "steady_median": statistics.median(chunk_s[1:] or chunk_s),
                    "tail_median": statistics.median(chunk_s[len(chunk_s) // 2:]), "per_chunk": chunk_s},
        "chunks": len(chunk_s),
        "loop_s": loop_s,
        "fps": frames / loop_s,
        "peak_vram_allocated_gb": phase.get("peak_vram_allocated_gb"),
        "peak_vram_reserved_gb": phase.get("peak_vram_reserved_gb"),
    })
    if decode_s:
        record["decode_chunk_s"] = {"median": statistics.median(decode_s), "per_chunk": decode_s}
    return record


def run_pipelined(args, model, text: torch.Tensor, vae_file: Path, image, policy: CachePolicy,
                  device: torch.device, watch: MemoryWatch) -> dict:
    """Fast Long Video's own path (``stream_fast_video``): every chunk decoded and written,
    overlapped with the next chunk's generation (``--pipeline overlap``) or after it
    (``sequential``). A chunk's time is between two chunks' ends (the decode, overlapped,
    is hidden in it or not)."""
    height, width = (int(v) for v in args.size.lower().split("x"))
    frames = args.frames
    camera = stream_camera(args, frames, height, width)
    params = fast_params(args, policy, seed=0)
    ends, written = [], []

    def chunk_done(_done: int, _total: int, _x0: torch.Tensor) -> None:
        sync(device)
        ends.append(time.perf_counter())

    with watch.phase("chunks") as phase:
        started = time.perf_counter()
        result = stream_fast_video(model, text, vae_file, image, frames, height, width, camera, params,
                                   lambda video: written.append(time.perf_counter()), device=device,
                                   precision=args.vae_precision, decode_tile=args.decode_tile or None,
                                   on_preview=chunk_done, overlap=args.pipeline == "overlap")
        sync(device)
        loop_s = time.perf_counter() - started
    between = [b - a for a, b in zip(ends, ends[1:])]
    return {
        "pipeline": args.pipeline, "chunks": result.chunks_done, "frames_written": result.frames_written,
        "chunk_s": {"median": statistics.median(between or [ends[0] - started]),
                    "steady_median": statistics.median(between[1:] or between or [ends[0] - started]),
                    "per_chunk": between},
        "time_to_first_chunk_s": ends[0] - started, "time_to_first_frames_s": written[0] - started,
        "loop_s": loop_s, "fps": result.frames_written / loop_s,
        "peak_vram_allocated_gb": phase.get("peak_vram_allocated_gb"),
        "peak_vram_reserved_gb": phase.get("peak_vram_reserved_gb"),
    }


def run_clip81(args, model, files, image, policy: CachePolicy, device: torch.device, text_device: torch.device,
               watch: MemoryWatch) -> dict:
    """T5 → VAE encode → chunks → decode for an 81-frame clip, the DiT already resident."""
    height, width = (int(v) for v in args.size.lower().split("x"))
    frames = 81
    params = fast_params(args, policy, seed=1)
    phases = {}
    sync(device)
    started = time.perf_counter()
    with watch.phase("clip81_text") as p, tempfile.TemporaryDirectory(prefix="lingbot-fast-bench-") as cache:
        text = encode_text(files.t5, files.tokenizer, PROMPT + " Second take.", "", text_device, cache_dir=Path(cache))
    phases["text_s"] = p["seconds"]
    with watch.phase("clip81_vae_encode") as p:
        condition = encode_image(files.vae, image, frames, height, width, device)
    phases["vae_encode_s"] = p["seconds"]
    if args.camera_dir:
        path = path_from_files(Path(args.camera_dir) / "poses.npy", Path(args.camera_dir) / "intrinsics.npy")
    else:
        path = path_from_preset("orbit_left", 1.0, frames)
    camera = camera_condition(path, frames, height, width)
    with watch.phase("clip81_sampling") as p:
        latent = sample_fast(model, text.positive, condition, camera, params, frames)
    phases["sampling_s"] = p["seconds"]
    with watch.phase("clip81_decode") as p:
        video = decode(files.vae, latent, device, tile=args.decode_tile or None)
    phases["decode_s"] = p["seconds"]
    total = time.perf_counter() - started
    return {"frames": frames, "seconds": total, "phases": phases, "video_shape": list(video.shape),
            "video_finite": bool(torch.isfinite(video).all()),
            "peak_vram_allocated_gb": max(watch.phases[k].get("peak_vram_allocated_gb") or 0
                                          for k in watch.phases if k.startswith("clip81"))}


def kernel_floor(config, height: int, width: int, policy: CachePolicy, frames: int, weights: str = "bf16",
                 camera_terms: int = 0, steps: int = DEFAULT_FAST_STEPS) -> dict:
    """One chunk's kernels timed alone: steps + 1 forwards of every block (five at 4 steps); the
    camera layers of ``camera_terms`` blocks run once a chunk instead of every forward (kept terms)."""
    from kernel_floor import block_floor_ms

    frame_tokens = geometry.video_tokens(1, *geometry.latent_size(height, width), config.patch_size)
    window, _ = policy.resolve(fast_latent_frames(frames))
    chunk_tokens = policy.chunk * frame_tokens
    block = block_floor_ms(chunk_tokens, config.dim, config.ffn_dim, config.num_heads, camera=True,
                           key_tokens=window * frame_tokens, cross_kv=False, weights=weights)
    kept = min(int(camera_terms), config.num_layers)
    forwards = steps + 1
    return {"weights": weights, "query_tokens": chunk_tokens, "key_tokens": window * frame_tokens, "block": block,
            "forward_s": block["block_ms"] * config.num_layers / 1000.0, "camera_terms": kept, "steps": steps,
            "chunk_s": (forwards * block["block_ms"] * config.num_layers
                        - (forwards - 1) * block["camera_ms"] * kept) / 1000.0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--package", help="a package folder (T5, VAE, tokenizer, and expert folders)")
    p.add_argument("--dit", help="the Fast transformer's folder (default: the package's low-noise expert)")
    p.add_argument("--t5", help="umT5 file (default: the package's)")
    p.add_argument("--tokenizer", help="tokenizer folder (default: the package's)")
    p.add_argument("--vae", help="VAE file (default: the package's)")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--text-device", help="where T5 runs (default: the device)")
    p.add_argument("--size", default="480x832")
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--kv-window", type=int, default=9, help="latent frames a chunk attends to; 0: the full cache")
    p.add_argument("--kv-sink", type=int, default=3)
    p.add_argument("--kv-dtype", default="bf16", choices=KV_DTYPES)
    p.add_argument("--shift", type=float, default=10.0)
    p.add_argument("--steps", type=int, default=DEFAULT_FAST_STEPS, choices=FAST_STEPS,
                   help="denoising steps a chunk: 4 (official) or the first 3, 2, 1 of its timesteps")
    p.add_argument("--camera-terms", type=int, default=None,
                   help="blocks whose camera terms a chunk keeps (FastParams.camera_terms; 40: all, 0: none); "
                        "default: the memory plan's with --memory auto, else 0")
    p.add_argument("--attention", default="auto", choices=ATTENTION_CHOICES,
                   help="attention kernel; auto: the nodes' rule (wan/runtime/attention.py decide)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="replay the chunk's passes from CUDA graphs once the cache is full (FastParams.cuda_graphs)")
    p.add_argument("--vram-cap-gb", type=float, default=None)
    p.add_argument("--blocks-on-gpu", type=int, default=0, help="blocks kept on the GPU (0: all)")
    p.add_argument("--quantize", default=None, help="nf4: quantize a bf16 DiT folder on load (as --weights nf4)")
    p.add_argument("--weights", default=None, choices=("bf16", "nf4", "fp8", "int8"),
                   help="the kind the DiT's linears are held and multiplied in (default: as the folder stores them)")
    p.add_argument("--image")
    p.add_argument("--camera-dir", help="poses.npy + intrinsics.npy (default: an action path)")
    p.add_argument("--stream-decode", action="store_true", help="decode each chunk as it comes")
    p.add_argument("--prefetch-y", action="store_true",
                   help="encode the image condition before the first chunk instead of chunk by chunk")
    p.add_argument("--decode-tile", type=int, default=0)
    p.add_argument("--no-clip", action="store_true", help="skip the 81-frame end-to-end clip")
    p.add_argument("--pipeline", default="loop", choices=("loop", "overlap", "sequential"),
                   help="loop: the measured chunk loop below; overlap / sequential: stream_fast_video (Fast Long "
                   "Video's path) with each chunk decoded beside the next chunk's generation or after it")
    p.add_argument("--vae-precision", default="fp32", choices=tuple(VAE_PRECISIONS), help="--pipeline overlap/sequential")
    p.add_argument("--memory", default="manual", choices=("manual", "auto"),
                   help="auto: kv dtype, blocks on the GPU and overlap as the nodes choose them for a card of "
                   "--vram-cap-gb (pipeline.memory.plan_fast_memory); manual: the flags as given")
    args = p.parse_args(argv)

    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    text_device = torch.device(args.text_device) if args.text_device else device
    height, width = (int(v) for v in args.size.lower().split("x"))
    files = find_package(args.package) if args.package else None
    dit = Path(args.dit) if args.dit else files.low
    t5 = Path(args.t5) if args.t5 else files.t5
    tokenizer = Path(args.tokenizer) if args.tokenizer else (files.tokenizer if files else None)
    vae_file = Path(args.vae) if args.vae else files.vae
    plan = None
    args.overlap = args.pipeline == "overlap"
    if args.memory == "auto":
        # Every pipeline opens the VAE on the device beside the transformer (the loop too: it
        # encodes the image condition chunk by chunk, as Fast Long Video does), so the plan counts it.
        plan = apply_memory_plan(args, dit, vae_file, device, args.vae_precision)
        if args.pipeline != "loop":
            args.pipeline = "overlap" if args.overlap else "sequential"
    args.camera_terms = args.camera_terms or 0
    policy = policy_of(args)
    fast_latent_frames(args.frames)  # refuse a count that does not fill chunks before loading anything
    cap_vram(args.vram_cap_gb, device)
    config = read_config(dit)
    record: dict = {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "ranks": 1, "steps": args.steps,
        "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "torch": torch.__version__, "size": args.size, "frames": args.frames,
        "kv_policy": policy_name(policy), "kv_window": policy.window, "kv_sink": policy.sink,
        "kv_dtype": policy.dtype, "cap_gb": args.vram_cap_gb, "blocks_on_gpu": args.blocks_on_gpu or None,
        "stream_decode": args.stream_decode, "prefetch_y": args.prefetch_y, "dit": str(dit),
        "pipeline": args.pipeline, "memory_plan": plan, "camera_terms": args.camera_terms,
        "cuda_graphs_requested": args.cuda_graphs,
        "weights": args.weights or layout_of(dit).stored_kind,
        "env": env_record(),
    }
    image = load_image(args.image, height, width)
    try:
        with MemoryWatch() as watch:
            with watch.phase("text_encode") as ph, tempfile.TemporaryDirectory(prefix="lingbot-fast-bench-") as cache:
                text = encode_text(t5, tokenizer, PROMPT, "", text_device, cache_dir=Path(cache))
            record["text_encode_s"] = ph["seconds"]
            with watch.phase("dit_load") as ph:
                model = load_expert(dit, device, quantize=args.weights or args.quantize,
                                    blocks_on_gpu=args.blocks_on_gpu or None)
                sync(device)
            record["dit_load_s"] = ph["seconds"]
            run = run_stream if args.pipeline == "loop" else run_pipelined
            record |= run(args, model, text.positive, vae_file, image, policy, device, watch)
            if not args.no_clip:
                clip_files = files or argparse.Namespace(t5=t5, tokenizer=tokenizer, vae=vae_file)
                record["clip81"] = run_clip81(args, model, clip_files, image, policy, device, text_device, watch)
            release_module(model)
            del model
        record["phases"] = watch.phases
        record["peak_rss_anon_gb"] = watch.peak_anon / GB
        record["peak_rss_file_gb"] = watch.peak_file / GB
        if device.type == "cuda":
            terms = args.camera_terms
            floors = {"bf16": kernel_floor(config, height, width, policy, args.frames, camera_terms=terms,
                                           steps=args.steps)}
            if torch.cuda.get_device_capability(device) >= (8, 9):
                floors["fp8"] = kernel_floor(config, height, width, policy, args.frames, "fp8", terms, args.steps)
            if record["weights"] == "int8":
                floors["int8"] = kernel_floor(config, height, width, policy, args.frames, "int8", terms, args.steps)
            record["kernel_floor"] = floors["bf16"]
            record["kernel_floors"] = floors
            own = floors.get(record["weights"], floors["bf16"])  # NF4 runs bf16 GEMMs after its dequantize
            if "chunk_s" in record:
                record["ratio_to_floor"] = record["chunk_s"]["steady_median"] / own["chunk_s"]
                if "fp8" in floors:
                    record["ratio_to_fp8_floor"] = record["chunk_s"]["steady_median"] / floors["fp8"]["chunk_s"]
    except torch.cuda.OutOfMemoryError as exc:
        record["oom"] = str(exc)[:600]
    Path(args.out).write_text(json.dumps(record, indent=2, default=str))
    print(json.dumps({k: v for k, v in record.items() if not isinstance(v, (dict, list))}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
