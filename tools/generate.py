"""Generate a video from a LingBot-World package without ComfyUI.

    python <checkout> generate --package DIR --image IMG --prompt "..." --out video.mp4 \
        [--camera-dir DIR_WITH_poses.npy | --preset dolly_in] [--frames 81] [--size 480x832]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from PIL import Image

from ..pipeline.lora import LoraSpec
from ..pipeline.presets import PRESETS as SAMPLING_PRESETS, apply_preset
from ..pipeline.run import CameraRequest, generate
from ..pipeline.sampling import SamplingParams
from ..wan.attention import CHOICES as ATTENTION_CHOICES
from ..pipeline.video_file import write_mp4
from ..wan.camera import PRESETS
from ..wan.conditioning import target_size
from ..wan.negative_prompt import DEFAULT_NEGATIVE_PROMPT


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="generate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--package", required=True, type=Path, help="folder of the LingBot-World package (layout A or B)")
    p.add_argument("--image", required=True, type=Path)
    p.add_argument("--prompt", help="text prompt (or --prompt-file)")
    p.add_argument("--prompt-file", type=Path)
    p.add_argument("--negative-prompt", default=DEFAULT_NEGATIVE_PROMPT)
    p.add_argument("--out", required=True, type=Path, help="output .mp4")
    cam = p.add_mutually_exclusive_group()
    cam.add_argument("--camera-dir", type=Path, help="folder with poses.npy and intrinsics.npy")
    cam.add_argument("--preset", choices=PRESETS)
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--size", help="HEIGHTxWIDTH; default: 480*832 pixels at the image's aspect ratio")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--shift", type=float, default=10.0)
    p.add_argument("--cfg", type=float, nargs=2, default=(5.0, 5.0), metavar=("HIGH", "LOW"))
    p.add_argument("--boundary", type=float, default=0.947)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sampler", choices=("unipc", "euler"), default="unipc")
    p.add_argument("--device", default="auto")
    p.add_argument("--quantize", choices=("nf4",), help="quantize bf16 experts (layout B) on load")
    p.add_argument("--decode-tile", type=int, default=0, help="latent tile size for decoding (0 = whole frame)")
    p.add_argument("--cache-dir", type=Path, help="prompt-embedding cache folder")
    p.add_argument("--fps", type=int, default=16)
    fast = p.add_argument_group("fast mode (all off by default)")
    fast.add_argument("--cache-threshold", type=float, default=0.0,
                      help="EasyCache threshold (0 = off; the authors use 0.05 for Wan2.2 I2V)")
    fast.add_argument("--cfg-truncate", type=float, default=0.0,
                      help="fraction of the last steps without the negative-prompt pass (0 = off)")
    fast.add_argument("--attention", choices=ATTENTION_CHOICES, help="attention kernel (default: the process default)")
    fast.add_argument("--sampling-preset", choices=SAMPLING_PRESETS, default="none",
                      help="lightning_4step: the Wan2.2-Lightning 4-step settings (use with its LoRAs)")
    fast.add_argument("--lora", nargs=3, action="append", default=[], metavar=("FILE", "HIGH", "LOW"),
                      help="a LoRA file and its strength on the high- and low-noise experts (repeatable)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prompt = args.prompt_file.read_text(encoding="utf-8").strip() if args.prompt_file else args.prompt
    if not prompt:
        print("error: give --prompt or --prompt-file", file=sys.stderr)
        return 2
    image = Image.open(args.image)
    if args.size:
        height, width = (int(v) for v in args.size.lower().split("x"))
    else:
        height, width = target_size(image.width, image.height, 480 * 832)
    camera = None
    if args.camera_dir or args.preset:
        camera = CameraRequest(folder=args.camera_dir, preset=args.preset, speed=args.speed)
    params = SamplingParams(steps=args.steps, shift=args.shift, guide_high=args.cfg[0], guide_low=args.cfg[1],
                            boundary=args.boundary, seed=args.seed, sampler=args.sampler,
                            cache_threshold=args.cache_threshold, cfg_truncate=args.cfg_truncate,
                            attention=args.attention)
    params = apply_preset(args.sampling_preset, params)
    loras = [LoraSpec(Path(f), float(high), float(low)) for f, high, low in args.lora]
    started = time.perf_counter()
    video = generate(args.package, image, prompt, args.negative_prompt, args.frames, height, width, camera, params,
                     device=args.device, cache_dir=args.cache_dir, quantize=args.quantize,
                     decode_tile=args.decode_tile or None, loras=loras,
                     on_step=lambda i, n: print(f"step {i}/{n}", file=sys.stderr, flush=True))
    write_mp4(video, args.out, fps=args.fps)
    print(f"wrote {args.out} ({video.shape[1]} frames, {width}x{height}) in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
