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
from ...wan.geometry import CHUNK_FRAMES, VAE_STRIDE_T, video_frames
from ..guards import vae_precision
from ..image import ImageLike, VAESource, as_pil, open_vae
from ..memory import build_or_release, empty_device_cache, release_module, resolve_device
from .conditions import CameraSource, StreamedI2V, whole_chunk_latents
from .generator import (ChunkPlan, FastGenerator, FastOutOfMemoryError, FastParams, fast_latent_frames,
                        out_of_memory_message)
from .worker import ChunkWorker, generation_first


@dataclass
class StreamResult:
    frames: int  # the video's frame count (whole chunks)
    chunks: int
    chunks_done: int = 0
    frames_written: int = 0


def stream_frames(frames: int, chunk: int = CHUNK_FRAMES) -> int:
    """The frames a stream makes for ``frames`` asked (4n + 1): the longest whole-chunk count
    not above it (961 -> 957, 81 -> 81, 85 -> 81), as the official ``generate_fast`` cuts its
    latent. The camera still spans the frames asked (``path_camera(path, frames, ...)``).
    ValueError naming ``frames`` when not even one chunk fits."""
    return video_frames(whole_chunk_latents(frames, chunk))


def frames_note(frames: int, chunk: int = CHUNK_FRAMES) -> str | None:
    """What a user who asked ``frames`` should be told (None when the count is whole chunks)."""
    made = stream_frames(frames, chunk)
    if made == frames:
        return None
    # The camera path still spans the frames asked (``path_camera``), as in the official code.
    return f"frames={frames} asked; {made} made (whole {VAE_STRIDE_T * chunk}-frame chunks)"


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
    overlap: bool | None = None,
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
    ``overlap``: decode and write chunk n on a worker thread (and a second CUDA stream)
    while chunk n+1 generates (``ChunkWorker``; the same frames in the same order); False:
    one after the other; None: overlap on a GPU (on the CPU both would share the cores).
    """
    chunk = params.policy.chunk
    latent_frames = fast_latent_frames(frames, chunk)
    check_size(height, width)
    device = resolve_device(device)
    pixels = image_to_tensor(as_pil(image), height, width)
    chunks = latent_frames // chunk
    result = StreamResult(frames=frames, chunks=chunks)
    vae = build_or_release(lambda: open_vae(vae_file, device, vae_precision(precision)))
    source = generator = decoder = worker = None
    failed, detail = True, None
    try:
        # The decoder needs the VAE to the end, so the condition never releases it; its
        # encoder state goes once the condition is proven constant, which prefetch reaches
        # before the first chunk: the encoder's activations and the decoder's state are then
        # never on the GPU together (bench/RESULTS.md: the difference between an
        # out-of-memory and 22.2 GiB for 957 frames under a 24 GiB cap). Past that point
        # every chunk's condition is already made (the next chunk's is prefetched).
        source = StreamedI2V(vae, pixels, latent_frames, check_interrupt=check_interrupt)
        source.prefetch()
        decoder = vae.stream_decoder(decode_tile)

        vae_device, vae_dtype = vae.device, vae.dtype  # the VAE may be on the CPU, the chunk on the GPU

        def decode_and_write(_c: int, x0: torch.Tensor) -> None:
            video = decoder.decode_next(x0[None].to(device=vae_device, dtype=vae_dtype), cancel=check_interrupt)[0]
            video = video.float().cpu()
            write(video)
            result.frames_written += video.shape[1]
            result.chunks_done += 1

        model_device = model.patch_embedding.weight.device  # the VAE's may be the CPU
        worker = ChunkWorker(decode_and_write, overlap=model_device.type == "cuda" if overlap is None else overlap,
                             device=model_device)

        def check() -> None:  # the worker's failure stops the next forward, as a cancel does
            worker.check()
            if check_interrupt is not None:
                check_interrupt()

        generator = FastGenerator(model, text, source, params, latent_frames=latent_frames, check_interrupt=check)

        def plan(c: int) -> ChunkPlan:
            return ChunkPlan(None if camera is None else camera.chunk(c * chunk, chunk), commit=c + 1 < chunks)

        def finished(c: int, x0: torch.Tensor) -> None:
            if on_preview is not None:
                on_preview(c + 1, chunks, x0)
            worker.submit(c, x0)

        with generation_first(model_device, worker.overlap):  # the decode beside yields to the chunks
            generator.run(plan, finished, on_step, chunks)
        worker.close()  # the last chunk's decode
        failed = False
        return result
    except FastOutOfMemoryError:
        raise
    except torch.cuda.OutOfMemoryError as exc:  # outside the chunks: the condition, the decode
        detail = str(exc)  # only the text: the traceback holds the activations
    finally:
        if worker is not None:
            worker.close(failed=failed)  # a failure: the chunk in flight is still written
        if generator is not None:
            generator.close()
        if decoder is not None:
            decoder.close()
        if source is not None:
            source.close()
        release_module(vae)
        del vae
    empty_device_cache()
    raise FastOutOfMemoryError(out_of_memory_message(frames, height, width, params.policy, result.chunks_done + 1,
                                                     detail))


__all__ = ["StreamResult", "frames_note", "stream_fast_video", "stream_frames"]
