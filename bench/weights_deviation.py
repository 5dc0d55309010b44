"""How far the 8-bit weight kinds drift from bf16 over a long Fast walk, on the same seed.

    python bench/weights_deviation.py --package DIR --frames 957 --kinds bf16 fp8 int8 --out $OUT/dev.json

The Fast transformer (the package's low-noise folder, or ``--dit``) is loaded once per kind
(``--kinds``; the first is the reference, bf16 by default: the stored weights dequantized),
and the same walk (the seed, the image condition, the action path of bench/fast_chunks.py)
runs chunk by chunk through ``FastGenerator``; each chunk's latent is kept on the CPU. The
JSON has, per kind, the relative error of every chunk's latent against the reference's
(‖x − x_ref‖ / ‖x_ref‖), so drift over time shows, and the seconds per chunk. Synthetic
weights: this measures the arithmetic, not the picture quality of the real model.
Checked on the CPU with a tiny package:

    python . make_checkpoint --preset tiny --layout nf4 --out /tmp/tiny
    python bench/weights_deviation.py --package /tmp/tiny --device cpu --size 32x48 --frames 21 --out /tmp/dev.json
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

import torch

import _pack  # noqa: F401  (registers the checkout as comfyui_lingbot_world)
from comfyui_lingbot_world.loaders.package import find_package  # noqa: E402
from comfyui_lingbot_world.pipeline.experts import load_expert  # noqa: E402
from comfyui_lingbot_world.pipeline.fast import FastGenerator, FastParams, StreamedI2V, fast_latent_frames  # noqa: E402
from comfyui_lingbot_world.pipeline.image import as_pil, open_vae, vae_dtype  # noqa: E402
from comfyui_lingbot_world.pipeline.memory import release_module  # noqa: E402
from comfyui_lingbot_world.pipeline.text import encode_text  # noqa: E402
from comfyui_lingbot_world.wan.conditioning import image_to_tensor  # noqa: E402
from comfyui_lingbot_world.wan.runtime.kv_cache import KV_DTYPES  # noqa: E402
from fast_chunks import PROMPT, load_image, policy_of, stream_camera, sync  # noqa: E402


def walk(model, text: torch.Tensor, vae_file: Path, pixels: torch.Tensor, camera, params: FastParams,
         latent_frames: int, device: torch.device) -> tuple[list[torch.Tensor], list[float]]:
    """Every chunk's latent (CPU, float32) and seconds of one walk."""
    vae = open_vae(vae_file, device, vae_dtype(device))
    source = StreamedI2V(vae, pixels.to(device), latent_frames, release_vae=lambda: release_module(vae))
    source.prefetch()
    latents, seconds = [], []
    with FastGenerator(model, text, source, params, latent_frames=latent_frames) as session:
        chunks = latent_frames // 3
        for c in range(chunks):
            sync(device)
            t0 = time.perf_counter()
            x0 = session.next_chunk(camera.chunk(3 * c, 3), commit=c + 1 < chunks)
            sync(device)
            seconds.append(time.perf_counter() - t0)
            latents.append(x0.float().cpu())
    source.close()
    release_module(vae)
    return latents, seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--package", required=True)
    p.add_argument("--dit", help="the Fast transformer's folder (default: the package's low-noise expert)")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--size", default="480x832")
    p.add_argument("--frames", type=int, default=957)
    p.add_argument("--kinds", nargs="+", default=["bf16", "fp8", "int8"], help="the first is the reference")
    p.add_argument("--kv-window", type=int, default=9)
    p.add_argument("--kv-sink", type=int, default=3)
    p.add_argument("--kv-dtype", default="bf16", choices=KV_DTYPES)
    p.add_argument("--shift", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image")
    p.add_argument("--camera-dir", help="poses.npy + intrinsics.npy (default: an action path)")
    p.add_argument("--blocks-on-gpu", type=int, default=0)
    args = p.parse_args(argv)
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    files = find_package(args.package)
    dit = Path(args.dit) if args.dit else files.low
    height, width = (int(v) for v in args.size.lower().split("x"))
    latent_frames = fast_latent_frames(args.frames)
    with tempfile.TemporaryDirectory(prefix="lingbot-dev-bench-") as cache:
        text = encode_text(files.t5, files.tokenizer, PROMPT, "", device, cache_dir=Path(cache)).positive
    pixels = image_to_tensor(as_pil(load_image(args.image, height, width)), height, width)
    params = FastParams(seed=args.seed, shift=args.shift, policy=policy_of(args))
    record: dict = {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "date": datetime.date.today().isoformat(), "torch": torch.__version__,
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv), "dit": str(dit), "size": args.size,
        "frames": args.frames, "reference": args.kinds[0], "kinds": {},
    }
    reference: list[torch.Tensor] | None = None
    for kind in args.kinds:
        model = load_expert(dit, device, quantize=kind, blocks_on_gpu=args.blocks_on_gpu or None)
        camera = stream_camera(args, args.frames, height, width)
        latents, seconds = walk(model, text, files.vae, pixels, camera, params, latent_frames, device)
        release_module(model)
        del model
        row = {"chunk_s_median": statistics.median(seconds), "chunk_s": seconds}
        if reference is None:
            reference = latents
        else:
            errors = [float((x - r).norm() / r.norm()) for x, r in zip(latents, reference)]
            row |= {"rel_error_per_chunk": errors, "rel_error_first": errors[0], "rel_error_last": errors[-1],
                    "rel_error_max": max(errors), "rel_error_median": statistics.median(errors)}
        record["kinds"][kind] = row
        print(kind, {k: v for k, v in row.items() if not isinstance(v, list)}, flush=True)
    Path(args.out).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
