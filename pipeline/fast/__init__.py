"""LingBot-World Fast: causal chunk-by-chunk generation with a bounded KV cache.

* ``generator``: ``FastParams``, ``FastGenerator`` (the chunk engine: ``next_chunk(camera)``,
  ``run(plan, on_chunk)`` — the one chunk loop, ``close()``), ``ChunkPlan``, ``sample_fast``
  (a whole clip), ``fast_latent_frames`` (which frame counts fill whole chunks).
* ``worker``: ``ChunkWorker`` (chunk n decoded and written beside chunk n+1's generation).
* ``noise``: ``ChunkNoise`` (each chunk's noise from (seed, chunk): the start of a run does
  not depend on its length; the nodes use it) and ``OfficialOrderNoise`` (the official
  draw order, for comparisons with the official math).
* ``conditions``: the image condition per chunk (``WholeI2V``, ``StreamedI2V``) and the
  camera per chunk (``SlicedCamera``, ``KeyframeCamera``).
* ``stream``: ``stream_fast_video`` (a long video in one causal pass, each chunk decoded and
  written as it finishes), ``stream_frames`` (961 asked -> 957 made; the camera spans the 961 asked).
The cache itself (``CachePolicy``, ``KVCache``) is execution machinery in
``wan/runtime/kv_cache.py``; streaming decode is ``WanVAE.stream_decoder``.
"""
from .conditions import KeyframeCamera, SlicedCamera, StreamedI2V, WholeI2V, path_camera
from .generator import (DEFAULT_POLICY, ChunkPlan, FastGenerator, FastOutOfMemoryError, FastParams, fast_latent_frames,
                        sample_fast)
from .noise import ChunkNoise, OfficialOrderNoise
from .stream import StreamResult, frames_note, stream_fast_video, stream_frames
from .worker import ChunkWorker

__all__ = ["ChunkNoise", "ChunkPlan", "ChunkWorker", "DEFAULT_POLICY", "FastGenerator", "FastOutOfMemoryError", "FastParams", "KeyframeCamera", "OfficialOrderNoise", "path_camera",
           "SlicedCamera", "StreamResult", "StreamedI2V", "WholeI2V", "fast_latent_frames", "sample_fast",
           "frames_note", "stream_fast_video", "stream_frames"]
