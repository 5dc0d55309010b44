"""Benchmark the LingBot-World pipeline on a GPU through the same code the nodes use.

    python bench/bench_pipeline.py pipeline --package DIR --size 480x832 --frames 81 \
        --steps 4 --vram-cap-gb 24 --out results.json
    python bench/bench_pipeline.py load-expert --package DIR --out load.json
    python bench/bench_pipeline.py naive-load --package DIR --out naive.json

Each mode runs in its own process so its peak RssAnon is its own. The JSON holds the keys
that bench/RESULTS.md tabulates (size, frames, vram_cap_gb, block_swap, peak_rss_anon_gb,
peak_vram_allocated_gb, s_per_step, kernel_floor_s_per_step, expert_switch_s, gpu, date,
command) plus the per-phase figures.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import _pack  # noqa: F401  (bench/_pack.py: the checkout as comfyui_lingbot_world, before any pack import)
from comfyui_lingbot_world.loaders.layout import NF4_WEIGHTS_FILE, read_config, require_layout  # noqa: E402
from comfyui_lingbot_world.loaders import tensor_source  # noqa: E402
from comfyui_lingbot_world.loaders.package import find_package  # noqa: E402
from comfyui_lingbot_world.pipeline.camera import CameraPath, camera_condition, path_from_files, path_from_preset  # noqa: E402
from comfyui_lingbot_world.pipeline.decode import decode  # noqa: E402
from comfyui_lingbot_world.pipeline.experts import DiskExperts, load_expert  # noqa: E402
from comfyui_lingbot_world.pipeline.image import encode_image  # noqa: E402
from comfyui_lingbot_world.pipeline.memory import release_module  # noqa: E402
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, expert_for, sample  # noqa: E402
from comfyui_lingbot_world.wan.scheduler import make_sampler  # noqa: E402
from comfyui_lingbot_world.wan.runtime.switches import FUSED, SWITCHES  # noqa: E402
from comfyui_lingbot_world.pipeline.text import encode_text  # noqa: E402
from kernel_floor import block_floor_ms  # noqa: E402
from memwatch import GB, MemoryWatch, read_status  # noqa: E402

PROMPT = "A slow flight through a fantasy jungle towards an ancient castle, waterfalls in the distance."


def cap_vram(cap_gb: float | None) -> None:
    if cap_gb:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gb * GB / total))


def sync() -> None:
    """Wait for queued GPU work (timings); nothing to wait for on the CPU."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StepTimer:
    """The sampler's ``on_step``: each step's wall time, the GPU synchronized at every step.

    ``start()`` right before sampling; ``seconds`` then holds one entry per step."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._last = 0.0

    def start(self) -> float:
        sync()
        self._last = time.perf_counter()
        return self._last

    def __call__(self, i: int, n: int) -> None:
        sync()
        now = time.perf_counter()
        self.seconds.append(now - self._last)
        self._last = now


def base_record(args: argparse.Namespace) -> dict:
    return {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "vram_cap_gb": args.vram_cap_gb,
        "torch": torch.__version__,
        "env": env_record(),
    }


def env_record() -> dict:
    """The pack's settings that the environment changes, as this run had them (None: unset)."""
    return {name: os.environ.get(name) for name in SWITCHES}


