"""A long LingBot-World Fast video in one causal pass, each chunk decoded and written as it finishes.

Up to 957 frames (961 asked: the last whole chunk ends at 957; the camera spans the 961) come out of one
``FastGenerator`` session: the KV cache carries the scene from chunk to chunk, so there
are no windows and no seams. Nothing of the whole video is ever held: the image
condition is encoded lazily by the VAE's causal stream (``StreamedI2V``), the camera is
made chunk by chunk (``KeyframeCamera``), and each chunk's latent goes through the VAE's
stream decoder (``WanVAE.stream_decoder``: all calls together equal the whole decode) to
``write`` at once. Memory is the transformer, the cache (fixed by its policy), the VAE
and the decoder's carried state (docs/fast_engine.md#memory-of-the-vae-streams), whatever
the length. A cancel or an error leaves every chunk written before it in the file.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ...wan.conditioning import check_size, image_to_tensor
from ..guards import NonFiniteError, is_finite, vae_precision
from ..image import ImageLike, VAESource, as_pil, open_vae
from ..memory import build_or_release, empty_device_cache, release_module, resolve_device
from .conditions import CameraSource, StreamedI2V, whole_chunk_latents
from .generator import FastGenerator, FastParams, fast_latent_frames, non_finite_message, out_of_memory_message


@dataclass
class StreamResult:
    frames: int  # the video's frame count (whole chunks)
    chunks: int
    chunks_done: int = 0
    frames_written: int = 0


def stream_frames(frames: int, chunk: int = 3) -> int:
    """The frames a stream makes for ``frames`` asked (4n + 1): the longest whole-chunk count
    not above it (961 -> 957, 81 -> 81, 85 -> 81), as the official ``generate_fast`` cuts its
    latent. The camera still spans the frames asked (``path_camera(path, frames, ...)``).
    ValueError naming ``frames`` when not even one chunk fits."""
    return (whole_chunk_latents(frames, chunk) - 1) * 4 + 1


def frames_note(frames: int, chunk: int = 3) -> str | None:
    """What a user who asked ``frames`` should be told (None when the count is whole chunks)."""
    made = stream_frames(frames, chunk)
    if made == frames:
        return None
    # The camera path still spans the frames asked (``path_camera``), as in the official code.
    return f"frames={frames} asked; {made} made (whole {4 * chunk}-frame chunks)"


def stream_fast_video(
    model: nn.Module,
    text: torch.Tensor,
    vae_file: VAESource,
    image: ImageLike,
    frames: int,
    height: int,
    width: int,
    camera: CameraSource | None,
    params: FastParams,
    write: Callable[[torch.Tensor], None],
    device: torch.device | str | None = None,
    precision: str = "fp32",
    decode_tile: int | None = None,
    on_step: Callable[[int, int], None] | None = None,
    on_preview: Callable[[int, int, torch.Tensor], None] | None = None,
    check_interrupt: Callable[[], None] | None = None,
) -> StreamResult:
    """Generate ``frames`` frames (whole chunks: ``fast_latent_frames``) chunk by chunk and
    ``write`` each chunk's decoded frames [3, n, H, W] in [-1, 1] as it finishes (9 frames
    for the first chunk, 12 after).

    ``text``: the prompt's states [tokens, text_dim]; ``camera``: a chunk source
    (``KeyframeCamera``) or None. ``vae_file`` (a file or a state dict) is opened once in
    ``precision`` ("fp32" or "bf16": half the decoder's carried state) on ``device`` and
    encodes the image condition as well. ``on_step(done, total)`` after every denoising
    step, ``on_preview(done, total, x0)`` after every chunk (before its decode);
    ``check_interrupt`` before every forward, transformer block and decoded frame. A CUDA
    OOM frees everything and is raised again naming the size and what to change.
    """
    chunk = params.policy.chunk
    latent_frames = fast_latent_frames(frames, chunk)
    check_size(height, width)
    device = resolve_device(device)
    pixels = image_to_tensor(as_pil(image), height, width)
    chunks = latent_frames // chunk
    result = StreamResult(frames=frames, chunks=chunks)
    vae = build_or_release(lambda: open_vae(vae_file, device, vae_precision(precision)))
    source = generator = decoder = None
    detail, failed_chunk = None, 0
    try:
        # The decoder needs the VAE to the end, so the condition never releases it; its
        # encoder state goes once the condition is proven constant, which prefetch reaches
        # before the first chunk: the encoder's activations and the decoder's state are then
        # never on the GPU together (bench/RESULTS.md: the difference between an
        # out-of-memory and 22.2 GiB for 957 frames under a 24 GiB cap).
        source = StreamedI2V(vae, pixels, latent_frames, check_interrupt=check_interrupt)
        source.prefetch()
        decoder = vae.stream_decoder(decode_tile)
        generator = FastGenerator(model, text, source, params, latent_frames=latent_frames,
                                  check_interrupt=check_interrupt)
        steps = generator.schedule.steps
        for c in range(chunks):
            failed_chunk = c
            cam = None if camera is None else camera.chunk(c * chunk, chunk)
            step_done = (lambda i, _x, c=c: on_step(c * steps + i + 1, chunks * steps)) if on_step else None
            x0 = generator.next_chunk(cam, commit=c + 1 < chunks, on_step=step_done)
            del cam
            if not is_finite(x0):
                raise NonFiniteError(non_finite_message(c, chunks))
            if on_preview is not None:
                on_preview(c + 1, chunks, x0)
            with torch.inference_mode():
                video = decoder.decode_next(x0[None].to(vae.dtype), cancel=check_interrupt)[0]
            del x0
            video = video.float().cpu()
            write(video)
            result.frames_written += video.shape[1]
            result.chunks_done += 1
            del video
        return result
    except torch.cuda.OutOfMemoryError as exc:
        detail = str(exc)  # only the text: the traceback holds the chunk's activations
    finally:
        if generator is not None:
            generator.close()
        if decoder is not None:
            decoder.close()
        if source is not None:
            source.close()
        release_module(vae)
        del vae
    empty_device_cache()
    raise torch.cuda.OutOfMemoryError(out_of_memory_message(frames, height, width, params.policy, failed_chunk + 1,
                                                            detail))


__all__ = ["StreamResult", "frames_note", "stream_fast_video", "stream_frames"]
