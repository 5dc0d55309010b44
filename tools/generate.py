"""Generate a video from a LingBot-World package without ComfyUI.

    python <checkout> generate --package DIR --image IMG --prompt "..." --out video.mp4 \\
        [--camera-dir DIR_WITH_poses.npy | --preset dolly_in] [--frames 81] [--size 480x832]

Every argument is checked before a model loads; a mistake answers in one line.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from ..loaders.package import find_package
from ..pipeline.run import CameraRequest, generate
from ..pipeline.sampling import SamplingParams
from ..pipeline.video_file import write_mp4
from ..wan.camera import PRESETS
from ..wan.conditioning import check_frame_count, check_size, target_size
from ..wan.negative_prompt import DEFAULT_NEGATIVE_PROMPT
from . import cli

DEFAULT_AREA = 480 * 832


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = cli.ArgumentParser(prog="generate", description=__doc__)
    p.add_argument("--package", required=True, type=Path,
                   help="folder of the LingBot-World package (layout A: *_bnb_nf4 experts, or B: bf16)")
    p.add_argument("--image", required=True, type=Path, help="first frame (any image Pillow reads)")
    p.add_argument("--prompt", help="text prompt (or --prompt-file)")
    p.add_argument("--prompt-file", type=Path, help="UTF-8 text file holding the prompt")
    p.add_argument("--negative-prompt", default=DEFAULT_NEGATIVE_PROMPT,
                   help="what to steer away from (default and when empty: the negative prompt the model was tuned with)")
    p.add_argument("--out", required=True, type=Path, help="output .mp4 (its folder must exist)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    cam = p.add_mutually_exclusive_group()
    cam.add_argument("--camera-dir", type=Path, help="folder with poses.npy and intrinsics.npy")
    cam.add_argument("--preset", choices=PRESETS, help="a built-in camera move")
    p.add_argument("--speed", type=float, default=1.0, help="how far a preset pans, tilts or orbits")
    p.add_argument("--frames", type=int, default=81, help="frames to generate: 4n+1")
    p.add_argument("--size", help="HEIGHTxWIDTH, multiples of 16 (default: 480*832 pixels at the image's "
                   "aspect ratio)")
    p.add_argument("--steps", type=int, default=40, help="denoising steps (the reference uses 70)")
    p.add_argument("--shift", type=float, default=10.0, help="flow-matching sigma shift")
    p.add_argument("--cfg", type=float, nargs=2, default=(5.0, 5.0), metavar=("HIGH", "LOW"),
                   help="guidance scale of the high- and low-noise expert")
    p.add_argument("--boundary", type=float, default=0.947, help="expert switch at timestep boundary*1000")
    p.add_argument("--seed", type=int, default=0, help="seed of the starting noise")
    p.add_argument("--sampler", choices=("unipc", "euler"), default="unipc", help="flow-matching solver")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--quantize", choices=("nf4",), help="quantize bf16 experts (layout B) while loading")
    p.add_argument("--decode-tile", type=int, default=0, help="latent tile size for decoding (0 = whole frame)")
    p.add_argument("--cache-dir", type=Path, help="prompt-embedding cache folder")
    p.add_argument("--fps", type=int, default=16, help="frame rate of the .mp4")
    return p.parse_args(argv)


def _size(args: argparse.Namespace, image_w: int, image_h: int) -> tuple[int, int]:
    if not args.size:
        return target_size(image_w, image_h, DEFAULT_AREA)
    parts = args.size.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise cli.UsageError("--size", f"{args.size!r} is not HEIGHTxWIDTH (e.g. 480x832)")
    height, width = (int(p) for p in parts)
    try:
        check_size(height, width)
    except ValueError as exc:
        raise cli.UsageError("--size", f"{exc} (e.g. 480x832)") from None
    return height, width


def _prompt(args: argparse.Namespace) -> str:
    if args.prompt_file:
        cli.existing_file(args.prompt_file, "--prompt-file", "prompt file")
        try:
            return args.prompt_file.read_text(encoding="utf-8").strip()
        except UnicodeDecodeError:
            raise cli.UsageError("--prompt-file", f"{args.prompt_file} is not UTF-8 text") from None
    if args.prompt is None:
        raise cli.UsageError("--prompt", "give --prompt or --prompt-file")
    return args.prompt


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # Everything a user can get wrong is checked here, before the first model loads.
    prompt = _prompt(args)
    cli.output_file(args.out, "--out", ".mp4", args.overwrite)
    cli.existing_dir(args.package, "--package", "package folder")
    find_package(args.package)  # names every missing file at once
    image = cli.open_image(args.image, "--image")
    height, width = _size(args, image.width, image.height)
    try:
        check_frame_count(args.frames)
    except ValueError as exc:
        raise cli.UsageError("--frames", str(exc)) from None
    if args.camera_dir:
        cli.existing_dir(args.camera_dir, "--camera-dir", "camera folder")
    for flag, value in (("--decode-tile", args.decode_tile), ("--fps", args.fps)):
        if value < 0 or (flag == "--fps" and value == 0):
            raise cli.UsageError(flag, f"must be {'positive' if flag == '--fps' else '0 or positive'}; got {value}")
    camera = None
    if args.camera_dir or args.preset:
        camera = CameraRequest(folder=args.camera_dir, preset=args.preset, speed=args.speed)
        camera.build(args.frames, height, width)  # cheap: a bad pose file fails now
    try:
        params = SamplingParams(steps=args.steps, shift=args.shift, guide_high=args.cfg[0], guide_low=args.cfg[1],
                                boundary=args.boundary, seed=args.seed, sampler=args.sampler)
    except ValueError as exc:  # its messages start with the field: "steps must be ..."
        raise cli.UsageError("--" + str(exc).split(" ", 1)[0], str(exc)) from None
    started = time.perf_counter()
    video = generate(args.package, image, prompt, args.negative_prompt, args.frames, height, width, camera, params,
                     device=args.device, cache_dir=args.cache_dir, quantize=args.quantize,
                     decode_tile=args.decode_tile or None,
                     on_step=lambda i, n: print(f"step {i}/{n}", file=sys.stderr, flush=True))
    write_mp4(video, args.out, fps=args.fps)
    print(f"wrote {args.out} ({video.shape[1]} frames, {width}x{height}) in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run("generate", main))
