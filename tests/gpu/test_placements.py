"""Every placement of pipeline/placement.py on two real GPUs, the tiny DiT from disk, against
``single`` on GPU 0 (issue 26: ``expert_per_gpu`` passed every CPU test and crashed at its first
step on two H100s, the sampler's history left on GPU 0).

Equality: ``expert_per_gpu`` runs the same kernels in the same order, only on another card of
the same model, so its latent is equal bit for bit; ``cfg_split`` with ``batch_cfg`` off runs
the same two forwards as ``single`` with ``batch_cfg`` off (bit for bit); against ``single``'s
batched CFG (one batch of two) the reduction order may differ, so bf16 tolerance.
"""
from __future__ import annotations

import gc

import pytest
import torch

import tiny_package
from comfyui_lingbot_world.loaders.package import find_package
from comfyui_lingbot_world.pipeline.camera import camera_condition, path_from_preset
from comfyui_lingbot_world.pipeline.experts import DiskExperts, PlacedDiskExperts
from comfyui_lingbot_world.pipeline.image import I2VCondition
from comfyui_lingbot_world.pipeline.placement import PLACEMENTS, cuda_placement
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, sample
from comfyui_lingbot_world.pipeline.text import TextEmbeddings

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]

BF16 = 1.6e-2  # 2**-6: bf16 keeps 8 significant bits


def memory_held(index: int) -> int:
    """Bytes the caching allocator holds on GPU ``index`` for tensors of ours. cuBLAS keeps one
    workspace per (handle, stream) in the same allocator for the life of the process (33 MiB
    each on Hopper: 34,603,008 and 69,206,016 bytes were left on GPU 1 after a placement ran
    its branch there); those are dropped first, so what remains is the experts' copies."""
    torch.cuda.synchronize(index)
    torch._C._cuda_clearCublasWorkspaces()
    return torch.cuda.memory_allocated(index)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return find_package(tiny_package.build(tmp_path_factory.mktemp("tiny"), "nf4"))


def _inputs():
    g = torch.Generator().manual_seed(5)
    text = TextEmbeddings(positive=torch.randn(6, 32, generator=g), negative=torch.randn(5, 32, generator=g),
                          from_cache=False)
    condition = I2VCondition(y=torch.randn(20, 3, 4, 6, generator=g), frames=9, height=32, width=48)
    camera = camera_condition(path_from_preset("dolly_in", 1.0, 9), 9, 32, 48)
    return text, condition, camera


# 6 UniPC steps at shift 5 with boundary 0.9: both experts run, and the low-noise expert's
# steps use the order-2 history taken on the high-noise expert's GPU.
def _params(batch_cfg: bool) -> SamplingParams:
    return SamplingParams(steps=6, shift=5.0, seed=3, boundary=0.9, batch_cfg=batch_cfg)


def _run(files, mode: str, batch_cfg: bool) -> torch.Tensor:
    text, condition, camera = _inputs()
    source = PlacedDiskExperts(files.high, files.low, cuda_placement(mode, torch.cuda.device_count()))
    try:
        return sample(source, text, condition, camera, _params(batch_cfg))
    finally:
        source.close()


def _single(files, batch_cfg: bool) -> torch.Tensor:
    text, condition, camera = _inputs()
    return sample(DiskExperts(files.high, files.low, "cuda:0"), text, condition, camera, _params(batch_cfg))


@pytest.mark.parametrize("mode", PLACEMENTS)
def test_each_placement_equals_single_bit_for_bit(files, mode):
    """The same kernels in the same order (batch_cfg off: cfg_split runs single's two forwards)."""
    want = _single(files, batch_cfg=False)
    got = _run(files, mode, batch_cfg=False)
    assert torch.isfinite(got).all()
    assert torch.equal(got, want), f"{mode}: max |diff| {float((got - want).abs().max())}"
    for index in range(2):
        torch.cuda.synchronize(index)
    assert memory_held(1) == 0  # every copy on GPU 1 freed by close()


@pytest.mark.parametrize("mode", ["expert_per_gpu", "cfg_split"])
def test_each_placement_matches_batched_single_to_bf16(files, mode):
    """Against single's default batched CFG: equal for expert_per_gpu, bf16 tolerance for the split."""
    want = _single(files, batch_cfg=True)
    got = _run(files, mode, batch_cfg=True)
    if mode == "expert_per_gpu":
        assert torch.equal(got, want)
    else:
        # The split runs each branch as a batch of one where single runs a batch of two: the
        # GEMMs' reduction order differs, and 6 UniPC steps through two experts carry that
        # rounding on (measured on two H200s: 6.9 % of the values beyond 1.6e-2 absolute, the
        # largest 0.07). Bit for bit against the same forwards is the test above; here the
        # whole latent must agree to bf16's relative resolution.
        assert float((got - want).norm() / want.norm()) < BF16


@pytest.mark.parametrize("mode", ["expert_per_gpu", "cfg_split"])
def test_cancel_after_the_boundary_frees_both_gpus(files, mode):
    text, condition, camera = _inputs()
    before = [torch.cuda.memory_allocated(i) for i in range(2)]
    source = PlacedDiskExperts(files.high, files.low, cuda_placement(mode, torch.cuda.device_count()))
    done: list[int] = []

    def interrupt():  # also called before every block: stops inside the low-noise expert's step
        if len(done) == 4:
            raise InterruptedError("cancelled")

    with pytest.raises(InterruptedError):
        sample(source, text, condition, camera, _params(False), on_step=lambda d, n: done.append(d),
               check_interrupt=interrupt)
    assert source.resident() == {}
    gc.collect()  # the exception's frames held the step's tensors
    for index in range(2):
        torch.cuda.synchronize(index)
    after = [torch.cuda.memory_allocated(i) for i in range(2)]
    assert all(a - b <= 2**20 for a, b in zip(after, before)), (before, after)  # the experts are gone
    # and the next run works
    assert torch.isfinite(_run(files, mode, batch_cfg=False)).all()
