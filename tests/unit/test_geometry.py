"""wan/geometry.py: the model's fixed numbers and the conversions between video and latent
sizes (frames 4n + 1 <-> latent frames, pixels <-> latent cells, tokens per latent), and the
seed range. That no other module writes them again: test_facts.py."""
from __future__ import annotations

import numpy as np
import pytest

from comfyui_lingbot_world.wan.geometry import (
    CHUNK_FRAMES,
    MAX_SEED,
    PATCH_SIZE,
    SIZE_MULTIPLE,
    VAE_STRIDE_S,
    VAE_STRIDE_T,
    check_seed,
    latent_frames,
    latent_shape,
    latent_size,
    pixel_size,
    video_frames,
    video_tokens,
)


def test_the_strides_and_the_size_multiple_are_the_wan21_vaes_and_the_dits():
    assert (VAE_STRIDE_T, VAE_STRIDE_S, PATCH_SIZE, SIZE_MULTIPLE) == (4, 8, (1, 2, 2), 16)


@pytest.mark.parametrize("frames, latent", [(1, 1), (5, 2), (9, 3), (81, 21), (961, 241)])
def test_frames_and_latent_frames_convert_both_ways_on_4n_plus_1_counts(frames, latent):
    assert latent_frames(frames) == latent and video_frames(latent) == frames


def test_a_count_between_4n_plus_1_counts_keeps_its_whole_latent_frames():
    assert [latent_frames(f) for f in (6, 7, 8)] == [2, 2, 2]  # the VAE encodes what fits
    assert video_frames(CHUNK_FRAMES) == 9 and video_frames(2 * CHUNK_FRAMES) == 21  # one and two Fast chunks


def test_pixels_and_latent_cells_convert_both_ways():
    assert latent_size(480, 832) == (60, 104) and pixel_size(60, 104) == (480, 832)
    assert latent_size(487, 839) == (60, 104)  # a partial cell is not one
    assert latent_shape(81, 480, 832) == (21, 60, 104)
    assert latent_size(np.int64(32), 48.0) == (4, 6)  # numpy and float sizes from widgets and files


def test_tokens_are_one_per_patch_of_latent_cells():
    assert video_tokens(21, 60, 104) == 21 * 30 * 52
    assert video_tokens(3, 4, 6, patch=(1, 1, 1)) == 72


@pytest.mark.parametrize("seed", [0, 7, MAX_SEED, np.uint64(MAX_SEED), np.int32(3)])
def test_a_seed_in_range_is_kept_as_an_int(seed):
    assert check_seed(seed) == int(seed) and type(check_seed(seed)) is int


@pytest.mark.parametrize("seed", [-1, MAX_SEED + 1, True, 1.0, "3", None])
def test_a_seed_out_of_range_or_of_another_type_is_refused_naming_the_field(seed):
    with pytest.raises(ValueError, match=rf"^noise_seed must be a whole number within 0\.\.{MAX_SEED} "):
        check_seed(seed, "noise_seed")
