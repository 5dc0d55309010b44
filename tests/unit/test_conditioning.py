"""Image-to-video conditioning: sizes, image modes, frame counts, mask and y."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from i2v_reference import build_i2v_condition
from comfyui_lingbot_world.wan.conditioning import (
    check_frame_count,
    check_size,
    conditioning_video,
    first_frame_mask,
    image_to_tensor,
    target_size,
    to_rgb,
)

AREA_480P = 480 * 832


# ----------------------------------------------------------------------------- sizes


def test_target_size_by_hand() -> None:
    # 1280×720 (the reference examples) at 480·832: h/w = 0.5625,
    # √(399360·0.5625) = 473.96 → //8 = 59 → //2·2 = 58 → 464;
    # √(399360/0.5625) = 842.60 → //8 = 105 → //2·2 = 104 → 832.
    assert target_size(1280, 720, AREA_480P) == (464, 832)
    # Portrait 720×1280 swaps them.
    assert target_size(720, 1280, AREA_480P) == (832, 464)
    # 1024² at 480·832: √399360 = 631.95 → 78 → 78 → 624.
    assert target_size(1024, 1024, AREA_480P) == (624, 624)
    # 1280×720 at 720·1280: √(921600·0.5625) = 720 → 90 → 90 → 720; √(921600/0.5625) = 1280.
    assert target_size(1280, 720, 720 * 1280) == (720, 1280)


def test_target_size_keeps_the_reference_rounding_quirk() -> None:
    # √(399360·480/832) is 479.99999999999994 in float64, so the reference lands on 464.
    assert target_size(832, 480, AREA_480P) == (464, 832)


@pytest.mark.parametrize("w,h", [(640, 480), (333, 777), (1920, 1080), (97, 61)])
def test_target_size_multiples_of_16_within_area(w: int, h: int) -> None:
    th, tw = target_size(w, h, AREA_480P)
    assert th % 16 == 0 and tw % 16 == 0
    assert th * tw <= AREA_480P
    assert abs(th / tw - h / w) < 0.1


def test_target_size_errors() -> None:
    with pytest.raises(ValueError, match="image size"):
        target_size(0, 10, AREA_480P)
    with pytest.raises(ValueError, match="too elongated"):
        target_size(100000, 10, AREA_480P)


def test_frame_count_checks() -> None:
    for ok in (1, 5, 17, 81, 161, np.int64(9)):
        check_frame_count(ok)
    for bad, text in ((80, "got 80 .nearest below: 77"), (0, "got 0"), (-3, "got -3"), (2, "got 2")):
        with pytest.raises(ValueError, match=text):
            check_frame_count(bad)
    with pytest.raises(ValueError, match="integer"):
        check_frame_count(81.0)


def test_size_checks() -> None:
    check_size(480, 832)
    check_size(16, 16)
    with pytest.raises(ValueError, match="height must be a multiple of 16.*got 470"):
        check_size(470, 832)
    with pytest.raises(ValueError, match="width .*got 8"):
        check_size(480, 8)
    with pytest.raises(ValueError, match="width .*got 0"):
        check_size(480, 0)


# ----------------------------------------------------------------------------- images


def _rgb_pattern(h: int = 20, w: int = 28) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 9 % 256, y * 13 % 256, (x + y) * 5 % 256], axis=-1).astype(np.uint8)


def _mode_images() -> dict[str, Image.Image]:
    rgb = Image.fromarray(_rgb_pattern())
    grey16 = (np.arange(20 * 28).reshape(20, 28) * 117 % 65536).astype(np.uint16)
    return {
        "RGB": rgb,
        "L": rgb.convert("L"),
        "LA": rgb.convert("LA"),
        "P": rgb.convert("P"),
        "RGBA": rgb.convert("RGBA"),
        "I;16": Image.fromarray(grey16),
        "I": Image.fromarray(grey16.astype(np.int32)),
        "F": Image.fromarray((grey16 / 65535.0).astype(np.float32)),
        "CMYK": rgb.convert("CMYK"),
        "1": rgb.convert("1"),
    }


@pytest.mark.parametrize("mode", list(_mode_images()))
def test_every_mode_converts(mode: str) -> None:
    image = _mode_images()[mode]
    assert image.mode == mode
    rgb = to_rgb(image)
    assert rgb.mode == "RGB" and rgb.size == image.size
    t = image_to_tensor(image, 32, 48)
    assert t.shape == (3, 32, 48) and t.dtype == torch.float32
    # Unclamped like the reference: bicubic overshoots [-1, 1] at edges (a 1-bit picture's
    # hard 2-D edges most: 1.64 here), but stays bounded.
    assert torch.isfinite(t).all() and t.abs().max() <= 2.0
    assert t.std() > 0.05  # the picture survived, not a flat frame


def test_sixteen_bit_grey_is_rescaled_not_clipped() -> None:
    levels = np.array([[0, 257 * 64, 65535]], dtype=np.uint16).repeat(16, 0).repeat(16, 1)
    image = Image.fromarray(levels)
    assert image.mode == "I;16"
    t = image_to_tensor(image, 16, 48)
    assert t[:, :, :16].max().item() == -1.0
    torch.testing.assert_close(t[:, :, 16:32], torch.full((3, 16, 16), 64 / 255 * 2 - 1))
    assert t[:, :, 32:].min().item() == 1.0  # 16-bit white → 1.0
    assert np.array(to_rgb(image))[0, 40].tolist() == [255, 255, 255]
    assert np.array(to_rgb(image))[0, 20].tolist() == [64, 64, 64]
    # 16-bit data in a 32-bit "I" image (how PIL opens many 16-bit PNGs) reads the same.
    t_i = image_to_tensor(Image.fromarray(levels.astype(np.int32)), 16, 48)
    torch.testing.assert_close(t_i, t)


def test_alpha_is_dropped_like_the_reference() -> None:
    px = np.zeros((16, 16, 4), dtype=np.uint8)
    px[..., 0] = 200
    px[..., 3] = 0  # fully transparent red
    t = image_to_tensor(Image.fromarray(px), 16, 16)
    torch.testing.assert_close(t[0], torch.full((16, 16), 200 / 255 * 2 - 1))
    # A palette image whose only colour is marked transparent keeps that colour too.
    pal = Image.new("P", (16, 16), 0)
    pal.putpalette([10, 220, 30] + [0, 0, 0] * 255)
    pal.info["transparency"] = 0
    t = image_to_tensor(pal, 16, 16)
    torch.testing.assert_close(t[:, 0, 0], torch.tensor([10, 220, 30]) / 255 * 2 - 1)


def test_rgb_matches_the_reference_resize() -> None:
    """Same numbers as to_tensor → [-1, 1] → bicubic interpolate (no antialias)."""
    arr = _rgb_pattern(40, 56)
    ref = torch.from_numpy(arr).permute(2, 0, 1).float() / 255 * 2 - 1
    ref = F.interpolate(ref[None], size=(32, 48), mode="bicubic", align_corners=False)[0]
    ours = image_to_tensor(Image.fromarray(arr), 32, 48)  # not clamped by default, as there
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(image_to_tensor(Image.fromarray(arr), 32, 48, clamp=True), ref.clamp(-1, 1))
    small = _rgb_pattern(32, 48)  # already at the target size: no resampling at all
    same_size = image_to_tensor(Image.fromarray(small), 32, 48)
    torch.testing.assert_close(same_size, torch.from_numpy(small).permute(2, 0, 1).float() / 127.5 - 1)


def test_array_inputs() -> None:
    arr = _rgb_pattern(32, 32)
    from_pil = image_to_tensor(Image.fromarray(arr), 32, 32)
    torch.testing.assert_close(image_to_tensor(arr, 32, 32), from_pil)
    comfy = torch.from_numpy(arr).float()[None] / 255.0  # ComfyUI IMAGE [1, H, W, C]
    torch.testing.assert_close(image_to_tensor(comfy, 32, 32), from_pil)
    grey16 = np.full((32, 32), 65535, dtype=np.uint16)
    assert image_to_tensor(grey16, 32, 32).min().item() == 1.0
    with pytest.raises(ValueError, match="image array"):
        image_to_tensor(np.zeros((2, 32, 32, 3), dtype=np.uint8), 32, 32)
    with pytest.raises(ValueError, match="height"):
        image_to_tensor(arr, 30, 32)


# ----------------------------------------------------------------------------- mask and y


def test_first_frame_mask_layout() -> None:
    mask = first_frame_mask(9, 3, 5)
    assert mask.shape == (4, 3, 3, 5)
    assert torch.equal(mask[:, 0], torch.ones(4, 3, 5))
    assert torch.equal(mask[:, 1:], torch.zeros(4, 2, 3, 5))
    # The reference's construction restated: per-frame mask, frame 0 repeated 4×,
    # grouped by 4 frames, groups as channels.
    per_frame = torch.zeros(1, 9, 3, 5)
    per_frame[:, 0] = 1
    seq = torch.cat([per_frame[:, :1].repeat(1, 4, 1, 1), per_frame[:, 1:]], dim=1)
    assert torch.equal(mask, seq.view(1, 3, 4, 3, 5).transpose(1, 2)[0])
    assert first_frame_mask(1, 2, 2).shape == (4, 1, 2, 2)
    with pytest.raises(ValueError, match="got 8"):
        first_frame_mask(8, 2, 2)


def test_conditioning_video() -> None:
    img = torch.rand(3, 16, 32) * 2 - 1
    video = conditioning_video(img, 5)
    assert video.shape == (3, 5, 16, 32)
    assert torch.equal(video[:, 0], img)
    assert torch.equal(video[:, 1:], torch.zeros(3, 4, 16, 32))  # zeros in [-1, 1] space


class PoolingVAE(torch.nn.Module):
    """A stand-in encoder with the Wan VAE's strides: first frame alone, then groups of 4."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.seen: torch.Tensor | None = None

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        self.seen = video
        first = video[:, :, :1]
        rest = video[:, :, 1:]
        b, c, f, h, w = rest.shape
        rest = rest.reshape(b, c, f // 4, 4, h, w).mean(3)
        frames = torch.cat([first, rest], dim=2)
        pooled = F.avg_pool3d(frames, (1, 8, 8))
        return pooled.repeat(1, 6, 1, 1, 1)[:, :16] * self.scale


def test_build_i2v_condition() -> None:
    vae = PoolingVAE()
    img = torch.rand(3, 16, 32) * 2 - 1
    y = build_i2v_condition(vae, img, 9)
    assert y.shape == (20, 3, 2, 4)
    assert torch.equal(y[:4], first_frame_mask(9, 2, 4))
    assert vae.seen is not None and vae.seen.shape == (1, 3, 9, 16, 32)
    torch.testing.assert_close(y[4:7, 0], F.avg_pool2d(img[None], 8)[0])
    assert torch.equal(y[4:, 1:], torch.zeros(16, 2, 2, 4))
