"""Multi-GPU placements vs one GPU: s/step, time to video, peak VRAM per GPU, latent agreement.

    python bench/multi_gpu.py --package DIR --size 480x832 --frames 81 --steps 40 \\
        --devices single --devices expert_per_gpu --devices cfg_split --out $OUT/multi_gpu_480x832x81.json

The prompt, start frame and camera are encoded once on GPU 0 (the text-encoder and VAE
stages are the same in every placement); then each placement samples the same seed
through the stage the nodes call (pipeline.sampling.sample with a PlacedDiskExperts
source) and decodes on GPU 0. The first placement (``single`` by default) is the
reference for ``latent_rel_err_vs_single`` / ``latent_max_abs_vs_single`` and
``latent_close_bf16`` (torch.allclose at rtol=atol=1.6e-2, bf16's resolution).
``expert_per_gpu`` is run twice: ``warm_run_s`` is the second run's sampling time, when both
experts are still resident and nothing is loaded.

One JSON file holds a record per placement: size, frames, steps, devices, gpus, s_per_step
(median of the steps that load nothing), time_to_video_s (sampling with its expert loads,
plus decode), expert_load_s, peak_vram_allocated_gb_per_gpu, and the latent comparison.

CPU smoke test (two CPU "devices" take the multi-GPU code path; no timings worth keeping):
    python . make_checkpoint --preset tiny --out /tmp/tiny
    python bench/multi_gpu.py --package /tmp/tiny --device cpu --size 32x48 --frames 5 --steps 4 \\
        --devices single --devices expert_per_gpu --devices cfg_split --out /tmp/multi_gpu.json
(``--tiny`` does the same with a tiny package of its own.)

Sequence parallel (``--mode sp``; pipeline/parallel_pool/, wan/runtime/parallel.py): synthetic
bf16 weights of the A14B shapes built on every GPU (the same seed), no package needed. One
process per GPU (this one is rank 0), one NCCL group per group size in ``--ranks``; the
one-GPU figures come from the same model in the same run, before any group starts:

    python bench/multi_gpu.py --mode sp --ranks 2 --out $OUT/sp_2gpu.json            # 2 GPUs
    python bench/multi_gpu.py --mode sp --ranks 2 --ranks 4 --out $OUT/sp_4gpu.json  # 4 GPUs
    NCCL_P2P_DISABLE=1 python bench/multi_gpu.py --mode sp --ranks 2 --out $OUT/sp_2gpu_p2p_off.json
    python bench/multi_gpu.py --mode sp --ranks 2 --ranks 4 --weights fp8 --out $OUT/sp_4gpu_fp8.json

``--weights fp8|int8`` holds every linear layer in that kind on every rank (converted from the
synthetic bf16 weights as the loaders convert on load; the one-GPU figure in the same kind),
so fp8 x sequence parallel is measured against fp8 on one GPU.

Per group size: ``link`` (a timed 64 MB all-to-all: seconds, GB/s, what ``devices=auto`` would
pick), ``fast`` (LingBot-World Fast at ``--fast-size``, window 9 sink 3, the head-sharded cache:
``chunk_s`` median over the chunks after ``--warmup`` — ``--steps`` denoising forwards (4, or 3, 2,
1: the first official timesteps) and the commit pass of each chunk, as FastGenerator runs them — with ``fps`` = 12 video frames per chunk) and
``exact`` (one guided step of ``--size`` x ``--frames`` = one batch-of-two forward, ``s_per_step``),
on 4+ ranks also ``exact_cfg_split`` (Ulysses x CFG split: the prompt branch on the first half of
the GPUs, the negative one on the second, one all-gather between the pairs),
each with the one-GPU figure and the speed-up beside it, and ``max_rel_vs_1gpu`` (the sharded
prediction against the one-GPU one: bf16 rounding). CPU check of the whole script (gloo, tiny
geometry, float32): ``python bench/multi_gpu.py --mode sp --tiny --ranks 2 --ranks 4 --out /tmp/sp.json``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import _pack  # noqa: F401  (bench/_pack.py: the checkout as comfyui_lingbot_world, before any pack import)
from bench_pipeline import PROMPT, StepTimer, base_record, sync  # noqa: E402
from time_to_video import rel_err  # noqa: E402

from comfyui_lingbot_world.loaders.package import find_package  # noqa: E402
from comfyui_lingbot_world.pipeline.camera import camera_condition, path_from_preset  # noqa: E402
from comfyui_lingbot_world.pipeline.decode import decode  # noqa: E402
from comfyui_lingbot_world.pipeline.experts import PlacedDiskExperts  # noqa: E402
from comfyui_lingbot_world.pipeline.image import encode_image  # noqa: E402
from comfyui_lingbot_world.pipeline.placement import (  # noqa: E402
    GPUS_NEEDED,
    PLACEMENTS,
    Placement,
    cuda_placement,
    placement_on,
)
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, expert_for, sample  # noqa: E402
from comfyui_lingbot_world.pipeline.text import encode_text  # noqa: E402
from comfyui_lingbot_world.wan.geometry import VAE_STRIDE_T, latent_frames, latent_size  # noqa: E402
from comfyui_lingbot_world.wan.scheduler import (DEFAULT_FAST_STEPS, fast_schedule, fast_step_indices,  # noqa: E402
                                                 make_sampler)

GB = 1024**3
BF16_TOLERANCE = 1.6e-2  # 2**-6: bf16 keeps 8 significant bits


def placement_for(mode: str, device: str) -> Placement:
    if device == "cpu":  # the multi-GPU code path with every slot on the CPU
        return placement_on(mode, ["cpu"] * GPUS_NEEDED[mode])
    return cuda_placement(mode, torch.cuda.device_count())


def reset_peaks() -> None:
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)


def peaks() -> list[float] | None:
    if not torch.cuda.is_available():
        return None
    return [torch.cuda.max_memory_allocated(i) / GB for i in range(torch.cuda.device_count())]


class Timed(PlacedDiskExperts):
    """Records how long each expert copy takes to load."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.loads: dict[str, float] = {}

    def _load(self, name: str, slot: int):
        if (name, slot) in self._resident:
            return self._resident[(name, slot)]
        sync()
        started = time.perf_counter()
        module = super()._load(name, slot)
        sync()
        self.loads[f"{name}@{slot}"] = time.perf_counter() - started
        return module


