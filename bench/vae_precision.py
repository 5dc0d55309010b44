"""VRAM and time of the Wan2.1 VAE in float32 (the reference's precision, the pack's default)
against bf16 (the node's lower-precision choice): encode of the conditioning clip and
decode of the latent, at 480p and 720p (720p decode tiled, as users run it).

    python bench/vae_precision.py --out $OUT/vae_precision.json                 # GPU, real geometry
    python bench/vae_precision.py --preset tiny --device cpu --out /tmp/v.json    # CPU smoke run

The VAE is synthetic (``tools/synthetic/vae.py``: the real Wan2.1 geometry, random
weights, written as a float32 .pth like the official file) and loaded through the pack's
own loader. Per case: peak allocated VRAM above the loaded weights, wall time (median of
``--repeats`` after a warm-up), and for decode how far bf16 lands from float32
(max and mean absolute difference in [-1, 1] pixels).
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

import _pack  # noqa: F401  (bench/_pack.py: the checkout as comfyui_lingbot_world, before any pack import)
from comfyui_lingbot_world.tools.synthetic.vae import write_vae_checkpoint  # noqa: E402
from comfyui_lingbot_world.loaders.vae_loader import load_vae  # noqa: E402
from comfyui_lingbot_world.pipeline.guards import VAE_PRECISIONS  # noqa: E402
from comfyui_lingbot_world.pipeline.memory import release_module  # noqa: E402
from comfyui_lingbot_world.wan.vae import VAE_TINY, WAN21  # noqa: E402

# (name, frames, height, width, decode tile in latent pixels or None)
CASES = {
    "a14b": [("480p", 81, 480, 832, None), ("720p", 81, 720, 1280, 32)],
    "tiny": [("tiny", 5, 32, 48, None), ("tiny_tiled", 5, 32, 48, 2)],
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(fn, device: torch.device, repeats: int) -> tuple[torch.Tensor, float, float | None]:
    """(result, median seconds, peak GiB allocated above what was allocated before)."""
    out = fn()  # warm-up (cuDNN algorithm choice, allocator)
    del out
    times = []
    peak = None
    for _ in range(repeats):
        if device.type == "cuda":
            _sync(device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        started = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - started)
        if device.type == "cuda":
            peak = (torch.cuda.max_memory_allocated(device) - base) / 2**30
    return out, statistics.median(times), peak


def run_case(vae_file: Path, device: torch.device, name: str, frames: int, height: int, width: int,
             tile: int | None, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    clip = torch.zeros(1, 3, frames, height, width)
    clip[:, :, 0] = torch.rand(1, 3, height, width, generator=gen) * 2 - 1  # first frame, then black
    row: dict = {"case": name, "frames": frames, "height": height, "width": width, "decode_tile": tile}
    decoded = {}
    for precision, dtype in VAE_PRECISIONS.items():
        vae = load_vae(vae_file, device, dtype)
        weights_gib = sum(p.numel() * p.element_size() for p in vae.parameters()) / 2**30
        with torch.inference_mode():
            latent, enc_s, enc_peak = _measure(lambda: vae.encode(clip), device, repeats)
            video, dec_s, dec_peak = _measure(
                lambda: vae.decode(latent.to(device, dtype), tile=tile), device, repeats)
        decoded[precision] = video.float().cpu()
        row[precision] = {"weights_gib": weights_gib, "encode_s": enc_s, "encode_peak_gib": enc_peak,
                          "decode_s": dec_s, "decode_peak_gib": dec_peak}
        del latent, video
        release_module(vae)
        del vae
    diff = (decoded["bf16"] - decoded["fp32"]).abs()
    row["decode_bf16_vs_fp32"] = {"max_abs": float(diff.max()), "mean_abs": float(diff.mean())}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(CASES), default="a14b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all of the preset)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    geometry = WAN21 if args.preset == "a14b" else VAE_TINY
    wanted = {c for c in args.cases.split(",") if c}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        vae_file = write_vae_checkpoint(Path(tmp) / "Wan2.1_VAE.pth", geometry)
        for case in CASES[args.preset]:
            if wanted and case[0] not in wanted:
                continue
            rows.append(run_case(vae_file, device, *case, repeats=args.repeats))
            print(json.dumps(rows[-1]), flush=True)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "preset": args.preset,
        "cases": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
