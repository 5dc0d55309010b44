"""nodes/host/tiny_vae.py: Play's live decoder, ComfyUI's tiny video VAE (TAEHV) fed one latent
frame at a time (CPU host). Its pieces together are ComfyUI's own whole-latent decode bit for
bit (raw Wan 2.1 latents in, [-1, 1] out); VAEs it cannot stream are refused by name; a Play
session given it sends and writes its frames."""
from __future__ import annotations

import pytest
import torch

from comfy_host import use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
from comfy.taesd.taehv import TAEHV  # noqa: E402

from fast_helpers import HEIGHT, WIDTH, image, prompt  # noqa: E402
from fast_helpers import one_thread, model, vae  # noqa: E402,F401  (module fixtures)
from comfyui_lingbot_world.nodes.host.tiny_vae import TinyStreamDecoder, tiny_video_vae  # noqa: E402
from comfyui_lingbot_world.pipeline.play import PlaySession, PlaySettings  # noqa: E402
from comfyui_lingbot_world.pipeline.play.registry import SessionRegistry  # noqa: E402
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy  # noqa: E402
from comfyui_lingbot_world.wan.vae import LATENT_MEAN, LATENT_STD  # noqa: E402


def random_taehv(channels: int = 16, seed: int = 0) -> TAEHV:
    net = TAEHV(latent_channels=channels)
    generator = torch.Generator().manual_seed(seed)
    for param in net.parameters():  # ComfyUI's layers skip init: its loaders fill them
        param.data = torch.randn(param.shape, generator=generator) * 0.02  # frames mostly inside [-1, 1]
    return net.eval().requires_grad_(False)


class FakeComfyVAE:
    """What Load VAE gives a node: an object whose first_stage_model is the network."""

    def __init__(self, first_stage_model) -> None:
        self.first_stage_model = first_stage_model


def test_streamed_pieces_are_comfyuis_whole_decode_of_the_raw_latent():
    taehv = random_taehv()
    latent = torch.randn(1, 16, 7, 4, 6, generator=torch.Generator().manual_seed(1))  # normalized, as Fast makes
    stats = (1, 16, 1, 1, 1)
    raw = latent * torch.tensor(LATENT_STD).view(stats) + torch.tensor(LATENT_MEAN).view(stats)
    with torch.no_grad():
        whole = taehv.decode(raw).float() * 2 - 1  # ComfyUI's decode: [B, 3, T', H, W] in [0, 1]
    assert (whole.abs() < 1).any() and (whole.abs() > 1).any()  # both sides of the clamp are checked
    decoder = TinyStreamDecoder(taehv, torch.device("cpu"), torch.float32)
    pieces = [decoder.decode_next(latent[:, :, :1])]  # Play's parts: 1 latent frame, then chunks of 3 fed 1 by 1
    pieces += [decoder.decode_next(latent[:, :, i:i + 1]) for i in range(1, 4)]
    pieces.append(decoder.decode_next(latent[:, :, 4:7]))  # several frames a call: the same pieces
    assert [p.shape[2] for p in pieces] == [1, 4, 4, 4, 12]
    streamed = torch.cat(pieces, dim=2)
    assert streamed.shape == (1, 3, 25, 32, 48)
    assert torch.equal(streamed, whole.clamp(-1, 1))
    decoder.close()
    again = TinyStreamDecoder(taehv, torch.device("cpu"), torch.float32)  # a new stream starts afresh
    assert torch.equal(again.decode_next(latent[:, :, :1]), pieces[0])


def test_vaes_it_cannot_stream_are_refused_naming_the_input():
    with pytest.raises(ValueError, match="live_decoder: expected a tiny video VAE for Wan 2.1.*got a Linear"):
        tiny_video_vae(FakeComfyVAE(torch.nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="live_decoder: expected a tiny video VAE.*got a object"):
        tiny_video_vae(object())
    with pytest.raises(ValueError, match="48-channel latents.*lighttaew2_1"):
        tiny_video_vae(FakeComfyVAE(TAEHV(latent_channels=48)))
    assert isinstance(tiny_video_vae(FakeComfyVAE(random_taehv())), TAEHV)
    decoder = TinyStreamDecoder(random_taehv(), torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match=r"latent has shape \(1, 4, 1, 4, 6\)"):
        decoder.decode_next(torch.zeros(1, 4, 1, 4, 6))


def test_a_play_session_decodes_with_the_live_decoder(model, vae):
    taehv = random_taehv(seed=2)
    made: list[TinyStreamDecoder] = []

    def make() -> TinyStreamDecoder:
        made.append(TinyStreamDecoder(taehv, torch.device("cpu"), torch.float32))
        return made[-1]

    pieces: list[torch.Tensor] = []

    class Writer:
        def write(self, video):
            pieces.append(video.clone())

        def close(self):
            pass

    settings = PlaySettings(width=WIDTH, height=HEIGHT, seed=11, chunk_budget=2, mode="continuous", poll_s=0.005,
                            policy=CachePolicy(window=6, sink=3, dtype="bf16"))
    events: list = []
    session = PlaySession(model, prompt(), vae, image(), settings, writer=Writer(), registry=SessionRegistry(),
                          emit=lambda event, data: events.append((event, data)), overlap=True, decoder=make)
    result = session.run()
    assert result.reason == "budget" and result.frames == 21 and len(made) == 1
    assert made[0].latent_frames_done == 6  # every latent frame went through the tiny decoder
    reference = TinyStreamDecoder(taehv, torch.device("cpu"), torch.float32)
    expected = reference.decode_next(result.latent[None])[0]
    assert torch.equal(torch.cat(pieces, dim=1), expected)  # the .mp4 got the tiny decoder's frames
    sent = [d for e, d in events if e == "lingbot.play.frames"]
    assert sum(len(d["frames"]) for d in sent) == 21