def run_sampling(source, text, condition, camera, params: SamplingParams) -> tuple[torch.Tensor, list[float], float]:
    timer = StepTimer()
    started = timer.start()
    latent = sample(source, text, condition, camera, params, on_step=timer)
    sync()
    return latent, timer.seconds, time.perf_counter() - started


def run_placement(args, files, mode: str, inputs, params: SamplingParams,
                  reference: torch.Tensor | None) -> tuple[dict, torch.Tensor]:
    text, condition, camera = inputs
    placement = placement_for(mode, args.device)
    record = {"devices": mode, "gpus": [str(d) for d in placement.devices]}
    source = Timed(files.high, files.low, placement, blocks_on_gpu=args.block_swap or None)
    reset_peaks()
    try:
        latent, step_times, sampling_s = run_sampling(source, text, condition, camera, params)
        if placement.keep_resident:  # both experts stayed: a second run loads nothing
            loads_before = dict(source.loads)
            again, _, record["warm_run_s"] = run_sampling(source, text, condition, camera, params)
            record["warm_run_reloaded"] = source.loads != loads_before
            record["warm_run_equal"] = bool(torch.equal(again, latent))
    finally:
        source.close()
    started = time.perf_counter()
    video = decode(files.vae, latent, placement.devices[0], tile=args.decode_tile or None)
    sync()
    decode_s = time.perf_counter() - started
    timesteps = make_sampler(params.sampler, params.steps, params.shift).timesteps.tolist()
    names = [expert_for(t, params.boundary) for t in timesteps]
    first_of = {names.index(n) for n in set(names)}  # steps that include an expert load
    steady = [t for i, t in enumerate(step_times) if i not in first_of]
    record |= {
        "step_seconds": step_times,
        "s_per_step": statistics.median(steady) if steady else None,
        "sampling_s": sampling_s,
        "decode_s": decode_s,
        "time_to_video_s": sampling_s + decode_s,
        "expert_load_s": source.loads,
        "peak_vram_allocated_gb_per_gpu": peaks(),
        "video_shape": list(video.shape),
        "video_finite": bool(torch.isfinite(video).all()),
    }
    if reference is not None:
        record["latent_rel_err_vs_single"] = rel_err(latent, reference)
        record["latent_max_abs_vs_single"] = float((latent - reference).abs().max())
        record["latent_equal_to_single"] = bool(torch.equal(latent, reference))
        record["latent_close_bf16"] = bool(torch.allclose(latent, reference, rtol=BF16_TOLERANCE,
                                                          atol=BF16_TOLERANCE))
    return record, latent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("placements", "sp"), default="placements")
    p.add_argument("--package", help="placements: the package (built here with --tiny)")
    p.add_argument("--tiny", action="store_true", help="the CPU check: tiny geometry, CPU devices (gloo)")
    p.add_argument("--ranks", type=int, action="append", help="sp: group sizes to run (default 2)")
    p.add_argument("--fast-size", default="480x832")
    p.add_argument("--fast-chunks", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2, help="sp: chunks / steps not timed")
    p.add_argument("--exact-steps", type=int, default=3)
    p.add_argument("--weights", default="bf16", choices=("bf16", "fp8", "int8"),
                   help="sp: the kind every linear layer is held in on each rank (loaders.weight_kind.convert_linear)")
    p.add_argument("--camera-terms", type=int, default=0,
                   help="sp: blocks whose camera terms a Fast chunk keeps (40: all; FastParams.camera_terms)")
    p.add_argument("--profile", action="store_true", help="sp: profile two Fast chunks on rank 0 of each group")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="sp: Fast passes replayed from CUDA graphs once the cache is full (one GPU timed both ways)")
    p.add_argument("--skip-exact", action="store_true")
    p.add_argument("--exact-video", type=int, default=0, metavar="STEPS",
                   help="sp: also a whole exact video per group size (--size x --frames, STEPS steps, both experts)")
    p.add_argument("--vae", help="sp --exact-video: the Wan 2.1 VAE file (make_checkpoint --parts vae)")
    p.add_argument("--skip-fast", action="store_true")
    p.add_argument("--attention-compare", metavar="NAMES",
                   help="sp: only one GPU's Fast chunk, once per attention backend (comma list, e.g. "
                        "sdpa,flash,flash_fp8,flash_fp8:cast; :cast keeps no fp8 operands in the cache), each "
                        "with its time and deviation from the first")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--devices", action="append", choices=PLACEMENTS,
                   help="placements to run, in order (the first is the reference); default: all")
    p.add_argument("--size", default="480x832")
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--steps", type=int, default=None,
                   help="denoising steps: placements, of the exact sampler (default 40); sp, of each Fast chunk "
                        "(4, 3, 2 or 1: wan.scheduler.FAST_STEP_INDICES; default 4)")
    p.add_argument("--shift", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-swap", type=int, default=0)
    p.add_argument("--decode-tile", type=int, default=0)
    p.add_argument("--no-batch-cfg", action="store_true", help="single GPU: the two CFG branches as separate passes")
    p.add_argument("--vram-cap-gb", type=float, default=None, help="recorded only (base_record)")
    args = p.parse_args(argv)
    if args.mode == "sp":
        return run_sp(args)
    args.steps = 40 if args.steps is None else args.steps
    if args.tiny:
        args.device, args.size, args.frames, args.steps = "cpu", "32x48", 5, 4
        if not args.package:
            from comfyui_lingbot_world.tools import make_checkpoint

            args.package = str(Path(tempfile.mkdtemp()) / "tiny")
            make_checkpoint.main(["--preset", "tiny", "--layout", "nf4", "--out", args.package])
    if not args.package:
        p.error("--package is needed for --mode placements (or --tiny)")
    modes = args.devices or list(PLACEMENTS)
    height, width = (int(v) for v in args.size.split("x"))
    files = find_package(args.package)
    first = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    from PIL import Image

    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (720, 1280, 3), dtype=np.uint8))
    text = encode_text(files.t5, files.tokenizer, PROMPT, "", first, cache_dir=Path(tempfile.mkdtemp()))
    condition = encode_image(files.vae, image, args.frames, height, width, first)
    camera = camera_condition(path_from_preset("orbit_left", 1.0, args.frames), args.frames, height, width)
    params = SamplingParams(steps=args.steps, shift=args.shift, seed=args.seed, batch_cfg=not args.no_batch_cfg)
    common = base_record(args) | {"size": args.size, "frames": args.frames, "steps": args.steps,
                                  "block_swap": args.block_swap, "batch_cfg": params.batch_cfg,
                                  "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    records, reference = [], None
    for mode in modes:
        record, latent = run_placement(args, files, mode, (text, condition, camera), params, reference)
        if reference is None:
            reference, record["reference"] = latent, True
        records.append(common | record)
        print(json.dumps({k: record[k] for k in ("devices", "s_per_step", "time_to_video_s")}), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(records, indent=2))
    return 0


# --------------------------------------------------------------------------- sequence parallel

def _sync_all(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _latent_grid(config, height: int, width: int) -> tuple[int, int]:
    return latent_size(height, width)


def _plucker(config, frames: int, lat_h: int, lat_w: int, device: torch.device, g: torch.Generator) -> torch.Tensor:
    channels = config.camera_in_features // int(np.prod(config.patch_size))
    return torch.randn(1, channels, frames, lat_h, lat_w, generator=g).to(device)


def time_fast(model, config, height: int, width: int, chunks: int, warmup: int,
              device: torch.device, camera_terms: int = 0, graphs: bool = False,
              steps: int = DEFAULT_FAST_STEPS) -> tuple[dict, torch.Tensor]:
    """Fast chunks with the window-9 cache: ``steps`` denoising forwards + the commit pass each;
    ``camera_terms`` blocks keep their camera terms for the chunk (``CameraTerms``);
    ``graphs``: the passes replayed from CUDA graphs once the cache is full (chunk 2 on).
    Returns the timings and the first and last chunks' last outputs (stacked)."""
    from comfyui_lingbot_world.wan.runtime.kv_cache import CHUNK_FRAMES, CachePolicy
    lat_h, lat_w = _latent_grid(config, height, width)
    g = torch.Generator().manual_seed(7)
    cache = model.new_kv_cache(CachePolicy(window=9, sink=3), lat_h, lat_w, graphs=graphs)
    text = [torch.randn(config.text_len, config.text_dim, generator=g).to(device)]
    times, first, last, stats = [], None, None, None
    schedule = fast_schedule(indices=fast_step_indices(steps))
    try:
        for chunk in range(chunks):
            x = torch.randn(1, 16, CHUNK_FRAMES, lat_h, lat_w, generator=g).to(device)
            y = torch.randn(1, config.in_dim - 16, CHUNK_FRAMES, lat_h, lat_w, generator=g).to(device)
            plucker = _plucker(config, CHUNK_FRAMES, lat_h, lat_w, device, g)
            _sync_all(device)
            started = time.perf_counter()
            tokens = model.prepare_camera(plucker, keep_terms=camera_terms)
            for step, t in enumerate(schedule.timesteps):
                out = model(x, torch.tensor([float(t)], device=device), text if chunk == step == 0 else None, y=y,
                            camera_tokens=tokens, kv_cache=cache)
                if first is None:
                    first = out.float().cpu()
                last = out
                x = out.to(x.dtype) * 0.5 + x * 0.5
            model(x, torch.tensor([0.0], device=device), None, y=y, camera_tokens=tokens, kv_cache=cache, commit=True)
            _sync_all(device)
            times.append(time.perf_counter() - started)
        if cache.graphs is not None:
            stats = {"captures": cache.graphs.captures, "replays": cache.graphs.replays,
                     "disabled": cache.graphs.disabled}
    finally:
        cache.close()
    steady = times[warmup:] or times
    chunk_s = statistics.median(steady)
    return {"chunk_s": chunk_s, "chunk_seconds": times, "fps": VAE_STRIDE_T * CHUNK_FRAMES / chunk_s,
            "size": f"{height}x{width}", "window": 9, "sink": 3, "camera_terms": camera_terms, "steps": steps,
            "cuda_graphs": stats}, torch.stack([first, last.float().cpu()])


def profile_fast(model, config, height: int, width: int, device: torch.device, camera_terms: int,
                 graphs: bool = False, steps: int = DEFAULT_FAST_STEPS) -> dict:
    """Two Fast chunks on rank 0 under torch.profiler: the kernels' GPU time against the
    wall time (what the GPU sat idle for), and the kernels that took the most."""
    from torch.profiler import ProfilerActivity, profile

    time_fast(model, config, height, width, 1, 0, device, camera_terms, steps=steps)  # warm
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        # with graphs: chunks 0-1 fill the cache, 2-3 capture, 4-5 replay only
        time_fast(model, config, height, width, 6 if graphs else 2, 0, device, camera_terms, graphs, steps)
        wall = time.perf_counter() - started
    events = prof.key_averages()
    device_us = lambda e: getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))  # noqa: E731
    kernels = sorted(events, key=device_us, reverse=True)
    busy = sum(device_us(e) for e in events) / 1e6
    top = [{"name": e.key[:90], "device_ms": device_us(e) / 1e3, "calls": e.count} for e in kernels[:25]]
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25), flush=True)
    return {"wall_s": wall, "device_busy_s": busy, "top": top}


