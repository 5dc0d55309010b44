"""Generate a video from a LingBot-World package without ComfyUI.

    python <checkout> generate --package DIR --image IMG --prompt "..." --out video.mp4 \\
        [--camera-dir DIR_WITH_poses.npy | --preset dolly_in | --actions w-20,j-10,w-30 |
         --poses-from VIPE_OUTPUT_OR_EXPORT] [--frames 81 (up to 961)] [--size 480x832]

Videos longer than --window frames (81) are made of chained windows, each starting on the
last --overlap frames of the one before (docs/long_videos.md), and written to the .mp4 as
each window finishes: a new file beside --out that takes its name after the first window, so
Ctrl-C keeps the finished windows; an existing --out (with --overwrite) is replaced only by the
whole new video. Action strings: KEYS-FRAMES tokens,
W/A/S/D move, I/J/K/L look, "none" holds (wan/camera_actions.py); the official act2cam
camera, never longer than --frames (a shorter string is padded with frames without keys).

Base-Cam or Act is told by the package's weights. An Act package follows --actions (its
W/A/S/D keys) or --camera-dir with action.npy beside poses.npy; a Base-Cam package ignores
action.npy. Presets and pose exports drive Base-Cam only.

Every argument is checked before a model loads; a mistake answers in one line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from PIL import Image

from ..loaders.dit_weights import build_on_meta
from ..loaders.expert_config import read_expert_config, read_expert_pair
from ..loaders.lora import read_lora
from ..loaders.package import find_package
from ..loaders.pose_import import CAMERA_AXES
from ..loaders.trajectory import ACTION_FILE, read_intrinsics_row
from ..pipeline import camera as camera_stage
from ..loaders.new_file import GrowingFile, new_file
from ..pipeline.camera_preview import draw_trajectory
from ..pipeline.experts import AS_STORED, WEIGHT_CHOICES, weight_kind_for
from ..pipeline.generate import generate
from ..pipeline.memory import resolve_device
from ..pipeline.long_video import WindowParams
from ..pipeline.lora import LoraSpec
from ..pipeline.sampler_presets import PRESET_FRAMES, SAMPLER_PRESETS, apply_preset
from ..pipeline.sampling import SamplingParams
from ..wan.runtime.attention import CHOICES as ATTENTION_CHOICES
from ..wan.camera_presets import CAMERA_PRESETS
from ..wan.camera_actions import frames_for_actions
from ..wan.conditioning import check_frame_count, check_size, far_aspect, target_size
from ..wan.geometry import TRAINED_SIZE
from ..wan.long_video import plan_windows, window_cuts
from ..wan.negative_prompt import DEFAULT_NEGATIVE_PROMPT
from ..wan.scheduler import SAMPLERS
from . import cli

DEFAULT_AREA = TRAINED_SIZE[0] * TRAINED_SIZE[1]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = cli.ArgumentParser(prog="generate", description=__doc__)
    p.add_argument("--package", required=True, type=Path,
                   help="folder of the LingBot-World package: the NF4 one (*_bnb_nf4 expert folders), an fp8 one "
                   "(*_fp8, from quantize --format fp8) or the official bf16 release (high_noise_model/, "
                   "low_noise_model/)")
    p.add_argument("--image", required=True, type=Path, help="first frame (any image Pillow reads; turned upright by "
                   "its EXIF orientation, as ComfyUI's Load Image does)")
    p.add_argument("--prompt", help="text prompt (or --prompt-file)")
    p.add_argument("--prompt-file", type=Path, help="UTF-8 text file holding the prompt")
    p.add_argument("--negative-prompt", default=DEFAULT_NEGATIVE_PROMPT,
                   help="what to steer away from (default and when empty: the negative prompt the model was tuned with)")
    p.add_argument("--out", required=True, type=Path, help="output .mp4 (its folder must exist)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists (once the whole new video is made)")
    cam = p.add_mutually_exclusive_group()
    cam.add_argument("--camera-dir", type=Path, help="folder with poses.npy and intrinsics.npy")
    cam.add_argument("--preset", choices=list(CAMERA_PRESETS), help="a built-in camera move")
    cam.add_argument("--actions", help="action string, e.g. w-20,j-10,w-30 (W/A/S/D move, I/J/K/L look, none)")
    cam.add_argument("--poses-from", type=Path,
                     help="a ViPE output folder (pose/, intrinsics/), a pose .npz, or a poses.npy (camera-to-world, OpenCV)")
    p.add_argument("--speed", type=float, default=1.0, help="how far a preset pans, tilts or orbits")
    p.add_argument("--intrinsics", type=Path,
                   help="intrinsics.npy (fx, fy, cx, cy for 480x832) for --actions; default: square pixels, ~79 deg")
    p.add_argument("--poses-name", help="clip name inside a ViPE folder with several clips")
    p.add_argument("--poses-source-size", help="HEIGHTxWIDTH of the video the poses were tracked on "
                   "(default: twice the principal point)")
    p.add_argument("--no-normalize-scale", action="store_true",
                   help="keep the export's translation units (default: median step 0.05 per frame)")
    p.add_argument("--world-to-camera", action="store_true", help="the export holds world-to-camera matrices")
    p.add_argument("--poses-axes", choices=list(CAMERA_AXES), default="opencv",
                   help="camera axes of --poses-from: opencv (x right, y down, looking down +z; ROS optical), "
                   "opengl (x right, y up, looking down -z: USD camera prims, Blender) or x_forward_z_up (Isaac "
                   "Sim's world camera axes, a robot body frame)")
    p.add_argument("--frames", type=int, default=None,
                   help="frames to generate: 4n+1, up to 961 (default: the action string's length padded to 4n+1, "
                   "or the official preset's, or 81)")
    p.add_argument("--window", type=int, default=81, help="frames per window (4n+1)")
    p.add_argument("--overlap", type=int, default=1, help="frames each window takes from the previous one (4j+1)")
    p.add_argument("--scale-quantile", type=float, default=1.0,
                   help="translation unit: this quantile of the path's steps (1 = largest step, as one pass)")
    p.add_argument("--keep-experts", action="store_true",
                   help="keep both experts loaded between windows (twice the expert memory)")
    p.add_argument("--block-swap", type=int, default=0, help="DiT blocks kept on the GPU (0 = all)")
    p.add_argument("--preview", type=Path, help="also write the camera path picture with the window cuts (.png)")
    p.add_argument("--size", help="HEIGHTxWIDTH, multiples of 16 (default: 480*832 pixels at the image's "
                   "aspect ratio)")
    p.add_argument("--steps", type=int, default=40, help="denoising steps (the reference uses 70)")
    p.add_argument("--shift", type=float, default=10.0, help="flow-matching sigma shift")
    p.add_argument("--cfg", type=float, nargs=2, default=(5.0, 5.0), metavar=("HIGH", "LOW"),
                   help="guidance scale of the high- and low-noise expert")
    p.add_argument("--boundary", type=float, default=0.947, help="expert switch at timestep boundary*1000")
    p.add_argument("--seed", type=int, default=0, help="seed of the starting noise")
    p.add_argument("--sampler", choices=SAMPLERS, default="unipc", help="flow-matching solver")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--quantize", choices=("nf4",), help="quantize the experts of the official bf16 release to "
                   "NF4 while loading")
    p.add_argument("--weights", choices=WEIGHT_CHOICES, default=AS_STORED,
                   help="the kind the experts' linear weights are held in once loaded, as the DiT loaders' weights "
                   "input: as stored (a bf16 release follows --quantize), auto (the fastest kind this GPU runs whose "
                   "weights fit beside the run; off CUDA as stored), or one of bf16, nf4, fp8, int8")
    p.add_argument("--decode-tile", type=int, default=0, help="latent tile size for decoding (0 = whole frame)")
    p.add_argument("--cache-dir", type=Path, help="prompt-embedding cache folder")
    p.add_argument("--fps", type=int, default=16, help="frame rate of the .mp4")
    speed = p.add_argument_group("step cache and speed-ups (all off by default: the exact sampler)")
    speed.add_argument("--cache-threshold", type=float, default=0.0,
                      help="EasyCache step caching threshold (0 = off; the authors use 0.05 for Wan2.2 I2V)")
    speed.add_argument("--cfg-truncate", type=float, default=0.0,
                      help="fraction of the last steps without the negative-prompt pass (0 = off)")
    speed.add_argument("--attention", choices=ATTENTION_CHOICES, default="auto",
                      help="attention kernel; auto: LINGBOT_ATTENTION when set, else the fastest one installed for "
                      "this GPU (wan/runtime/attention.py auto_backend)")
    speed.add_argument("--sampling-preset", choices=SAMPLER_PRESETS, default="none",
                      help="overrides --steps, --shift, --cfg, --boundary and --sampler. lightning_4step: the "
                      "Wan2.2-Lightning 4-step settings (use with its LoRAs); official_act2cam: the official act2cam "
                      "example (20 steps, unipc, shift 10, cfg 5 5, boundary 0.947; 121 frames unless --frames or "
                      "--actions say); official_act: the official Act settings (the same with 70 steps, 81 frames)")
    speed.add_argument("--lora", nargs=3, action="append", default=[], metavar=("FILE", "HIGH", "LOW"),
                      help="a LoRA file and its strength on the high- and low-noise experts (repeatable)")
    return p.parse_args(argv)


def _height_width(text: str, flag: str) -> tuple[int, int]:
    parts = text.lower().replace("*", "x").split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise cli.UsageError(flag, f"{text!r} is not HEIGHTxWIDTH (e.g. 480x832)")
    return int(parts[0]), int(parts[1])


def _size(args: argparse.Namespace, image_w: int, image_h: int) -> tuple[int, int]:
    if not args.size:
        height, width = target_size(image_w, image_h, DEFAULT_AREA)
        aspect = far_aspect(image_w, image_h)
        if aspect is not None:  # the picture's aspect would make a video the model never saw the like of
            trained_h, trained_w = TRAINED_SIZE
            raise cli.UsageError("--image", f"{args.image} is {aspect}; at its aspect the video would be "
                                 f"{height}x{width}. Give --size HEIGHTxWIDTH (e.g. --size {trained_h}x{trained_w}; "
                                 "the picture is stretched to it), or crop the picture")
        return height, width
    height, width = _height_width(args.size, "--size")
    try:
        check_size(height, width)
    except ValueError as exc:
        raise cli.UsageError("--size", f"{exc} (e.g. 480x832)") from None
    return height, width


def _prompt(args: argparse.Namespace) -> str:
    if args.prompt_file:
        cli.existing_file(args.prompt_file, "--prompt-file", "prompt file")
        try:  # utf-8-sig: the byte-order mark some editors put first is not part of the prompt
            prompt = args.prompt_file.read_text(encoding="utf-8-sig").strip()
        except UnicodeDecodeError:
            raise cli.UsageError("--prompt-file", f"{args.prompt_file} is not UTF-8 text") from None
        if not prompt:  # an empty value given is a mistake to answer, as an empty --actions
            raise cli.UsageError("--prompt-file", f"{args.prompt_file} holds no text; write the prompt in it, or "
                                 'give --prompt "" for a video without a prompt')
        return prompt
    if args.prompt is None:
        raise cli.UsageError("--prompt", "give --prompt or --prompt-file")
    return args.prompt


def _flag_error(flag: str, check, *values, **options):
    """Run a pack check or reader; its ValueError (CheckpointError, CameraError...) becomes a
    one-line answer naming the flag. Returns what it returns."""
    try:
        return check(*values, **options)
    except ValueError as exc:
        raise cli.UsageError(flag, str(exc)) from None


def _strength(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise cli.UsageError("--lora", f"strength {text!r} is not a number (e.g. --lora file.safetensors 1.0 1.0)") from None


def camera_path(args: argparse.Namespace, frames: int, height: int, width: int,
                control_type: str = "cam") -> camera_stage.CameraPath | None:
    """The camera path the flags describe; a missing or bad file answers naming its flag.
    ``control_type``: the package's ("cam" Base-Cam, "act" Act), which decides whether
    --camera-dir reads action.npy."""
    if args.camera_dir:
        cli.existing_dir(args.camera_dir, "--camera-dir", "camera folder")
        poses, intrinsics = args.camera_dir / "poses.npy", args.camera_dir / "intrinsics.npy"
        if control_type != "act":
            return _flag_error("--camera-dir", camera_stage.path_from_files, poses, intrinsics)
        if not (args.camera_dir / ACTION_FILE).is_file():
            raise cli.UsageError("--camera-dir", f"the package is an Act checkpoint: it needs the W/A/S/D keys of each "
                                 f"frame in {args.camera_dir / ACTION_FILE} ([frames, 4]), beside poses.npy")
        return _flag_error("--camera-dir", camera_stage.path_from_act_files, poses, intrinsics,
                           args.camera_dir / ACTION_FILE)
    if args.preset:
        return camera_stage.path_from_preset(args.preset, args.speed, frames)
    intrinsics = None
    if args.intrinsics:
        cli.existing_file(args.intrinsics, "--intrinsics", "intrinsics file")
        intrinsics = _flag_error("--intrinsics", read_intrinsics_row, args.intrinsics)
    if args.actions is not None:  # a string longer than --frames names both lengths
        return _flag_error("--actions", camera_stage.path_from_actions, args.actions, frames, height, width,
                           intrinsics)
    if args.poses_from:
        if not args.poses_from.exists():
            raise cli.UsageError("--poses-from", f"{args.poses_from} does not exist")
        source_size = _height_width(args.poses_source_size, "--poses-source-size") if args.poses_source_size else None
        path = _flag_error("--poses-from", camera_stage.path_from_export, args.poses_from, height, width,
                           name=args.poses_name, source_size=source_size, normalize_scale=not args.no_normalize_scale,
                           world_to_camera=args.world_to_camera, camera_axes=args.poses_axes)
        if intrinsics is not None:
            path.intrinsics = intrinsics
        return path
    return None


def _camera_flag(args: argparse.Namespace) -> str:
    return next(flag for flag, value in (("--camera-dir", args.camera_dir), ("--preset", args.preset),
                                         ("--actions", args.actions), ("--poses-from", args.poses_from)) if value)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # Everything a user can get wrong is checked here, before the first model loads.
    cli.switches()
    prompt = _prompt(args)
    cli.output_file(args.out, "--out", ".mp4", args.overwrite)
    if args.preview:
        cli.output_file(args.preview, "--preview", ".png", args.overwrite)
    device = cli.device(args.device, "--device")
    cli.existing_dir(args.package, "--package", "package folder")
    files = _flag_error("--package", find_package, args.package)  # names every missing file at once
    # Base-Cam or Act, from the headers
    control_type = _flag_error("--package", read_expert_pair, files.high, files.low).control_type
    notes: list[str] = []
    image = cli.open_image(args.image, "--image", notes.append)
    height, width = _size(args, image.width, image.height)  # a far aspect without --size: refused, one line
    for note in notes:
        print(f"generate: note: --image: {note}", file=sys.stderr)
    # "is not None": an empty --actions or --frames 0 is a mistake to answer, not a default.
    if args.actions is not None:
        _flag_error("--actions", frames_for_actions, args.actions)
    if args.frames is not None:
        frames = args.frames
    elif args.actions is not None:
        frames = frames_for_actions(args.actions)
    else:
        frames = PRESET_FRAMES.get(args.sampling_preset, 81)
    _flag_error("--frames", check_frame_count, frames)
    for flag, value in (("--decode-tile", args.decode_tile), ("--block-swap", args.block_swap)):
        if value < 0:
            raise cli.UsageError(flag, f"must be 0 or positive; got {value}")
    if args.fps <= 0:
        raise cli.UsageError("--fps", f"must be positive; got {args.fps}")
    windows = WindowParams(window=args.window, overlap=args.overlap, scale_quantile=args.scale_quantile)
    try:
        plan = plan_windows(frames, windows.window, windows.overlap)
    except ValueError as exc:  # its messages start with the field: "window must ..."
        raise cli.UsageError("--" + str(exc).split(" ", 1)[0], str(exc)) from None
    camera = camera_path(args, frames, height, width, control_type)  # cheap: a bad pose file fails now
    if camera is not None:
        try:
            camera_stage.check_controls(camera, control_type, f"--package {args.package}")
        except camera_stage.ControlMismatch as exc:
            raise cli.UsageError(_camera_flag(args), str(exc)) from None
        # A path shorter than the video (poses.npy of fewer frames) answers now, not after the text encoder.
        _flag_error(_camera_flag(args), camera.check_covers, frames, height, width)
    cli.cache_dir(args.cache_dir, "--cache-dir")
    try:
        params = SamplingParams(steps=args.steps, shift=args.shift, cfg_high=args.cfg[0], cfg_low=args.cfg[1],
                                boundary=args.boundary, seed=args.seed, sampler=args.sampler,
                                cache_threshold=args.cache_threshold, cfg_truncate=args.cfg_truncate,
                                attention=args.attention)
    except ValueError as exc:  # its messages start with the field: "steps must be ..."
        raise cli.UsageError("--" + str(exc).split(" ", 1)[0].replace("_", "-"), str(exc)) from None
    params = apply_preset(args.sampling_preset, params)
    loras = [LoraSpec(cli.existing_file(Path(f), "--lora", "LoRA file"), _strength(high), _strength(low))
             for f, high, low in args.lora]
    if loras:  # each file against the experts' layers (a skeleton, no weights): a junk file answers now
        skeleton = _flag_error("--package", build_on_meta, read_expert_config(files.high), files.high)
        for spec in loras:
            _flag_error("--lora", read_lora, spec.path, skeleton)
        del skeleton
    cli.attention(params.attention, device, "--attention")  # one tiny call: a kernel that cannot run answers now
    for folder in (files.high, files.low):  # headers only: a kind this device cannot run answers now
        _flag_error("--weights", weight_kind_for, folder, resolve_device(device), args.weights, args.quantize,
                    args.block_swap or None)
    if args.preview and camera is not None:
        with new_file(args.preview) as partial:  # a new file renamed into place (loaders/new_file.py)
            Image.fromarray(draw_trajectory(camera.poses[:frames], cuts=window_cuts(plan))).save(partial, format="PNG")
    started = time.perf_counter()
    print(f"{frames} frames at {width}x{height} in {len(plan)} window(s) of up to {windows.window}", file=sys.stderr)
    # A new file beside --out, named --out after the first window while that name is free; an
    # existing --out (--overwrite) is replaced only by the whole video (loaders/new_file.py).
    video = GrowingFile(args.out, overwrite=args.overwrite)
    try:
        result = generate(
            args.package, image, prompt, args.negative_prompt, frames, height, width, video, camera, params,
            windows, device=device, cache_dir=args.cache_dir, quantize=args.quantize, weights=args.weights,
            decode_tile=args.decode_tile or None, fps=args.fps, keep_resident=args.keep_experts,
            blocks_on_gpu=args.block_swap or None, loras=loras,
            on_step=lambda i, n: print(f"step {i}/{n}", file=sys.stderr, flush=True),
            on_window=lambda i, n: print(f"window {i}/{n} written", file=sys.stderr, flush=True))
    except BaseException as exc:  # a cancel, or a failure (out of memory, a kernel error): say what is kept
        cancelled = isinstance(exc, KeyboardInterrupt)
        print(f"generate: {'cancelled' if cancelled else 'stopped by the error below'}; {_what_was_kept(video, plan)}",
              file=sys.stderr)
        if cancelled:
            return 130
        raise
    if video.kept != args.out:  # another run made --out while this one was writing
        print(f"generate: error: --out: {args.out} appeared while this run was writing (another run with the same "
              f"--out?); it is left as it is, and this video ({result.frames_written} frames) was written to "
              f"{video.kept}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} ({result.frames_written} frames, {width}x{height}, {result.windows_done} window(s)) "
          f"in {time.perf_counter() - started:.1f} s")
    return 0


def _what_was_kept(video: GrowingFile, plan: list) -> str:
    """The words for what a stopped run left: --out as it was, or the windows finished before."""
    windows = f"{video.pieces} of {len(plan)} window(s) finished before ({sum(w.new_frames for w in plan[:video.pieces])} frames)"
    before = f"{video.target} is as it was" if video.target.exists() else f"no {video.target} was made"
    if video.kept is None:
        return f"no window was finished, nothing was written; {before}"
    if video.kept == video.target:
        return f"{video.target} keeps the {windows}"
    return f"{before}; the {windows} are in {video.kept}"


if __name__ == "__main__":
    sys.exit(cli.run("generate", main))
