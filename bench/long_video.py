"""Benchmark long videos (chained windows, streamed to an .mp4) at several lengths.

    python bench/long_video.py --package DIR --frames 81 321 961 --steps 4 \
        --vram-cap-gb 24 --out $OUT/long_video.json

Each frame count runs in its own process (so each peak RssAnon is its own) through the
functions the CLI uses (``pipeline.long_video``): T5 encode, then per window sampling
across the expert switch, VAE decode of the window, VAE encode of the next window's start,
frames written to the .mp4. The JSON holds one record per run with ``frames``, ``windows``,
``time_to_video_s`` (process start of the run to the closed .mp4, T5 included),
``s_per_frame`` (time_to_video_s / frames), ``peak_vram_allocated_gb``,
``peak_rss_anon_gb``, per-window timings and expert loads, and a summary comparing every
length to the first (s_per_frame ratio, peak VRAM difference).

At 40 steps 961 frames take over an hour on an H100; the cost per output frame does not
depend on the step count much beyond the per-window fixed costs (2 expert loads, one VAE
decode and encode), so a few steps measure the ratio that matters. Runs on the CPU with a
tiny package (``python . make_checkpoint --preset tiny --layout nf4 --out DIR``) and
``--device cpu --size 32x48`` as a smoke test.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import _pack  # noqa: F401  (bench/_pack.py: the checkout as comfyui_lingbot_world, before any pack import)
from comfyui_lingbot_world.loaders.package import find_package  # noqa: E402
from comfyui_lingbot_world.pipeline import long_video as lv  # noqa: E402
from comfyui_lingbot_world.wan.camera_actions import cut_actions  # noqa: E402
from comfyui_lingbot_world.pipeline.camera import path_from_actions  # noqa: E402
from comfyui_lingbot_world.pipeline.experts import DiskExperts  # noqa: E402
from comfyui_lingbot_world.pipeline.sampling import SamplingParams  # noqa: E402
from comfyui_lingbot_world.pipeline.text import encode_text  # noqa: E402
from comfyui_lingbot_world.pipeline.video_file import VideoWriter, to_uint8_frames  # noqa: E402
from memwatch import GB, MemoryWatch  # noqa: E402

PROMPT = "A slow walk along a forest path towards an old stone bridge, sunlight through the trees."
# 961 frames of walking: forward, look around, turn, strafe, forward (wraps as needed).
# A long scripted walk, cut to the video (the camera refuses a string longer than the video).
ACTIONS = "w-120,l-30,w-120,j-45,w-100,d-40,w-120,i-10,k-10,w-100,l-20,s-20,w-125,j-30,w-70"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def cap_vram(cap_gb: float | None, device: torch.device) -> None:
    if cap_gb and device.type == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gb * GB / total))


class TimedExperts(DiskExperts):
    """DiskExperts recording each load's seconds (device-agnostic)."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.loads: list[tuple[str, float]] = []

    def acquire(self, name: str):
        if name in self._resident:
            return self._resident[name]
        _sync(self.device)
        started = time.perf_counter()
        model = super().acquire(name)
        _sync(self.device)
        self.loads.append((name, time.perf_counter() - started))
        return model


class RawWriter:
    """Where PyAV is not installed (the bare GPU machine): the same streaming, frames as
    raw rgb24 (``ffmpeg -f rawvideo -pix_fmt rgb24 -s WxH -r 16 -i FILE``) instead of H.264."""

    def __init__(self, path: Path, fps: int = 16) -> None:
        self.path, self.frames_written = path, 0
        self._file = open(path, "wb")

    def write(self, video: torch.Tensor) -> None:
        for start in range(0, video.shape[1], 16):
            frames = to_uint8_frames(video[:, start:start + 16])
            self._file.write(frames.tobytes())
            self.frames_written += len(frames)

    def __enter__(self) -> "RawWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()


def open_writer(out_dir: Path, frames: int) -> VideoWriter | RawWriter:
    try:
        import av  # noqa: F401
    except ImportError:
        return RawWriter(out_dir / f"long_{frames}.rgb")
    return VideoWriter(out_dir / f"long_{frames}.mp4", fps=16)