class TimedExperts(DiskExperts):
    """DiskExperts that records how long each load and release takes."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.events: list[tuple[str, str, float]] = []

    def acquire(self, name: str):
        if name in self._resident:
            return self._resident[name]
        sync()
        started = time.perf_counter()
        model = super().acquire(name)
        sync()
        self.events.append(("acquire", name, time.perf_counter() - started))
        return model

    def release(self, name: str) -> None:
        started = time.perf_counter()
        super().release(name)
        self.events.append(("release", name, time.perf_counter() - started))


def add_run_arguments(p: argparse.ArgumentParser, steps: int) -> None:
    """The options of one generation that every benchmark of a whole run shares."""
    p.add_argument("--size", default="480x832")
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--shift", type=float, default=10.0)
    p.add_argument("--vram-cap-gb", type=float, default=None)
    p.add_argument("--block-swap", type=int, default=0, help="DiT blocks kept on the GPU (0 = all)")
    p.add_argument("--decode-tile", type=int, default=0)
    p.add_argument("--image")
    p.add_argument("--camera-dir", help="folder with poses.npy and intrinsics.npy (default: an orbit preset)")


def bench_camera_path(args: argparse.Namespace) -> CameraPath:
    """--camera-dir's poses.npy and intrinsics.npy, or the orbit preset."""
    if args.camera_dir:
        return path_from_files(Path(args.camera_dir) / "poses.npy", Path(args.camera_dir) / "intrinsics.npy")
    return path_from_preset("orbit_left", 1.0, args.frames)


