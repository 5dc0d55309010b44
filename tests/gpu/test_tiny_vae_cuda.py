"""On CUDA: Play's live decoder (nodes/host/tiny_vae.py, ComfyUI's TAEHV streamed) in bf16 gives
ComfyUI's whole-latent decode bit for bit, and a Play session on the GPU decodes with it."""
from __future__ import annotations

import pytest
import torch

from comfy_host import use_comfy_in_process

pytestmark = pytest.mark.gpu
HOST = use_comfy_in_process()  # the host's modules (the test process computes on the GPU itself)
from comfy.taesd.taehv import TAEHV  # noqa: E402

from comfyui_lingbot_world.nodes.host.tiny_vae import TinyStreamDecoder  # noqa: E402
from comfyui_lingbot_world.wan.vae import LATENT_MEAN, LATENT_STD  # noqa: E402


def test_the_streamed_bf16_decode_is_comfyuis_whole_decode_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    taehv = TAEHV(latent_channels=16)
    generator = torch.Generator().manual_seed(0)
    for param in taehv.parameters():
        param.data = torch.randn(param.shape, generator=generator) * 0.02
    taehv = taehv.to("cuda", torch.bfloat16).eval().requires_grad_(False)
    latent = torch.randn(1, 16, 7, 60, 104, generator=torch.Generator().manual_seed(1)).cuda()  # 480x832
    stats = (1, 16, 1, 1, 1)
    std, mean = (torch.tensor(v, device="cuda").view(stats) for v in (LATENT_STD, LATENT_MEAN))
    raw = latent * std + mean
    with torch.no_grad():
        whole = taehv.decode(raw.to(torch.bfloat16)).float().cuda() * 2 - 1
    decoder = TinyStreamDecoder(taehv, torch.device("cuda"), torch.bfloat16)
    pieces = [decoder.decode_next(latent[:, :, i:i + 1]) for i in range(7)]
    assert [p.shape[2] for p in pieces] == [1, 4, 4, 4, 4, 4, 4]
    assert torch.equal(torch.cat(pieces, dim=2), whole.clamp(-1, 1))