def time_exact(model, config, height: int, width: int, frames: int, steps: int, warmup: int,
               device: torch.device) -> tuple[dict, torch.Tensor]:
    """Guided steps of the exact path: one forward of a batch of two (batched CFG)."""
    lat_f = latent_frames(frames)
    lat_h, lat_w = _latent_grid(config, height, width)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(1, 16, lat_f, lat_h, lat_w, generator=g).to(device).expand(2, -1, -1, -1, -1)
    y = torch.randn(1, config.in_dim - 16, lat_f, lat_h, lat_w, generator=g).to(device).expand(2, -1, -1, -1, -1)
    context = [torch.randn(n, config.text_dim, generator=g).to(device) for n in (config.text_len, 20)]
    tokens = model.prepare_camera(_plucker(config, lat_f, lat_h, lat_w, device, g))
    t = torch.tensor([900.0, 900.0], device=device)
    times, first = [], None
    for _ in range(warmup + steps):
        _sync_all(device)
        started = time.perf_counter()
        out = model(x, t, context, y=y, camera_tokens=tokens)
        _sync_all(device)
        times.append(time.perf_counter() - started)
        first = out.float().cpu() if first is None else first
    return {"s_per_step": statistics.median(times[warmup:]), "step_seconds": times,
            "size": f"{height}x{width}", "frames": frames}, first


