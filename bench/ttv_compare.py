"""Two saved time-to-video results (``time_to_video.py --save-reference``: latent.pt,
video.pt, name.txt) side by side: the second's relative latent error and video PSNR against
the first, e.g. a video with fp8 GEMMs against the exact one, run at the same time on two
GPUs. Synthetic weights: the figures say how far the kernels move these numbers, not what
the real model's video looks like.

    python bench/ttv_compare.py /dev/shm/ttv_exact /dev/shm/ttv_fp8 --out /tmp/ttv_fp8_vs_exact.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from time_to_video import psnr, rel_err


def load(folder: Path) -> dict:
    return {"name": (folder / "name.txt").read_text().strip(), "latent": torch.load(folder / "latent.pt"),
            "video": torch.load(folder / "video.pt")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reference")
    p.add_argument("other")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    reference, other = load(Path(args.reference)), load(Path(args.other))
    if reference["latent"].shape != other["latent"].shape:
        raise SystemExit(f"the latents differ in shape: {tuple(reference['latent'].shape)} and "
                         f"{tuple(other['latent'].shape)}")
    record = {"reference": reference["name"], "other": other["name"],
              "latent_rel_err": rel_err(other["latent"], reference["latent"]),
              "video_psnr_db": psnr(other["video"], reference["video"]),
              "video_finite": bool(torch.isfinite(other["video"].float()).all())}
    print(json.dumps(record))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
