"""Time to video: the whole image-to-video run with each acceleration off or on.

T5 -> VAE encode -> sampling across the expert switch -> VAE decode, through the stage
functions the nodes call, one or more variants per process (each loads its experts again):

    python bench/time_to_video.py --package DIR --steps 40 --out-dir $OUT/ttv \\
        --variant exact --variant cache05=cache=0.05,cfg_truncate=0.2 \\
        --variant lightning=preset=lightning_4step,lora=FILE

A variant is NAME or NAME=key=value,...; keys: cache (EasyCache threshold), warmup,
cfg_truncate, attention (auto|sdpa|sage|flash), preset (lightning_4step), steps, lora
(a LoRA file; strength by lora_high / lora_low, default 1), batch_cfg (0/1), vae (fp32, the
reference, or bf16: the VAE nodes' precision input, for encode and decode), weights (fp8 or
int8: the experts' linears converted on load, the GEMMs in 8 bits; default: as the package
stores them, the exact path's bf16 products). The variant
named "exact" must have no keys. The first variant's final latent and video are the
reference for the deviation columns unless --reference DIR names a saved one
(--save-reference DIR writes the reference there: latent.pt and a float16 video.pt).

Each record (one JSON file per variant) holds the keys of bench_pipeline.py's pipeline
records plus time_to_video_s, steps, forwards (model evaluations computed),
skipped_forwards, truncated_forwards, predicted_changes (step, the cache rule's predicted
relative change: how far the run was from skipping), accelerations, latent_rel_err_vs_exact and
video_psnr_vs_exact (peak-to-peak 2 for videos in [-1, 1]; null for the reference itself
and where the reference has another size; a few-step variant is compared with the exact
reference of the same seed, whatever its step count).

--synthetic-lora PATH writes a random rank-64 LoRA of the package's shapes (kohya keys) for
timing a LoRA row when no real adapter is at hand.

CPU smoke test (a tiny package from `python . make_checkpoint --preset tiny --out DIR`):
    python bench/time_to_video.py --package DIR --device cpu --size 32x48 --frames 5 --steps 4 \\
        --variant exact --variant fast=cache=0.05,warmup=1,cfg_truncate=0.25 --out-dir /tmp/ttv
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

import _pack  # noqa: F401  (bench/_pack.py: the checkout as comfyui_lingbot_world, before any pack import)
from bench_pipeline import (PROMPT, StepTimer, TimedExperts, add_run_arguments, base_record, bench_camera_path,  # noqa: E402
                            cap_vram, sampling_record, sync)
from memwatch import MemoryWatch  # noqa: E402

from comfyui_lingbot_world.loaders.package import find_package  # noqa: E402
from comfyui_lingbot_world.pipeline.camera import camera_condition  # noqa: E402
from comfyui_lingbot_world.pipeline.guards import VAE_PRECISIONS  # noqa: E402
from comfyui_lingbot_world.pipeline.decode import decode  # noqa: E402
from comfyui_lingbot_world.pipeline.experts import AS_STORED  # noqa: E402
from comfyui_lingbot_world.pipeline.image import encode_image  # noqa: E402
from comfyui_lingbot_world.pipeline.lora import LoraExperts, LoraSpec  # noqa: E402
from comfyui_lingbot_world.pipeline.sampler_presets import apply_preset  # noqa: E402
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, sample  # noqa: E402
from comfyui_lingbot_world.pipeline.step_cache import StepStats  # noqa: E402
from comfyui_lingbot_world.pipeline.text import encode_text  # noqa: E402

VARIANT_KEYS = ("cache", "warmup", "cfg_truncate", "attention", "preset", "steps", "lora", "lora_high", "lora_low",
                "batch_cfg", "vae", "weights")


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, spec = text.partition("=")
    options: dict[str, str] = {}
    for item in filter(None, spec.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in VARIANT_KEYS:
            raise SystemExit(f"--variant {text!r}: {item!r} is not key=value with a key among {', '.join(VARIANT_KEYS)}")
        options[key] = value
    if name == "exact" and options:
        raise SystemExit("--variant exact takes no options (it is the reference)")
    if options.get("vae", "fp32") not in VAE_PRECISIONS:
        raise SystemExit(f"--variant {text!r}: vae={options['vae']!r} is not fp32 or bf16")
    return name, options


def variant_params(base: SamplingParams, options: dict[str, str]) -> SamplingParams:
    params = apply_preset(options.get("preset", "none"), base)
    changes: dict = {}
    if "steps" in options:
        changes["steps"] = int(options["steps"])
    if "cache" in options:
        changes["cache_threshold"] = float(options["cache"])
    if "warmup" in options:
        changes["cache_warmup"] = int(options["warmup"])
    if "cfg_truncate" in options:
        changes["cfg_truncate"] = float(options["cfg_truncate"])
    if "attention" in options:
        changes["attention"] = options["attention"]
    if "batch_cfg" in options:
        changes["batch_cfg"] = options["batch_cfg"] not in ("0", "false")
    return replace(params, **changes)


def accelerations(params: SamplingParams, options: dict[str, str]) -> dict:
    return {"cache_threshold": params.cache_threshold, "cache_warmup": params.cache_warmup,
            "cfg_truncate": params.cfg_truncate, "attention": params.attention, "preset": options.get("preset"),
            "lora": options.get("lora"), "sampler": params.sampler, "shift": params.shift,
            "guide": [params.cfg_high, params.cfg_low], "boundary": params.boundary,
            "vae_precision": options.get("vae", "fp32"), "weights": options.get("weights")}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def psnr(video: torch.Tensor, reference: torch.Tensor) -> float:
    """PSNR of videos in [-1, 1] (peak-to-peak 2)."""
    mse = float(((video.float() - reference.float()) ** 2).mean())
    return math.inf if mse == 0 else 10.0 * math.log10(4.0 / mse)


def run_variant(args: argparse.Namespace, name: str, options: dict[str, str], image, reference: dict | None
                ) -> tuple[dict, torch.Tensor, torch.Tensor]:
    height, width = (int(v) for v in args.size.split("x"))
    files = find_package(args.package)
    device = torch.device(args.device)
    base = SamplingParams(steps=args.steps, shift=args.shift, seed=args.seed)
    params = variant_params(base, options)
    record = base_record(args) | {"variant": name, "size": args.size, "frames": args.frames, "steps": params.steps,
                                  "block_swap": args.block_swap, "batch_cfg": params.batch_cfg,
                                  "accelerations": accelerations(params, options)}
    timer = StepTimer()
    stats = StepStats()
    with MemoryWatch() as watch:
        sync()
        started = time.perf_counter()
        with watch.phase("text_encode"):
            with tempfile.TemporaryDirectory(prefix="lingbot-ttv-cache-") as cache_dir:  # T5 runs in every variant
                text = encode_text(files.t5, files.tokenizer, PROMPT, "", device, cache_dir=Path(cache_dir))
        with watch.phase("vae_encode"):
            condition = encode_image(files.vae, image, args.frames, height, width, device,
                                     precision=options.get("vae", "fp32"))
        with watch.phase("camera"):
            camera = camera_condition(bench_camera_path(args), args.frames, height, width)
        # weights: the kind the experts' linears are held and multiplied in, the loaders' choice
        # (fp8, int8: made on load from the package's NF4; auto: the nodes' rule; default: as stored)
        experts = TimedExperts(files.high, files.low, device, weights=options.get("weights", AS_STORED),
                               blocks_on_gpu=args.block_swap or None)
        source = experts
        if "lora" in options:
            spec = LoraSpec(Path(options["lora"]), float(options.get("lora_high", 1.0)),
                            float(options.get("lora_low", 1.0)))
            source = LoraExperts(experts, [spec])
        try:
            with watch.phase("sampling"):
                timer.start()
                latent = sample(source, text, condition, camera, params, on_step=timer, stats=stats)
        finally:
            experts.close()
        with watch.phase("vae_decode"):
            video = decode(files.vae, latent, device, tile=args.decode_tile or None,
                           precision=options.get("vae", "fp32"))
        sync()
        record["time_to_video_s"] = time.perf_counter() - started
    record |= sampling_record(experts, timer.seconds, params, watch)
    record["video_shape"] = list(video.shape)
    record["video_finite"] = bool(torch.isfinite(video).all())
    record["forwards"] = stats.forwards
    record["skipped_forwards"] = stats.skipped_forwards
    record["truncated_forwards"] = stats.truncated_forwards
    record["cached_steps"] = stats.cached_steps
    record["predicted_changes"] = [[i, round(c, 6)] for i, c in stats.predicted_changes]
    # s_per_step is the median of all steady steps; with the cache on, skipped steps (~1 ms)
    # can be most of them, so the steps that ran a forward get their own median.
    firsts = {record["expert_names"].index(n) for n in set(record["expert_names"])}
    ran = [t for i, t in enumerate(timer.seconds) if i in set(stats.computed_steps) and i not in firsts]
    record["s_per_computed_step"] = statistics.median(ran) if ran else None
    comparable = reference is not None and reference["latent"].shape == latent.shape
    record["reference"] = None if reference is None else reference["name"]
    record["latent_rel_err_vs_exact"] = rel_err(latent, reference["latent"]) if comparable else None
    record["video_psnr_vs_exact"] = psnr(video, reference["video"]) if comparable else None
    return record, latent, video


LORA_LAYERS = ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q", "cross_attn.k",
               "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2")


def write_synthetic_lora(path: Path, package: str, rank: int, seed: int = 0) -> Path:
    """A random LoRA (kohya keys, alpha = rank) on every attention and FFN linear of the
    package's experts: the shapes and size of a rank-``rank`` Wan2.2 adapter, for timing."""
    from safetensors.torch import save_file

    from comfyui_lingbot_world.loaders.layout import read_config

    config = read_config(find_package(package).high)
    g = torch.Generator().manual_seed(seed)
    shapes = {"ffn.0": (config.ffn_dim, config.dim), "ffn.2": (config.dim, config.ffn_dim)}
    state = {}
    for block in range(config.num_layers):
        for layer in LORA_LAYERS:
            out_f, in_f = shapes.get(layer, (config.dim, config.dim))
            base = f"lora_unet_blocks_{block}_{layer.replace('.', '_')}"
            state[f"{base}.lora_down.weight"] = (torch.randn(rank, in_f, generator=g) / in_f ** 0.5).bfloat16()
            state[f"{base}.lora_up.weight"] = (torch.randn(out_f, rank, generator=g) * 0.01).bfloat16()
            state[f"{base}.alpha"] = torch.tensor(float(rank))
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path))
    return path