def run_pipeline(args: argparse.Namespace) -> dict:
    height, width = (int(v) for v in args.size.split("x"))
    files = find_package(args.package)
    config = read_config(files.high)
    record = base_record(args) | {"size": args.size, "frames": args.frames, "steps": args.steps,
                                  "block_swap": args.block_swap, "batch_cfg": not args.no_batch_cfg,
                                  "fused_kernels": FUSED()}
    cap_vram(args.vram_cap_gb)
    device = torch.device("cuda")
    # A small card encodes the prompt on the CPU: umT5-XXL alone is 10.6 GB in bf16.
    text_device = torch.device(args.text_device) if args.text_device else device
    record["text_device"] = str(text_device)
    from PIL import Image
    from comfyui_lingbot_world.loaders.image_file import open_image  # upright, as Load Image

    image = open_image(args.image) if args.image else Image.fromarray(
        np.random.default_rng(0).integers(0, 255, (720, 1280, 3), dtype=np.uint8))
    with MemoryWatch() as watch, tempfile.TemporaryDirectory(prefix="lingbot-bench-cache-") as cache:
        cache_dir = Path(cache)
        with watch.phase("text_encode"):
            text = encode_text(files.t5, files.tokenizer, PROMPT, "", text_device, cache_dir=cache_dir)
        with watch.phase("text_encode_cached") as ph:
            again = encode_text(files.t5, files.tokenizer, PROMPT, "", text_device, cache_dir=cache_dir)
            ph["encoder_skipped"] = float(again.from_cache)
        with watch.phase("vae_encode"):
            condition = encode_image(files.vae, image, args.frames, height, width, device)
        with watch.phase("camera"):
            camera = camera_condition(bench_camera_path(args), args.frames, height, width)
        experts = TimedExperts(files.high, files.low, device, blocks_on_gpu=args.block_swap or None)
        timer = StepTimer()
        params = SamplingParams(steps=args.steps, shift=args.shift, seed=0, batch_cfg=not args.no_batch_cfg)
        with watch.phase("sampling") as ph:
            timer.start()
            latent = sample(experts, text, condition, camera, params, on_step=timer)
        with watch.phase("vae_decode"):
            video = decode(files.vae, latent, device, tile=args.decode_tile or None)
        record["video_shape"] = list(video.shape)
        record["video_finite"] = bool(torch.isfinite(video).all())

    record |= sampling_record(experts, timer.seconds, params, watch)
    if args.kernel_floor:
        tokens = condition.y.shape[1] * (condition.y.shape[2] // 2) * (condition.y.shape[3] // 2)
        floor = block_floor_ms(tokens, config.dim, config.ffn_dim, config.num_heads, camera=True)
        record["tokens"] = tokens
        record["kernel_floor_block"] = floor
        record["kernel_floor_s_per_step"] = floor["block_ms"] * config.num_layers * 2 / 1000.0  # CFG: 2 forwards
        if record["s_per_step"]:
            record["ratio_to_floor"] = record["s_per_step"] / record["kernel_floor_s_per_step"]
    return record


def sampling_record(experts: TimedExperts, step_times: list[float], params: SamplingParams,
                    watch: MemoryWatch) -> dict:
    """Per-step times, expert loads/switch, and the memory peaks of a pipeline run."""
    record: dict = {}
    loads = [e for e in experts.events if e[0] == "acquire"]
    releases = [e for e in experts.events if e[0] == "release"]
    # A step that follows a load includes it; steady steps are the others.
    load_time = {e[1]: e[2] for e in loads}
    timesteps = make_sampler(params.sampler, params.steps, params.shift).timesteps.tolist()
    names = [expert_for(t, params.boundary) for t in timesteps]
    first_of = {names.index(n) for n in set(names)}
    steady = [t for i, t in enumerate(step_times) if i not in first_of]
    record["step_seconds"] = step_times
    record["expert_names"] = names
    record["s_per_step"] = statistics.median(steady) if steady else None
    record["time_to_first_step_s"] = step_times[0] if step_times else None
    record["expert_load_s"] = load_time
    record["expert_switch_s"] = (releases[0][2] + load_time.get("low", 0.0)) if len(loads) > 1 else None
    record["phases"] = watch.phases
    record["peak_rss_anon_gb"] = watch.peak_anon / GB
    record["peak_rss_file_gb"] = watch.peak_file / GB
    record["peak_vram_allocated_gb"] = max(p.get("peak_vram_allocated_gb", 0) for p in watch.phases.values())
    record["peak_vram_reserved_gb"] = max(p.get("peak_vram_reserved_gb", 0) for p in watch.phases.values())
    record["sampling_peak_vram_allocated_gb"] = watch.phases["sampling"].get("peak_vram_allocated_gb")
    return record


def run_load_expert(args: argparse.Namespace) -> dict:
    """Load the package's high-noise expert (any layout) to CUDA twice (the second from page
    cache), then once more from the page cache the way safetensors copies to CUDA by itself
    (no pinned staging); peak RssAnon."""
    files = find_package(args.package)
    record = base_record(args) | {"mode": "load-expert", "file_gb": sum(
        p.stat().st_size for p in files.high.iterdir()) / GB}
    with MemoryWatch() as watch:
        for label in ("first", "page_cache", "page_cache_unstaged"):
            unstaged = label.endswith("unstaged")
            original = tensor_source.make_uploader
            if unstaged:
                tensor_source.make_uploader = lambda device: None
            try:
                with watch.phase(f"load_{label}"):
                    model = load_expert(files.high, "cuda")
                    sync()
            finally:
                tensor_source.make_uploader = original
            release_module(model)
            del model
    record["phases"] = watch.phases
    record["load_s"] = {k: v["seconds"] for k, v in watch.phases.items()}
    record["peak_rss_anon_gb"] = watch.peak_anon / GB
    record["peak_rss_file_gb"] = watch.peak_file / GB
    return record


def run_naive_load(args: argparse.Namespace) -> dict:
    """The community recipe's way: read the whole file into RAM, build on the CPU, move to GPU."""
    import bitsandbytes as bnb
    from safetensors.torch import load as load_bytes

    from comfyui_lingbot_world.wan.model import LingBotDiT

    files = find_package(args.package)
    weights = require_layout(files.high, "nf4") / NF4_WEIGHTS_FILE  # the community recipe reads NF4 only
    config = read_config(files.high)
    record = base_record(args) | {"mode": "naive-load", "file_gb": weights.stat().st_size / GB}
    suffix = ".weight.quant_state.bitsandbytes__nf4"
    with MemoryWatch() as watch:
        with watch.phase("naive_load"):
            state = load_bytes(weights.read_bytes())  # the whole file read into RAM, then parsed
            with torch.device("meta"):
                model = LingBotDiT(config).to(torch.bfloat16)
            model = model.to_empty(device="cpu")  # a CPU skeleton, filled from the state dict below
            quantized = [k[: -len(suffix)] for k in state if k.endswith(suffix)]
            for name in quantized:
                linear = model.get_submodule(name)
                layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                                          compute_dtype=torch.bfloat16, quant_type="nf4", device="cpu")
                stats = {k[len(name) + len(".weight."):]: v for k, v in state.items() if k.startswith(f"{name}.weight.")}
                layer.weight = bnb.nn.Params4bit.from_prequantized(state[f"{name}.weight"], stats, requires_grad=False,
                                                                   device="cpu", module=layer)
                if linear.bias is not None:
                    layer.bias = torch.nn.Parameter(state[f"{name}.bias"], requires_grad=False)
                model.set_submodule(name, layer)
            quantized_set = set(quantized)
            plain = {k: v for k, v in state.items()
                     if k.rsplit(".", 1)[0] not in quantized_set and k.split(".weight.")[0] not in quantized_set}
            model.load_state_dict(plain, strict=False, assign=True)
            model = model.to("cuda")
            torch.cuda.synchronize()
    record["phases"] = watch.phases
    record["load_s"] = watch.phases["naive_load"]["seconds"]
    record["peak_rss_anon_gb"] = watch.peak_anon / GB
    return record


