"""pipeline/latent.py: the pack's latent and ComfyUI's Wan 2.1 LATENT convention, checked
against the host's own ``comfy.latent_formats.Wan21``."""
from __future__ import annotations

import pytest
import torch

from comfy_host import use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.latent_formats  # noqa: E402

from comfyui_lingbot_world.pipeline.latent import from_comfy_latent, to_comfy_latent  # noqa: E402


def test_comfy_latent_convention_is_the_hosts_wan21():
    wan21 = comfy.latent_formats.Wan21()
    normalized = torch.randn(1, 16, 3, 4, 5)
    raw = to_comfy_latent(normalized)
    torch.testing.assert_close(raw, wan21.process_out(normalized.clone()))
    torch.testing.assert_close(from_comfy_latent(raw), normalized, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(wan21.process_in(raw.clone()), normalized, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(to_comfy_latent(normalized[0]), raw[0])  # unbatched [16, F, h, w] too
    with pytest.raises(ValueError, match="expected"):
        to_comfy_latent(torch.zeros(1, 4, 2, 8, 8))
