"""pipeline/fast/worker.py and its callers: chunk n decoded and written on a worker thread
while chunk n+1 generates (tiny float32 model and VAE, CPU). The overlapped stream writes
the same .mp4 frames as the sequential one; a failure in the decode worker is the run's
error (nothing lost silently, the chunk before it written); a cancel in the worker stops
the run; no worker thread or chunk outlives it; a Play session overlapped makes the
sequential session's latent and frames."""
from __future__ import annotations

import gc
import threading
import time
import weakref

import av
import numpy as np
import pytest
import torch

from comfyui_lingbot_world.pipeline.fast import FastParams, stream_fast_video
from comfyui_lingbot_world.pipeline.fast.worker import ChunkWorker, worker_thread_alive
from comfyui_lingbot_world.pipeline.play import PlaySession, PlaySettings
from comfyui_lingbot_world.pipeline.play.registry import SessionRegistry
from comfyui_lingbot_world.pipeline.video_file import VideoWriter
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy
from comfyui_lingbot_world.wan.vae import WanVAE
from fast_helpers import HEIGHT, WIDTH, image, prompt, tiny_vae
from fast_helpers import one_thread, model, vae  # noqa: F401  (module fixtures)


@pytest.fixture(scope="module")
def vae_weights():
    return tiny_vae(seed=1).state_dict()


def start_image() -> np.ndarray:
    return np.random.default_rng(3).integers(0, 255, (HEIGHT + 8, WIDTH + 12, 3), dtype=np.uint8)


def stream(model, vae_weights, write, overlap: bool, frames: int = 45, **kw):
    params = FastParams(seed=5, policy=CachePolicy(window=6, sink=3))
    return stream_fast_video(model, prompt(), vae_weights, start_image(), frames, HEIGHT, WIDTH, None, params, write,
                             device="cpu", overlap=overlap, **kw)