def file_name(record: dict) -> str:
    gpu = record["gpu"].replace("NVIDIA ", "").split()[0].lower()
    return f"{record['date']}_{gpu}_{record['size']}x{record['frames']}_ttv_{record['steps']}steps_{record['variant']}.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--package", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--variant", action="append", help="NAME or NAME=key=value,... (repeat); default: exact")
    p.add_argument("--device", default="cuda")
    add_run_arguments(p, steps=40)  # steps of every variant (fewer for long geometries)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reference", help="folder with a saved reference (latent.pt, video.pt, name.txt)")
    p.add_argument("--save-reference", help="write the first variant's latent and video here")
    p.add_argument("--synthetic-lora", help="write a random LoRA here first (if absent), for lora=PATH rows")
    p.add_argument("--lora-rank", type=int, default=64)
    args = p.parse_args(argv)
    if args.synthetic_lora and not Path(args.synthetic_lora).is_file():
        write_synthetic_lora(Path(args.synthetic_lora), args.package, args.lora_rank)
    variants = [parse_variant(v) for v in (args.variant or ["exact"])]
    if args.device.startswith("cuda"):
        cap_vram(args.vram_cap_gb)
    from PIL import Image
    from comfyui_lingbot_world.loaders.image_file import open_image  # upright, as Load Image

    image = open_image(args.image) if args.image else Image.fromarray(
        np.random.default_rng(0).integers(0, 255, (720, 1280, 3), dtype=np.uint8))
    reference = None
    if args.reference:
        folder = Path(args.reference)
        reference = {"name": (folder / "name.txt").read_text().strip(), "latent": torch.load(folder / "latent.pt"),
                     "video": torch.load(folder / "video.pt")}
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for index, (name, options) in enumerate(variants):
        try:
            record, latent, video = run_variant(args, name, options, image, reference)
        except torch.cuda.OutOfMemoryError as exc:
            record = base_record(args) | {"variant": name, "size": args.size, "frames": args.frames,
                                          "oom": str(exc)[:500]}
            latent = video = None
        (out / file_name(record)).write_text(json.dumps(record, indent=2, default=str))
        print(json.dumps({k: v for k, v in record.items() if not isinstance(v, (dict, list))}, default=str))
        if index == 0 and reference is None and latent is not None:
            reference = {"name": name, "latent": latent, "video": video}
            if args.save_reference:
                folder = Path(args.save_reference)
                folder.mkdir(parents=True, exist_ok=True)
                torch.save(latent, folder / "latent.pt")
                torch.save(video.half(), folder / "video.pt")
                (folder / "name.txt").write_text(f"{name} ({record['steps']} steps, seed {args.seed})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
