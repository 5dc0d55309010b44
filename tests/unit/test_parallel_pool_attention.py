"""A run's attention choice reaches the worker ranks (pipeline/parallel_pool/): its own
module, as its workers must start with their own environment (one pool per process)."""
from __future__ import annotations

import pytest
import torch

import parallel_ranks
from comfyui_lingbot_world.pipeline.parallel_pool import ParallelModel, RankPool
from comfyui_lingbot_world.wan.runtime import attention as attn, switches
from parallel_ranks import CONFIG, FRAMES, LAT_H, LAT_W


def test_the_runs_attention_choice_reaches_the_workers(monkeypatch):
    """Workers started with LINGBOT_ATTENTION=sage (a kernel that cannot run on the CPU) attend
    with the run's choice (attention_backend on rank 0), so the forward runs and equals one
    process; without the choice they would fail on their own default."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, FRAMES, LAT_H, LAT_W, generator=g)
    y = torch.randn(2, 20, FRAMES, LAT_H, LAT_W, generator=g)
    context = [torch.randn(n, CONFIG.text_dim, generator=g) for n in (7, 12)]
    plucker = torch.randn(1, 384, FRAMES, LAT_H, LAT_W, generator=g)
    t = torch.tensor([937.0, 412.0])
    monkeypatch.setenv(switches.ATTENTION.name, "sage")
    attn.reset_backend_choice()
    pool = RankPool(["cpu", "cpu"]).start()
    try:
        parallel = ParallelModel(pool, "tiny", pool.load("tiny", parallel_ranks.build))
        with attn.attention_backend("sdpa"):
            want = parallel_ranks.model()(x, t, context, y, camera=plucker)
            got = parallel(x, t, context, y=y, camera=plucker)
        assert float((got - want).norm() / want.norm()) < 1e-5
        with pytest.raises((RuntimeError, ValueError), match="LINGBOT_ATTENTION=sage cannot run here"):
            parallel(x, t, context, y=y, camera=plucker)  # no run choice: the environment's kernel
    finally:
        pool.close()
        monkeypatch.delenv(switches.ATTENTION.name)
        attn.reset_backend_choice()
