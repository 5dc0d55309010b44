"""Checkpoint tensors reach the GPU through two pinned staging buffers, byte for byte."""
from __future__ import annotations

import contextlib
import logging

import pytest
import torch
from safetensors.torch import save_file

from comfyui_lingbot_world.loaders import pinned_upload
from comfyui_lingbot_world.loaders.pinned_upload import PinnedUploader, make_uploader
from comfyui_lingbot_world.loaders.tensor_source import SafetensorsSource


def test_no_uploader_for_the_cpu() -> None:
    assert make_uploader("cpu") is None


def test_no_pinned_memory_falls_back_with_a_warning(monkeypatch, caplog) -> None:
    def refuse(*args, **kwargs):
        raise RuntimeError("cudaHostAlloc failed: out of locked memory")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(pinned_upload, "PinnedUploader", refuse)
    with caplog.at_level(logging.WARNING):
        assert make_uploader("cuda:0") is None
    assert "out of locked memory" in caplog.text and "cuda:0" in caplog.text


def test_the_uploader_wants_a_cuda_device() -> None:
    with pytest.raises(ValueError, match="CUDA device"):
        PinnedUploader("cpu")


@pytest.mark.gpu
def test_uploads_equal_their_source_across_chunk_boundaries() -> None:
    g = torch.Generator().manual_seed(0)
    tensors = [
        torch.randint(0, 256, (1000,), dtype=torch.uint8, generator=g),  # 1000 B: spans 3 chunks of 384 B
        torch.randn(7, 33, generator=g).to(torch.bfloat16),
        torch.randn(96, generator=g),  # exactly one chunk
        torch.randn(0, 5, generator=g),
        torch.rand(50, generator=g) > 0.5,
        torch.randn(20, 30, generator=g).t(),  # not contiguous
        torch.randint(-5, 5, (3, 4), dtype=torch.int64, generator=g),
    ]
    uploader = PinnedUploader("cuda", chunk_bytes=384)
    got = [uploader.upload(t) for t in tensors]
    uploader.close()
    for source, copy in zip(tensors, got):
        assert copy.device.type == "cuda" and copy.dtype == source.dtype and copy.shape == source.shape
        assert torch.equal(copy.cpu(), source)


@pytest.mark.gpu
def test_a_cuda_source_reads_through_the_uploader(tmp_path) -> None:
    g = torch.Generator().manual_seed(1)
    stored = {"w": torch.randint(0, 256, (4096, 513), dtype=torch.uint8, generator=g),
              "b": torch.randn(513, generator=g).to(torch.bfloat16)}
    path = tmp_path / "model.safetensors"
    save_file(stored, str(path))
    with SafetensorsSource([path], "cuda") as source:
        assert source._uploader is not None
        read = {key: source.read(key) for key in stored}
    for key, tensor in stored.items():
        assert read[key].is_cuda and torch.equal(read[key].cpu(), tensor)


@pytest.mark.gpu
def test_materialize_uploads_cpu_tensors_to_cuda_and_casts() -> None:
    from torch import nn

    from comfyui_lingbot_world.loaders.state_dict import materialize

    with torch.device("meta"):
        module = nn.Sequential(nn.Linear(33, 17), nn.LayerNorm(17))
    g = torch.Generator().manual_seed(2)
    stored = {key: torch.randn(t.shape, generator=g) for key, t in module.state_dict().items()}
    materialize(module, "weights.pth", list(stored), stored.__getitem__, "cuda",
                dtype_for=lambda key, tensor: torch.bfloat16)
    for key, tensor in module.state_dict().items():
        assert tensor.is_cuda and tensor.dtype == torch.bfloat16
        assert torch.equal(tensor.cpu(), stored[key].to(torch.bfloat16))


def test_staging_can_be_turned_off(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    made = []
    monkeypatch.setattr(pinned_upload, "PinnedUploader", lambda device: made.append(device) or "uploader")
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    try:
        pinned_upload.allow_pinned_staging(False)
        assert make_uploader("cuda:0") is None and made == []
        pinned_upload.allow_pinned_staging(True)
        assert make_uploader("cuda:0") == "uploader"
    finally:
        pinned_upload.allow_pinned_staging(True)
