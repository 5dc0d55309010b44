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
from comfyui_lingbot_world.wan.scheduler import make_sampler  # noqa: E402

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
    p.add_argument("--package", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--devices", action="append", choices=PLACEMENTS,
                   help="placements to run, in order (the first is the reference); default: all")
    p.add_argument("--size", default="480x832")
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--shift", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-swap", type=int, default=0)
    p.add_argument("--decode-tile", type=int, default=0)
    p.add_argument("--no-batch-cfg", action="store_true", help="single GPU: the two CFG branches as separate passes")
    p.add_argument("--vram-cap-gb", type=float, default=None, help="recorded only (base_record)")
    args = p.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
