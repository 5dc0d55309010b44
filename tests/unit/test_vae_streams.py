"""The VAE as streams for LingBot-World Fast: chunked decoding equals the whole decode,
and the lazily encoded image condition equals the whole encode (reusing frames only once
the encoder's state is proven bitwise constant)."""
from __future__ import annotations

import pytest
import torch

from comfyui_lingbot_world.pipeline.fast import StreamedI2V
from i2v_reference import build_i2v_condition
from fast_helpers import HEIGHT, LAT_H, LAT_W, WIDTH, image, video_frames
from fast_helpers import one_thread, vae  # noqa: F401  (module fixtures)


@pytest.mark.parametrize("tile", [None, 3])
def test_streaming_decode_equals_the_whole_decode(vae, tile):
    latent = torch.randn(1, 16, 10, LAT_H, LAT_W, generator=torch.Generator().manual_seed(0))
    whole = vae.decode(latent, tile=tile)
    stream = vae.stream_decoder(tile=tile)
    pieces = [stream.decode_next(latent[:, :, a:b]) for a, b in ((0, 3), (3, 6), (6, 7), (7, 10))]
    assert [p.shape[2] for p in pieces] == [9, 12, 4, 12]  # 1 + 4(T-1) frames first, 4T after
    assert torch.equal(torch.cat(pieces, dim=2), whole)
    stream.close()


def test_streaming_decode_one_latent_frame_at_a_time_equals_the_chunk_decode(vae):
    """Play's parts: a chunk's latent frames decoded one at a time (the first gives 1 frame,
    each after 4) are bitwise the chunks decoded 3 latent frames a call."""
    latent = torch.randn(1, 16, 6, LAT_H, LAT_W, generator=torch.Generator().manual_seed(1))
    chunks, frames = vae.stream_decoder(), vae.stream_decoder()
    whole = torch.cat([chunks.decode_next(latent[:, :, a:a + 3]) for a in (0, 3)], dim=2)
    pieces = [frames.decode_next(latent[:, :, i:i + 1]) for i in range(6)]
    assert [p.shape[2] for p in pieces] == [1, 4, 4, 4, 4, 4]
    assert torch.equal(torch.cat(pieces, dim=2), whole)
    chunks.close()
    frames.close()


def test_stream_decoder_and_encoder_refuse_a_second_video_or_wrong_groups(vae):
    stream = vae.stream_decoder()
    stream.decode_next(torch.zeros(1, 16, 1, LAT_H, LAT_W))
    with pytest.raises(ValueError, match="one stream decodes one video"):
        stream.decode_next(torch.zeros(1, 16, 1, LAT_H + 2, LAT_W))
    encoder = vae.stream_encoder()
    with pytest.raises(ValueError, match=r"the first frame alone, then groups of 4"):
        encoder.encode_next(torch.zeros(1, 3, 4, HEIGHT, WIDTH))
    encoder.encode_next(torch.zeros(1, 3, 1, HEIGHT, WIDTH))
    with pytest.raises(ValueError, match=r"\[batch, 3, 4, height, width\]"):
        encoder.encode_next(torch.zeros(1, 3, 3, HEIGHT, WIDTH))


def test_lazy_condition_equals_the_whole_encode_and_reuses_only_proven_constant_frames(vae):
    latent_frames = 45  # past the tiny encoder's fixed point (~30 latent frames; the receptive field
    #                     in time is the architecture's, so the real VAE has the same one)
    with torch.inference_mode():
        whole = build_i2v_condition(vae, image(), video_frames(latent_frames))
    released = []
    lazy = StreamedI2V(vae, image(), latent_frames, release_vae=lambda: released.append(True))
    first = lazy.chunk(0, 3)
    assert lazy.encoded == 3 and not released  # only what the first chunk needs
    assert torch.equal(first, whole[:, :3])
    chunks = [first] + [lazy.chunk(c, 3) for c in range(3, latent_frames, 3)]
    assert torch.equal(torch.cat(chunks, dim=1), whole)
    # reuse started only after the state was seen unchanged, and the VAE was let go then
    assert lazy.constant_from is not None and lazy.encoded == lazy.constant_from + 1 < latent_frames
    assert released == [True]
    latents = whole[4:]
    first_constant = next(i for i in range(latent_frames)
                          if all(torch.equal(latents[:, j], latents[:, i]) for j in range(i, latent_frames)))
    assert lazy.constant_from >= first_constant
    assert not torch.equal(latents[:, first_constant - 1], latents[:, first_constant])
    print(f"latent frames constant from {first_constant}; reuse proven from {lazy.constant_from}")


def test_open_ended_condition_and_prefetch(vae):
    released = []
    lazy = StreamedI2V(vae, image(), None, release_vae=lambda: released.append(True))
    lazy.prefetch()  # open-ended: until the frames are proven constant
    assert released and lazy.constant_from is not None
    far = lazy.chunk(300, 3)
    assert torch.equal(far[4:, 0], lazy.latent(lazy.constant_from)) and far[:4].abs().sum() == 0
    assert torch.equal(lazy.chunk(0, 3)[:4, 0], torch.ones(4, LAT_H, LAT_W))
    released.clear()
    bounded = StreamedI2V(vae, image(), 6, release_vae=lambda: released.append(True))
    with pytest.raises(ValueError, match="6 latent frames; frame 6"):
        bounded.chunk(6, 3)
    bounded.prefetch()
    assert bounded.encoded == 6 and released == [True]  # the last frame encoded: the VAE is let go
    assert torch.equal(bounded.chunk(3, 3)[4:], torch.stack([bounded.latent(i) for i in (3, 4, 5)], 1))
    unused = StreamedI2V(vae, image(), 6)
    unused.close()
    with pytest.raises(RuntimeError, match="released"):
        unused.chunk(0, 3)