class ResidentExperts:
    """Both experts already on their GPUs (the sampler's ExpertSource): nothing loads at the switch."""

    def __init__(self, models: dict) -> None:
        self.models = models

    def acquire(self, name: str):
        return self.models[name]

    def release(self, name: str) -> None:
        pass


def time_exact_video(experts: dict, config, height: int, width: int, frames: int, steps: int, vae: str,
                     device: torch.device) -> tuple[dict, torch.Tensor]:
    """A whole exact video through the stages the nodes call: the start frame encoded by the
    VAE, ``steps`` guided steps across the expert switch (pipeline.sampling.sample), the
    decode; the prompt's states are random (the text encoder runs on rank 0 alone, as on one
    GPU) and both experts are resident (no load is timed)."""
    from PIL import Image

    from comfyui_lingbot_world.pipeline.text import TextEmbeddings

    g = torch.Generator().manual_seed(9)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8))
    text = TextEmbeddings(torch.randn(60, config.text_dim, generator=g).to(device),
                          torch.randn(20, config.text_dim, generator=g).to(device), from_cache=False)
    _sync_all(device)
    started = time.perf_counter()
    condition = encode_image(vae, image, frames, height, width, device, precision="bf16")
    camera = camera_condition(path_from_preset("orbit_left", 1.0, frames), frames, height, width)
    _sync_all(device)
    encoded = time.perf_counter()
    timer = StepTimer()
    timer.start()
    latent = sample(ResidentExperts(experts), text, condition, camera, SamplingParams(steps=steps, seed=0),
                    on_step=timer)
    _sync_all(device)
    sampled = time.perf_counter()
    video = decode(vae, latent, device, precision="bf16")
    _sync_all(device)
    done = time.perf_counter()
    return {"size": f"{height}x{width}", "frames": frames, "steps": steps, "encode_s": encoded - started,
            "sampling_s": sampled - encoded, "step_seconds": timer.seconds, "decode_s": done - sampled,
            "video_s": done - started, "video_shape": list(video.shape),
            "video_finite": bool(torch.isfinite(video).all()),
            "not_timed": "the text encoder and the model loads (rank 0 runs them as one GPU does)"}, latent


