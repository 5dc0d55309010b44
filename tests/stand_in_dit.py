"""A tiny nonlinear stand-in for a DiT expert, with the model's call signature, for sampler tests."""
from __future__ import annotations

import threading

import torch
from torch import nn

from comfyui_lingbot_world.wan.runtime import attention as attention_mod


class TinyDiT(nn.Module):
    """Counts the batch rows it computes; records the threads it ran on and the run's attention choice."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.randn(16, 16, generator=g) * 0.3)
        self.calls = 0
        self.threads: set[str] = set()
        self.attention: set[str | None] = set()

    def forward(self, x, t, contexts, y=None, camera_tokens=None, cancel=None):
        self.calls += x.shape[0]
        self.threads.add(threading.current_thread().name)
        self.attention.add(attention_mod._RUN_CHOICE.get())
        ctx = torch.stack([c.mean() for c in contexts]).view(-1, 1, 1, 1, 1)
        h = torch.einsum("oc,bcfhw->bofhw", self.w, x) + y[:, :16] * 0.1
        return torch.tanh(h + ctx + t.view(-1, 1, 1, 1, 1) / 1000.0)