def run_soak(args: argparse.Namespace) -> dict:
    """N whole runs in one process (the prompt changes, so T5 loads every time): memory
    after each run, to show nothing creeps. The pipeline is the one the nodes call."""
    from PIL import Image

    from comfyui_lingbot_world.pipeline.generate import generate
    from comfyui_lingbot_world.pipeline.memory import empty_device_cache

    height, width = (int(v) for v in args.size.split("x"))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8))
    camera = bench_camera_path(args)
    record = base_record(args) | {"mode": "soak", "size": args.size, "frames": args.frames, "steps": args.steps,
                                  "runs": []}
    for run in range(args.runs):
        started = time.perf_counter()
        pieces: list[torch.Tensor] = []
        generate(args.package, image, f"{PROMPT} Take {run}.", "", args.frames, height, width, pieces.append, camera,
                 SamplingParams(steps=args.steps, shift=args.shift, seed=run), device="cuda")
        video = torch.cat(pieces, dim=1)
        empty_device_cache()
        used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True).stdout.split()[0]
        status = read_status()
        record["runs"].append({"seconds": time.perf_counter() - started, "finite": bool(torch.isfinite(video).all()),
                               "rss_anon_gb": status["RssAnon"] / GB, "vram_allocated_gb": torch.cuda.memory_allocated() / GB,
                               "vram_reserved_gb": torch.cuda.memory_reserved() / GB, "nvidia_smi_used_mib": int(used)})
    first, last = record["runs"][0], record["runs"][-1]
    record["rss_anon_growth"] = last["rss_anon_gb"] / first["rss_anon_gb"] - 1
    record["nvidia_smi_growth"] = last["nvidia_smi_used_mib"] / first["nvidia_smi_used_mib"] - 1
    return record


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=("pipeline", "load-expert", "naive-load", "soak"))
    p.add_argument("--package", required=True)
    p.add_argument("--out", required=True)
    add_run_arguments(p, steps=4)
    p.add_argument("--kernel-floor", action="store_true")
    p.add_argument("--runs", type=int, default=5, help="soak: number of whole runs")
    p.add_argument("--no-batch-cfg", action="store_true", help="run the two CFG branches as separate passes")
    p.add_argument("--text-device", help="where the text encoder runs (default: the GPU)")
    args = p.parse_args()
    runner = {"pipeline": run_pipeline, "load-expert": run_load_expert, "naive-load": run_naive_load,
              "soak": run_soak}[args.mode]
    try:
        record = runner(args)
    except torch.cuda.OutOfMemoryError as exc:
        record = base_record(args) | {"mode": args.mode, "size": args.size, "frames": args.frames, "oom": str(exc)[:500]}
    Path(args.out).write_text(json.dumps(record, indent=2, default=str))
    print(json.dumps({k: v for k, v in record.items() if not isinstance(v, (dict, list))}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
