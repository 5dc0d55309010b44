"""Write a Wan2.1 VAE checkpoint with random weights, laid out like the real file.

The official ``Wan2.1_VAE.pth`` is a plain ``torch.save`` state dict. Its dtype is taken to be
float32: 126.9 M parameters x 4 bytes matches the ~508 MB published file. ComfyUI's
``wan_2.1_vae.safetensors`` repackaging holds the same keys (in bf16); a path ending in
``.safetensors`` is written in that format.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from ...loaders.new_file import new_file
from ...wan.vae import WAN21, VAEGeometry, WanVAE


def write_vae_checkpoint(
    path: Path, geometry: VAEGeometry = WAN21, seed: int = 0, dtype: torch.dtype = torch.float32
) -> Path:
    """Random but well-behaved weights (decoded pixels finite, mostly inside [-1, 1])."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        vae = WanVAE(geometry)
    vae.init_weights(torch.Generator().manual_seed(seed))
    state = {key: tensor.to(dtype).contiguous() for key, tensor in vae.state_dict().items()}
    del vae
    with new_file(path) as partial:  # never into the old file: it may be a release's, hard-linked
        if path.suffix == ".safetensors":
            save_file(state, str(partial))
        else:
            torch.save(state, partial)
    return path