def run_one(args: argparse.Namespace) -> dict:
    frames = args.frames[0]
    height, width = (int(v) for v in args.size.lower().split("x"))
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    files = find_package(args.package)
    cap_vram(args.vram_cap_gb, device)
    windows = lv.WindowParams(window=args.window, overlap=args.overlap)
    from PIL import Image
    from comfyui_lingbot_world.loaders.image_file import open_image  # upright, as Load Image

    image = open_image(args.image) if args.image else Image.fromarray(
        np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8))
    camera = path_from_actions(cut_actions(ACTIONS, frames), frames, height, width)
    params = SamplingParams(steps=args.steps, shift=args.shift, seed=0, batch_cfg=not args.no_batch_cfg)
    record: dict = {
        "frames": frames, "size": args.size, "steps": args.steps, "window": args.window, "overlap": args.overlap,
        "vram_cap_gb": args.vram_cap_gb, "keep_experts": args.keep_experts, "device": str(device),
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        "torch": torch.__version__, "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
    }
    out_dir = Path(args.video_dir or tempfile.mkdtemp(prefix="lingbot-long-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    window_times: list[float] = []
    marks = [0.0]
    experts = TimedExperts(files.high, files.low, device, blocks_on_gpu=args.block_swap or None,
                           keep_resident=args.keep_experts)
    started = time.perf_counter()
    with MemoryWatch() as watch:
        with watch.phase("text_encode"), tempfile.TemporaryDirectory(prefix="lingbot-bench-cache-") as cache:
            text = encode_text(files.t5, files.tokenizer, PROMPT, "", device, cache_dir=Path(cache))
        windowed = lv.WindowedCamera(camera, frames, height, width)

        def on_window(i: int, n: int) -> None:
            _sync(device)
            now = time.perf_counter()
            window_times.append(now - marks[0])
            marks[0] = now

        try:
            with watch.phase("windows") as phase, open_writer(out_dir, frames) as writer:
                marks[0] = time.perf_counter()
                result = lv.sample_windows(experts, text, files.vae, image, frames, height, width, windowed, params,
                                           windows, writer.write, device=device,
                                           decode_tile=args.decode_tile or None, on_window=on_window)
                phase["frames_written"] = writer.frames_written
        finally:
            experts.close()
    elapsed = time.perf_counter() - started
    record.update({
        "windows": len(result.windows),
        "frames_written": result.frames_written,
        "time_to_video_s": elapsed,
        "s_per_frame": elapsed / frames,
        "windows_s": watch.phases["windows"]["seconds"],
        "windows_s_per_frame": watch.phases["windows"]["seconds"] / frames,
        "window_seconds": window_times,
        "expert_loads": len(experts.loads),
        "expert_load_s": sum(s for _, s in experts.loads),
        "peak_rss_anon_gb": watch.peak_anon / GB,
        "peak_rss_file_gb": watch.peak_file / GB,
        "phases": watch.phases,
        "video_file": writer.path.suffix.lstrip("."),
        "video_bytes": writer.path.stat().st_size,
    })
    vram = [p.get("peak_vram_allocated_gb") for p in watch.phases.values() if "peak_vram_allocated_gb" in p]
    record["peak_vram_allocated_gb"] = max(vram) if vram else None
    record["windows_peak_vram_allocated_gb"] = watch.phases["windows"].get("peak_vram_allocated_gb")
    if not args.keep_video:
        writer.path.unlink()
    return record


def run_all(args: argparse.Namespace) -> dict:
    """Each frame count in a child process of this script; a summary against the first."""
    runs = []
    for frames in args.frames:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            child_out = tmp.name
        argv = [sys.executable, __file__, *_child_args(args, frames, child_out)]
        print(f"=== {frames} frames: {' '.join(shlex.quote(a) for a in argv)}", file=sys.stderr, flush=True)
        proc = subprocess.run(argv, env=os.environ.copy())
        try:
            runs.append(json.loads(Path(child_out).read_text()))
        except (OSError, ValueError):
            runs.append({"frames": frames, "error": f"child exited with {proc.returncode}"})
        print(json.dumps({k: v for k, v in runs[-1].items() if not isinstance(v, (dict, list))}), flush=True)
    summary = {"runs": runs}
    base = runs[0]
    if "s_per_frame" in base:
        summary["compare_to_frames"] = base["frames"]
        summary["s_per_frame_ratio"] = {r["frames"]: r["s_per_frame"] / base["s_per_frame"]
                                        for r in runs if "s_per_frame" in r}
        if base.get("peak_vram_allocated_gb") is not None:
            summary["peak_vram_delta_gb"] = {r["frames"]: r["peak_vram_allocated_gb"] - base["peak_vram_allocated_gb"]
                                             for r in runs if r.get("peak_vram_allocated_gb") is not None}
        summary["peak_rss_anon_gb"] = {r["frames"]: r["peak_rss_anon_gb"] for r in runs if "peak_rss_anon_gb" in r}
    return summary


def _child_args(args: argparse.Namespace, frames: int, out: str) -> list[str]:
    argv = ["--package", str(args.package), "--frames", str(frames), "--out", out, "--single",
            "--size", args.size, "--steps", str(args.steps), "--shift", str(args.shift), "--window", str(args.window),
            "--overlap", str(args.overlap), "--device", args.device, "--decode-tile", str(args.decode_tile),
            "--block-swap", str(args.block_swap)]
    for flag, value in (("--vram-cap-gb", args.vram_cap_gb), ("--image", args.image), ("--video-dir", args.video_dir)):
        if value is not None:
            argv += [flag, str(value)]
    for flag, on in (("--keep-experts", args.keep_experts), ("--keep-video", args.keep_video),
                     ("--no-batch-cfg", args.no_batch_cfg)):
        if on:
            argv.append(flag)
    return argv


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--package", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--frames", type=int, nargs="+", default=[81, 321, 961])
    p.add_argument("--size", default="480x832")
    p.add_argument("--steps", type=int, default=4, help="sampling steps per window (40 is the quality setting)")
    p.add_argument("--shift", type=float, default=10.0)
    p.add_argument("--window", type=int, default=81)
    p.add_argument("--overlap", type=int, default=1)
    p.add_argument("--vram-cap-gb", type=float, default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--decode-tile", type=int, default=0)
    p.add_argument("--block-swap", type=int, default=0)
    p.add_argument("--image")
    p.add_argument("--keep-experts", action="store_true", help="both experts resident between windows")
    p.add_argument("--no-batch-cfg", action="store_true")
    p.add_argument("--video-dir", help="where the .mp4 files go (default: a temporary folder)")
    p.add_argument("--keep-video", action="store_true")
    p.add_argument("--single", action="store_true", help=argparse.SUPPRESS)  # a child: one frame count
    args = p.parse_args()
    if args.single:
        try:
            record = run_one(args)
        except torch.cuda.OutOfMemoryError as exc:
            record = {"frames": args.frames[0], "size": args.size, "oom": str(exc)[:500]}
        Path(args.out).write_text(json.dumps(record, indent=2, default=str))
        return 0
    summary = run_all(args)
    Path(args.out).write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