def run_sp(args) -> int:
    import dataclasses
    import os

    from _synthetic import SyntheticDiT
    from comfyui_lingbot_world.pipeline.parallel_pool import PARALLEL_ENV, ParallelModel, RankPool, apply_env
    from comfyui_lingbot_world.pipeline.placement import AUTO, MODELS, decide_devices
    from comfyui_lingbot_world.wan.config import A14B, TINY
    from comfyui_lingbot_world.wan.runtime.attention import backend_name
    from comfyui_lingbot_world.wan.runtime.switches import SWITCHES

    apply_env()
    worlds = sorted(set(args.ranks or [2]))
    if args.tiny:
        config, dtype = dataclasses.replace(TINY, num_heads=4), torch.float32
        devices = [torch.device("cpu")] * max(worlds)
        fast_size, exact_size, frames = "48x80", "48x80", 9
        args.fast_chunks, args.exact_steps, args.warmup = 3, 1, 1
        args.exact_video = min(args.exact_video, 3)
        torch.set_num_threads(1)
        if args.exact_video and not args.vae:
            from comfyui_lingbot_world.tools import make_checkpoint

            folder = Path(tempfile.mkdtemp()) / "tiny"
            make_checkpoint.main(["--preset", "tiny", "--layout", "nf4", "--parts", "vae", "--out", str(folder)])
            args.vae = str(folder / "Wan2.1_VAE.pth")
    else:
        config, dtype = A14B, torch.bfloat16
        count = torch.cuda.device_count()
        if count < max(worlds):
            raise SystemExit(f"--ranks {max(worlds)} needs {max(worlds)} CUDA GPUs, "
                             f"torch.cuda.device_count() is {count}")
        devices = [torch.device("cuda", i) for i in range(max(worlds))]
        fast_size, exact_size, frames = args.fast_size, args.size, args.frames
    if args.exact_video and not args.vae:
        raise SystemExit("--exact-video needs --vae (python . make_checkpoint --parts vae writes one)")
    fh, fw = (int(v) for v in fast_size.split("x"))
    eh, ew = (int(v) for v in exact_size.split("x"))
    factory = SyntheticDiT(config, dtype, weights=args.weights)
    steps = DEFAULT_FAST_STEPS if args.steps is None else args.steps
    fast_step_indices(steps)  # refused before anything is built
    common = {"gpu": torch.cuda.get_device_name(0) if devices[0].type == "cuda" else "cpu", "steps": steps,
              "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
              "torch": torch.__version__, "command": "python " + " ".join(sys.argv), "tiny": args.tiny,
              "weights": args.weights,
              "env": {k: os.environ.get(k) for k in (*PARALLEL_ENV, "NCCL_P2P_DISABLE", *SWITCHES)}}
    model = factory(devices[0])
    from comfyui_lingbot_world.wan.runtime.dense import gemm_kind

    # what the linears hold on rank 0 (the workers build theirs with the same factory)
    common["linear_kinds"] = sorted({gemm_kind(m).name for m in model.modules() if isinstance(m, torch.nn.Linear)})
    common["attention"] = backend_name(devices[0])  # what every rank runs (workers inherit the environment)
    if args.attention_compare:
        return _compare_attention(args, model, config, fh, fw, devices[0], common | {"ranks": 1})
    baseline: dict = {"ranks": 1}
    with torch.no_grad():
        if not args.skip_fast:
            baseline["fast"], fast_ref = time_fast(model, config, fh, fw, args.fast_chunks, args.warmup, devices[0],
                                                       args.camera_terms, args.cuda_graphs, steps)
            if args.cuda_graphs:  # the same chunks eagerly, in the same process: the speed-up and bit equality
                baseline["fast_eager"], eager_ref = time_fast(model, config, fh, fw, args.fast_chunks, args.warmup,
                                                              devices[0], args.camera_terms, steps=steps)
                baseline["fast"]["graphs_speedup"] = baseline["fast_eager"]["chunk_s"] / baseline["fast"]["chunk_s"]
                baseline["fast"]["graphs_equal_eager"] = bool(torch.equal(fast_ref, eager_ref))
        if not args.skip_exact:
            baseline["exact"], exact_ref = time_exact(model, config, eh, ew, frames, args.exact_steps, args.warmup,
                                                      devices[0])
    records = [common | baseline]
    print(json.dumps(_summary(baseline)), flush=True)
    low_model = None
    for world in worlds:
        record: dict = {"ranks": world}
        pool = RankPool(devices[:world]).start()
        try:
            record["link"] = link = pool.measure_link()
            # what each loader's devices=auto picks on this link and these GPUs (the one rule)
            link["auto_picks"] = {model: decide_devices(AUTO, model, devices[:world], config.num_heads, "",
                                                        lambda group: link["gbps"]).mode.name for model in MODELS}
            parallel = ParallelModel(pool, "dit", pool.load("dit", factory, local=model))
            with torch.no_grad():
                if args.exact_video:  # the low-noise expert beside the high-noise one (another seed) on every rank
                    low_factory = dataclasses.replace(factory, seed=1)
                    if low_model is None:
                        low_model = low_factory(devices[0])
                    experts = {"high": parallel,
                               "low": ParallelModel(pool, "low", pool.load("low", low_factory, local=low_model))}
                    record["exact_video"], _ = time_exact_video(experts, config, eh, ew, frames, args.exact_video,
                                                                args.vae, devices[0])
                    record["exact_video"]["ulysses_x_cfg_split"] = bool(parallel.cfg_split and pool.cfg is not None)
                    record["exact_video"]["estimated_1gpu_sampling_s"] = (
                        baseline["exact"]["s_per_step"] * args.exact_video if "exact" in baseline else None)
                    experts["low"].close()
                if not args.skip_fast:
                    record["fast"], got = time_fast(parallel, config, fh, fw, args.fast_chunks, args.warmup, devices[0],
                                                    args.camera_terms, args.cuda_graphs, steps)
                    record["fast"]["speedup_vs_1gpu"] = baseline["fast"]["chunk_s"] / record["fast"]["chunk_s"]
                    record["fast"]["max_rel_vs_1gpu"] = rel_err(got, fast_ref)
                    if args.profile:
                        record["fast"]["profile"] = profile_fast(parallel, config, fh, fw, devices[0], args.camera_terms,
                                                                 args.cuda_graphs, steps)
                if not args.skip_exact:
                    # Ulysses over all ranks; with 4+ (even) ranks also Ulysses x CFG split (half the GPUs per branch)
                    for key, split in (("exact", False), ("exact_cfg_split", True)):
                        if split and pool.cfg is None:
                            continue
                        parallel.cfg_split = split
                        record[key], got = time_exact(parallel, config, eh, ew, frames, args.exact_steps, args.warmup,
                                                      devices[0])
                        record[key]["speedup_vs_1gpu"] = baseline["exact"]["s_per_step"] / record[key]["s_per_step"]
                        record[key]["max_rel_vs_1gpu"] = rel_err(got, exact_ref)
            record["peak_vram_allocated_gb_rank0"] = (torch.cuda.max_memory_allocated(devices[0]) / GB
                                                      if devices[0].type == "cuda" else None)
            parallel.close()
        finally:
            pool.close()
        records.append(common | record)
        print(json.dumps(_summary(record)), flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # after every group: a timeout keeps the rest
        Path(args.out).write_text(json.dumps(records, indent=2))
    return 0


def _compare_attention(args, model, config, height: int, width: int, device: torch.device, common: dict) -> int:
    """One GPU's Fast chunk under each backend of --attention-compare in one process (the same
    weights, noise and camera): the time per chunk and the first and last chunks' outputs'
    relative deviation from the first backend's. ``NAME:cast`` runs NAME with the cache
    keeping no fp8 operands (LINGBOT_KV_FP8_KEEP=0: the kernel casts every frame every pass).
    With 8-bit linears on CUDA, the kernel floor of that kind is measured once in the same
    process and each figure's ratio to it recorded."""
    import os

    from fast_chunks import kernel_floor
    from comfyui_lingbot_world.wan.runtime.attention import attention_backend, backend_name
    from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy
    from comfyui_lingbot_world.wan.runtime.switches import KV_FP8_KEEP

    floor = None
    if device.type == "cuda" and args.weights in ("fp8", "int8"):
        floor = kernel_floor(config, height, width, CachePolicy(window=9, sink=3), 81, args.weights, args.camera_terms,
                             common["steps"])
        print(json.dumps({"floor": args.weights, "chunk_s": round(floor["chunk_s"], 4)}), flush=True)
    records, reference = [], None
    for entry in args.attention_compare.split(","):
        name, _, variant = entry.strip().partition(":")
        if variant not in ("", "cast"):
            raise SystemExit(f"--attention-compare: {entry!r}: the only variant is NAME:cast")
        saved = os.environ.get(KV_FP8_KEEP.name)
        if variant == "cast":
            os.environ[KV_FP8_KEEP.name] = "0"
        try:
            with attention_backend(name), torch.no_grad():
                record = {"attention": backend_name(device), "kv_fp8_keep": variant != "cast"}
                record["fast"], got = time_fast(model, config, height, width, args.fast_chunks, args.warmup, device,
                                                args.camera_terms, args.cuda_graphs, common["steps"])
        finally:
            if saved is None:
                os.environ.pop(KV_FP8_KEEP.name, None)
            else:
                os.environ[KV_FP8_KEEP.name] = saved
        if reference is None:
            reference = got
        record["fast"]["rel_vs_first"] = [rel_err(got[i], reference[i]) for i in range(len(got))]  # first, last chunk
        record["fast"]["equal_to_first"] = bool(torch.equal(got, reference))
        if floor is not None:
            record["kernel_floor"] = floor
            record["ratio_to_floor"] = record["fast"]["chunk_s"] / floor["chunk_s"]
        records.append(common | record)
        print(json.dumps({"attention": entry.strip(), "fast_chunk_s": round(record["fast"]["chunk_s"], 4),
                          "rel_vs_first": record["fast"]["rel_vs_first"],
                          "equal_to_first": record["fast"]["equal_to_first"],
                          "ratio_to_floor": None if floor is None else round(record["ratio_to_floor"], 3)}), flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(records, indent=2))
    return 0


def _summary(record: dict) -> dict:
    out = {"ranks": record["ranks"]}
    if "link" in record:
        out["link_gbps"], out["auto_picks"] = round(record["link"]["gbps"], 2), record["link"]["auto_picks"]
    for key, figure in (("fast", "chunk_s"), ("fast_eager", "chunk_s"), ("exact", "s_per_step"),
                        ("exact_cfg_split", "s_per_step"), ("exact_video", "video_s")):
        if key in record:
            out[f"{key}_{figure}"] = round(record[key][figure], 4)
            if "speedup_vs_1gpu" in record[key]:
                out[f"{key}_speedup"] = round(record[key]["speedup_vs_1gpu"], 3)
                out[f"{key}_rel_vs_1gpu"] = record[key]["max_rel_vs_1gpu"]
    return out


if __name__ == "__main__":
    sys.exit(main())