def mp4_frames(path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def test_the_overlapped_stream_writes_the_sequential_streams_mp4(model, vae_weights, tmp_path):
    pieces: dict[bool, list] = {}
    threads: dict[bool, set] = {}
    for overlap in (False, True):
        got, names = [], set()
        with VideoWriter(tmp_path / f"overlap_{overlap}.mp4", fps=16) as writer:
            def write(video, writer=writer, got=got, names=names):
                names.add(threading.current_thread().name)
                got.append(video.clone())
                writer.write(video)

            result = stream(model, vae_weights, write, overlap)
        pieces[overlap], threads[overlap] = got, names
        assert result.chunks_done == 4 and result.frames_written == 45
    assert threads[False] == {threading.current_thread().name}
    assert all(name.startswith("lingbot-decode") for name in threads[True])  # really on the worker
    assert [p.shape[1] for p in pieces[True]] == [9, 12, 12, 12]
    assert all(torch.equal(a, b) for a, b in zip(pieces[False], pieces[True]))
    sequential, overlapped = mp4_frames(tmp_path / "overlap_False.mp4"), mp4_frames(tmp_path / "overlap_True.mp4")
    assert sequential.shape[0] == 45 and np.array_equal(sequential, overlapped)
    assert not worker_thread_alive()


def test_a_failure_in_the_decode_worker_is_the_runs_error_and_keeps_the_chunks_before(model, vae_weights,
                                                                                      monkeypatch):
    real = WanVAE.stream_decoder

    def failing_decoder(self, *args, **kwargs):
        decoder = real(self, *args, **kwargs)
        decode_next, calls = decoder.decode_next, []

        def decode(*a, **k):
            calls.append(threading.current_thread().name)
            if len(calls) == 2:
                raise RuntimeError("decode failed in chunk 2")
            return decode_next(*a, **k)

        decoder.decode_next = decode
        return decoder

    monkeypatch.setattr(WanVAE, "stream_decoder", failing_decoder)
    pieces = []
    with pytest.raises(RuntimeError, match="decode failed in chunk 2"):
        stream(model, vae_weights, pieces.append, overlap=True)
    assert [p.shape[1] for p in pieces] == [9]
    assert not worker_thread_alive()


def test_a_cancel_raised_in_the_worker_stops_the_run(model, vae_weights):
    class Cancelled(Exception):
        pass

    pieces = []

    def cancel():
        if pieces and threading.current_thread().name.startswith("lingbot-decode"):
            raise Cancelled  # pressed while chunk 2 decodes

    with pytest.raises(Cancelled):
        stream(model, vae_weights, pieces.append, overlap=True, check_interrupt=cancel)
    assert [p.shape[1] for p in pieces] == [9]
    assert not worker_thread_alive()


def test_the_worker_releases_its_chunks_and_its_thread():
    seen = []
    worker = ChunkWorker(lambda i, x: seen.append((i, float(x.sum()))), overlap=True)
    probes = []
    for i in range(3):
        x = torch.full((4,), float(i))
        probes.append(weakref.ref(x))
        worker.submit(i, x)
        del x
    worker.close()
    gc.collect()
    assert seen == [(0, 0.0), (1, 4.0), (2, 8.0)]  # in order
    assert all(p() is None for p in probes) and not worker_thread_alive()
    with pytest.raises(RuntimeError, match="closed"):
        worker.submit(3, torch.zeros(1))


def test_a_worker_failure_is_raised_by_check_and_dropped_under_the_callers_error():
    def work(i, x):
        raise ValueError(f"chunk {i} broke")

    worker = ChunkWorker(work, overlap=True)
    worker.submit(0, torch.zeros(1))
    with pytest.raises(ValueError, match="chunk 0 broke"):
        worker.wait()
    worker.submit(1, torch.zeros(1))
    worker.close(failed=True)  # the caller raises its own error: this one is not raised over it
    assert not worker_thread_alive()


class Writer:
    def __init__(self) -> None:
        self.pieces: list[torch.Tensor] = []

    def write(self, video: torch.Tensor) -> None:
        self.pieces.append(video.clone())

    def close(self) -> None:
        pass


def test_a_play_session_overlapped_makes_the_sequential_sessions_latent_and_frames(model, vae):
    made = {}
    for overlap in (False, True):
        writer, events = Writer(), []
        settings = PlaySettings(width=WIDTH, height=HEIGHT, seed=11, chunk_budget=3, mode="continuous", poll_s=0.005,
                                policy=CachePolicy(window=6, sink=3, dtype="bf16"))
        session = PlaySession(model, prompt(), vae, image(), settings, writer=writer,
                              emit=lambda event, data, events=events: events.append((event, data)),
                              registry=SessionRegistry(), overlap=overlap)
        result = session.run()
        frames = [d for e, d in events if e == "lingbot.play.frames"]
        made[overlap] = (result, writer.pieces, frames)
        assert result.reason == "budget" and result.chunks == 3 and result.frames == 33
        assert [(f["chunk"], f["part"], f["first_frame"]) for f in frames] == [
            (0, 0, 0), (0, 1, 1), (0, 2, 5), (1, 0, 9), (1, 1, 13), (1, 2, 17), (2, 0, 21), (2, 1, 25), (2, 2, 29)]
        assert events[-1][1]["state"] == "ended" and events[-1][1]["chunks_done"] == 3
    (seq, seq_pieces, seq_frames), (ovl, ovl_pieces, ovl_frames) = made[False], made[True]
    assert torch.equal(seq.latent, ovl.latent)
    assert len(seq_pieces) == len(ovl_pieces) == 9  # one piece per latent frame
    assert all(torch.equal(a, b) for a, b in zip(seq_pieces, ovl_pieces))
    assert [f["frames"] for f in seq_frames] == [f["frames"] for f in ovl_frames]  # the page's JPEGs too
    assert not worker_thread_alive()


def test_turn_based_the_next_chunk_starts_when_its_key_arrives_not_after_the_decode(model, vae):
    """Overlapped, a press while chunk 1 is still decoding starts chunk 2 at once: chunk 2
    is made before chunk 1's frames are out; then both are delivered in order."""
    release = threading.Event()
    writer, events = Writer(), []
    settings = PlaySettings(width=WIDTH, height=HEIGHT, seed=11, chunk_budget=5, poll_s=0.005,
                            policy=CachePolicy(window=6, sink=3, dtype="bf16"))
    session = PlaySession(model, prompt(), vae, image(), settings, writer=writer,
                          emit=lambda event, data: events.append((event, data)), registry=SessionRegistry(),
                          overlap=True)
    real_deliver = session._deliver

    def slow_deliver(c, x0):
        assert release.wait(60)  # chunk 1's decode holds until the test lets it go
        real_deliver(c, x0)

    session._deliver = slow_deliver
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", session.run()), daemon=True)
    thread.start()

    def wait_until(condition, timeout=60.0):
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.005)

    wait_until(lambda: session._generator is not None)
    session.controls.set_keys(frozenset("w"))
    wait_until(lambda: session._generator.chunk_index == 1 and not session.controls.running)
    session.controls.set_keys(frozenset("wd"))  # pressed while chunk 1 decodes
    wait_until(lambda: session._generator.chunk_index == 2)
    assert session.chunks_done == 0 and writer.pieces == []  # chunk 2 was made before chunk 1's frames
    release.set()
    wait_until(lambda: session.chunks_done == 2 and not session.controls.running)
    session.controls.act("stop")
    thread.join(60)
    result = out["result"]
    assert result.reason == "stop" and result.chunks == 2 and [p.shape[1] for p in writer.pieces] == [1, 4, 4, 4, 4, 4]
    frames = [d for e, d in events if e == "lingbot.play.frames"]
    assert [(f["chunk"], f["keys"]) for f in frames] == [(0, "w")] * 3 + [(1, "wd")] * 3
    assert not worker_thread_alive()
