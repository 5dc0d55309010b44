"""The early size check counts what is really allocated and where the limit really is:
2048x2048x81 passed it and then failed in the allocator after a 7 GB
peak. The VAE's own working memory on the CPU counts, and so do cgroup and ulimit limits.
Every case here is decided without allocating the video."""
from __future__ import annotations

import resource
from pathlib import Path

import pytest
import torch
from PIL import Image

import tiny_package
from comfyui_lingbot_world.pipeline import image as image_stage
from comfyui_lingbot_world.pipeline import memory
from comfyui_lingbot_world.pipeline.decode import decode
from comfyui_lingbot_world.wan import vae as vae_model

GiB = 2**30


@pytest.fixture(scope="module")
def vae_file(tmp_path_factory) -> Path:
    return tiny_package.build(tmp_path_factory.mktemp("size_check"), "nf4") / "Wan2.1_VAE.pth"


@pytest.fixture
def sixteen_gib(monkeypatch):
    """A machine of 16 GiB (more than 2048x2048x81's 8.2 GB of frames, as the reviewer's)."""
    monkeypatch.setattr(memory, "total_ram_bytes", lambda: 16 * GiB)
    monkeypatch.setattr(memory, "_cgroup_room", lambda: None, raising=False)  # no limits below the RAM
    monkeypatch.setattr(memory, "_rlimit_rooms", lambda: [], raising=False)


@pytest.fixture
def nothing_big(monkeypatch):
    """Fail the test if the clip is built or the VAE starts (what allocated the 7 GB)."""
    def refuse(*args, **kwargs):
        raise AssertionError("the video would have been allocated")

    monkeypatch.setattr(image_stage, "conditioning_video", refuse)
    monkeypatch.setattr(vae_model.WanVAE, "encode", refuse)
    monkeypatch.setattr(vae_model.WanVAE, "decode", refuse)


def test_encode_2048x2048x81_on_the_cpu_is_refused_before_allocating(vae_file, sixteen_gib, nothing_big):
    with pytest.raises(ValueError, match=r"2048x2048x81 needs about \d+\.\d GiB of RAM \(3\.8 GiB for the frames, "
                                         r"\d+\.\d GiB for the VAE working on the CPU\).*or encode on a GPU"):
        image_stage.encode_image(vae_file, Image.new("RGB", (64, 64)), 81, 2048, 2048, "cpu")


def test_decode_2048x2048x81_on_the_cpu_is_refused_unless_tiled(vae_file, sixteen_gib, nothing_big):
    latent = torch.zeros(16, 21, 256, 256)  # the LATENT of 2048x2048x81 (88 MB)
    with pytest.raises(ValueError, match=r"2048x2048x81 needs about .*VAE working on the CPU.*set a decode tile"):
        decode(vae_file, latent, "cpu")
    # Tiles of 32 latent pixels bound the VAE's part: the frames fit, the decoder is reached.
    with pytest.raises(AssertionError, match="would have been allocated"):
        decode(vae_file, latent, "cpu", tile=32)


def test_the_room_follows_an_address_space_limit(monkeypatch):
    real = resource.getrlimit
    limit = int(8.5 * GiB)
    monkeypatch.setattr(resource, "getrlimit",
                        lambda which: (limit, limit) if which == resource.RLIMIT_AS else real(which))
    room, why = memory.host_room_bytes()
    assert room < limit and "ulimit -v" in why
    with pytest.raises(ValueError, match=r"2048x2048x81 needs about 7\.6 GiB .*ulimit -v"):
        memory.check_video_fits(81, 2048, 2048)


@pytest.mark.parametrize("kind", ["v2", "v1"])
def test_the_room_follows_a_cgroup_memory_limit(tmp_path, monkeypatch, kind):
    group = tmp_path / ("memory" if kind == "v1" else "") / "job"
    group.mkdir(parents=True)
    limit, usage, cache = ("memory.max", "memory.current", "file") if kind == "v2" else (
        "memory.limit_in_bytes", "memory.usage_in_bytes", "total_cache")
    (group / limit).write_text(f"{8 * GiB}\n")
    (group / usage).write_text(f"{5 * GiB}\n")  # of which 4 GiB page cache (checkpoints): reclaimable
    (group / "memory.stat").write_text(f"anon {GiB}\n{cache} {4 * GiB}\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n" if kind == "v2" else "4:memory:/job\n")
    monkeypatch.setattr(memory, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(memory, "PROC_CGROUP", proc)
    monkeypatch.setattr(memory, "total_ram_bytes", lambda: 64 * GiB)
    monkeypatch.setattr(memory, "_rlimit_rooms", lambda: [])
    room, why = memory.host_room_bytes()
    assert room == 7 * GiB and "memory limit" in why
    (group / limit).write_text("max\n" if kind == "v2" else f"{2**63 - 4096}\n")  # no limit
    assert memory.host_room_bytes()[0] == 64 * GiB


def test_the_usual_sizes_still_pass(vae_file, sixteen_gib, monkeypatch):
    memory.check_video_fits(81, 480, 832, bytes_per_pixel=memory.DECODE_BYTES_PER_PIXEL,
                            workspace_bytes=memory.vae_workspace_bytes(8, 480 * 832, "decode"))
    # Wan2.1's VAE (base width 96) on the CPU at 480x832: ~9 GB for decode, as measured.
    assert 7 * GiB < memory.vae_workspace_bytes(96, 480 * 832, "decode") < 12 * GiB
