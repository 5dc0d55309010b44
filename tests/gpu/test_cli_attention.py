"""`generate --attention` on a CUDA machine: each kernel is run once on the device before any
model loads; one that cannot run (not installed, or built for another GPU or torch) is a
one-line answer naming --attention, one that runs is kept (tools/cli.py ``attention``)."""
from __future__ import annotations

import pytest
import torch

from comfyui_lingbot_world.tools import cli
from comfyui_lingbot_world.wan.runtime.attention import ATTENTION_BACKENDS, installed_kernels

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("backend", ["flash", "sage"])
def test_attention_choice_is_checked_on_the_gpu_before_work(backend):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    # Installed: one of the backend's kernels imports (flash: FlashAttention 3 from either of its
    # packages, or flash-attn 2; the registry's rows name them).
    installed = bool(set(ATTENTION_BACKENDS[backend].kernels) & installed_kernels())
    try:
        chosen = cli.attention(backend, "cuda", "--attention")
    except cli.UsageError as exc:
        assert str(exc).startswith(f"--attention: attention '{backend}' cannot run here: "), str(exc)
        assert "sdpa" in str(exc)
        if not installed:
            assert "cannot be imported" in str(exc)
        print(f"{backend}: refused in one line: {exc}")
    else:
        assert installed and chosen == backend
        print(f"{backend}: runs here")
    assert cli.attention("sdpa", "cuda", "--attention") == "sdpa"
