"""Cost per sampling step of the sampler node's live preview, on the GPU.

The node does, once per step: x0 = latent - sigma * velocity (the flow-matching estimate of
the clean latent), then ComfyUI's own previewer (``latent_preview.get_previewer`` with the
``Wan21`` latent format: latent2rgb factors, or the TAE decoder when the user has one) turns
it into a JPEG that the frontend shows on the node. This times exactly that work, through
ComfyUI's own module, at the latent size of a 480x832x81 video.

    python bench/preview_cost.py --comfy DIR_WITH_COMFYUI_SOURCES --out preview.json

DIR needs only ComfyUI's .py/.json files (the lead carries a trimmed copy of the test host).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time

import torch

import _pack  # noqa: F401  (registers the checkout as comfyui_lingbot_world)
from comfyui_lingbot_world.wan import geometry  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--comfy", required=True, help="folder holding ComfyUI's sources (latent_preview.py, comfy/)")
    p.add_argument("--size", default="480x832")
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--s-per-step", type=float, default=6.15, help="step time to compare with (bench/RESULTS.md)")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    sys.path.append(args.comfy)
    from comfy.cli_args import LatentPreviewMethod, args as comfy_args

    comfy_args.preview_method = LatentPreviewMethod.Latent2RGB  # ComfyUI's default "auto" picks this without a TAE
    import comfy.latent_formats
    import latent_preview

    device = torch.device("cuda")
    height, width = (int(v) for v in args.size.split("x"))
    shape = (geometry.LATENT_CHANNELS, *geometry.latent_shape(args.frames, height, width))
    latent = torch.randn(shape, device=device)
    velocity = torch.randn(shape, device=device)
    previewer = latent_preview.get_previewer(device, comfy.latent_formats.Wan21())
    assert previewer is not None, "no previewer: ComfyUI's preview setting is off"

    def one_step() -> None:
        x0 = latent - 0.5 * velocity
        previewer.decode_latent_to_preview_image("JPEG", x0[None].float())

    for _ in range(3):
        one_step()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        one_step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    ms = statistics.median(times) * 1000
    record = {
        "gpu": torch.cuda.get_device_name(0), "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(sys.argv), "previewer": type(previewer).__name__,
        "latent_shape": list(shape), "preview_ms_per_step": ms, "preview_ms_max": max(times) * 1000,
        "s_per_step_compared": args.s_per_step, "fraction_of_step": ms / 1000 / args.s_per_step,
    }
    with open(args.out, "w") as fh:
        json.dump(record, fh, indent=2)
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
