"""A Play session (pipeline/play/session.py, registry.py, frames.py) on a tiny Fast model:
its latents replayed from its log (read back by log_file.py) through the Fast clip path
bit for bit (sliding window with eviction, bf16 and int8 caches), the frames written and
sent (each chunk in parts, one per latent frame, bit for bit its whole decode), every way
it ends (budget, Stop, idle, an interrupt while waiting or mid-chunk, an error) closing the
file and freeing the cache, and one session at a time."""
from __future__ import annotations

import base64
import json
import io
import json
import threading
import time
import weakref

import pytest
import torch
from PIL import Image

from comfyui_lingbot_world.pipeline.camera import camera_condition, path_from_play_actions
from comfyui_lingbot_world.pipeline.fast import FastParams, WholeI2V, sample_fast
from comfyui_lingbot_world.pipeline.play import PlaySession, PlaySettings
from comfyui_lingbot_world.pipeline.play.frames import jpeg_frames
from comfyui_lingbot_world.pipeline.play.log_file import PlayLog, parse_play_log
from comfyui_lingbot_world.pipeline.play.registry import SessionRegistry
from i2v_reference import build_i2v_condition
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy
from comfyui_lingbot_world.wan.scheduler import fast_step_indices
from fast_helpers import HEIGHT, WIDTH, image, prompt
from fast_helpers import one_thread, model, vae  # noqa: F401  (module fixtures)


class Writer:
    def __init__(self) -> None:
        self.pieces: list[torch.Tensor] = []
        self.closed = 0

    def write(self, video: torch.Tensor) -> None:
        self.pieces.append(video.clone())

    def close(self) -> None:
        self.closed += 1


# What the Play node adds to a session's log (nodes/host/play_run.py): the prompt texts, the start image.
RECIPE = {"prompt": "a street", "negative_prompt": "", "prompt_source": "text",
          "start_image": {"file": None, "sha256": None, "pixels_sha256": "0" * 64}}


class Interrupted(Exception):
    pass


def settings(**overrides) -> PlaySettings:
    values = dict(width=WIDTH, height=HEIGHT, seed=11, chunk_budget=20, poll_s=0.005,
                  policy=CachePolicy(window=6, sink=3, dtype="bf16"))
    return PlaySettings(**{**values, **overrides})


def make_session(model, vae, registry=None, **kwargs) -> tuple[PlaySession, Writer, list]:
    events: list = []
    writer = Writer()
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in PlaySettings.__dataclass_fields__}
    emit = kwargs.pop("emit", lambda event, data: events.append((event, data)))
    session = PlaySession(model, prompt(), vae, image(), settings(**options), writer=writer, emit=emit,
                          controller="tab-1", node_id="7", registry=registry or SessionRegistry(), **kwargs)
    return session, writer, events


def start(session: PlaySession) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = session.run()
        except BaseException as exc:  # noqa: BLE001 (the test reads what was raised)
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def wait_until(condition, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def press(session: PlaySession, keys: str) -> None:
    """Hold ``keys`` (a press in turn mode) and wait for the chunk it starts to finish (a
    press while a chunk runs only changes the held keys)."""
    wait_until(lambda: not session.controls.running)
    before = session.chunks_done
    session.controls.set_keys(frozenset(keys))
    wait_until(lambda: session.ended or (session.chunks_done > before and not session.controls.running))


def replay(model, vae, log: PlayLog | dict, steps: int | None = None) -> torch.Tensor:
    """The Fast clip path the replay workflow takes from the log (as the Play Log node reads it,
    or a session's own log dict): whole image condition, the Camera node's per-chunk (Play)
    timing, sample_fast with the same seed, steps and cache settings (``steps``: another count
    than the log's)."""
    field = (lambda name: log[name]) if isinstance(log, dict) else (lambda name: getattr(log, name))
    frames = field("frames")
    path = path_from_play_actions(field("actions"), frames, HEIGHT, WIDTH)
    camera = camera_condition(path, frames, HEIGHT, WIDTH)
    with torch.inference_mode():
        y = build_i2v_condition(vae, image(), frames)
    policy = CachePolicy(window=field("kv_window"), sink=field("kv_sink"), dtype=field("kv_dtype"))
    params = FastParams(seed=field("seed"), shift=field("shift"), policy=policy,
                        timestep_indices=fast_step_indices(field("steps") if steps is None else steps))
    return sample_fast(model, prompt(), WholeI2V(y), camera, params, frames)


# --------------------------------------------------------------------------- replay

@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
def test_the_action_log_replays_through_the_clip_path_bit_for_bit(model, vae, kv_dtype):
    """The log a session writes, read back by pipeline/play/log_file.py (what the Play Log
    node gives the Fast clip nodes), replays the session's latent."""
    session, writer, events = make_session(model, vae, policy=CachePolicy(window=6, sink=3, dtype=kv_dtype),
                                           recipe=RECIPE)
    thread, out = start(session)
    for keys in ["w", "", "wj", "l", "", "dk"]:  # 4 chunks: the 6-frame window evicts from chunk 2 on
        if keys:
            press(session, keys)
        else:
            session.controls.set_keys(frozenset())
    session.controls.act("stop")
    thread.join(60)
    result = out["result"]
    assert result.reason == "stop" and result.chunks == 4 and result.frames == 45
    assert result.log["actions"] == "w-8,wj-12,l-12,dk-12" and result.log["chunk_keys"] == ["w", "wj", "l", "dk"]
    assert result.log["keyframes"] == "per chunk (Play)" and result.log["kv_dtype"] == kv_dtype
    read = parse_play_log(json.dumps(result.log), "play_00001_.json")
    assert (read.prompt, read.start_image.pixels_sha256, read.seed, read.fps) == ("a street", "0" * 64, 11, 16)
    again = replay(model, vae, read)
    assert again.shape == result.latent.shape == (16, 12, HEIGHT // 8, WIDTH // 8)
    assert torch.equal(again, result.latent)
    # the frames written (one piece per latent frame) are the session's latent decoded whole
    assert [p.shape[1] for p in writer.pieces] == [1] + [4] * 11
    with torch.inference_mode():
        decoded = vae.decode(result.latent[None])[0].float()
    assert torch.equal(torch.cat(writer.pieces, dim=1), decoded)


@pytest.mark.parametrize("steps", [2, 1])
def test_a_session_of_fewer_steps_replays_from_its_log_bit_for_bit(model, vae, steps):
    """The steps choice is in the log, and the log alone replays the session: 2 steps = 3
    forwards a chunk (1 step = 2); replayed with the official 4 it is another video."""
    session, _, _ = make_session(model, vae, steps=steps)
    thread, out = start(session)
    for keys in ["w", "wj", "l"]:  # 3 chunks: the 6-frame window evicts at chunk 2
        press(session, keys)
    forwards = session._generator.forwards
    session.controls.act("stop")
    thread.join(60)
    result = out["result"]
    assert result.reason == "stop" and result.chunks == 3 and forwards == 3 * (steps + 1)
    assert result.log["steps"] == steps
    assert torch.equal(replay(model, vae, result.log), result.latent)
    assert (replay(model, vae, result.log, steps=4) - result.latent).abs().max() > 1e-3


# --------------------------------------------------------------------------- what the page sees

def test_events_carry_the_session_the_frames_and_the_latency(model, vae):
    session, writer, events = make_session(model, vae)
    thread, out = start(session)
    press(session, "w")
    press(session, "wl")
    session.controls.act("stop")
    thread.join(60)
    names = [event for event, _ in events]
    # before the session takes keys, what it is doing (the node announced "loading the model")
    assert [(e, d["step"]) for e, d in events[:2]] == [("lingbot.play.starting", "encoding the image"),
                                                       ("lingbot.play.starting", "warming up")]
    assert names[2] == "lingbot.play.started" and names[-1] == "lingbot.play.state"
    assert all(data["session_id"] == session.session_id and data["node_id"] == "7" for _, data in events)
    started = events[2][1]
    assert started["controller"] == "tab-1" and started["mode"] == "turn" and started["keys"] == "wasdijkl"
    frames = [data for event, data in events if event == "lingbot.play.frames"]
    # each chunk in parts, one per latent frame: 1 + 4 + 4 frames, then 4 + 4 + 4
    assert [(f["chunk"], f["part"], f["first_frame"], len(f["frames"]), f["last"], f["chunk_frames"], f["keys"])
            for f in frames] == [(0, 0, 0, 1, False, 9, "w"), (0, 1, 1, 4, False, 9, "w"), (0, 2, 5, 4, True, 9, "w"),
                                 (1, 0, 9, 4, False, 12, "wl"), (1, 1, 13, 4, False, 12, "wl"),
                                 (1, 2, 17, 4, True, 12, "wl")]
    assert all(f["latency_s"] is not None and 0 <= f["latency_s"] < 60 and f["chunk_s"] > 0 for f in frames)
    # sent_at: the session's clock (time.monotonic) when each part went out, in order
    sent = [f["sent_at"] for f in frames]
    assert sent == sorted(sent) and all(abs(time.monotonic() - at) < 120 for at in sent)
    # one latency per chunk: the key to the chunk's first part, carried by all its parts
    assert [f["latency_s"] for f in frames] == [out["result"].latency_s[0]] * 3 + [out["result"].latency_s[1]] * 3
    picture = Image.open(io.BytesIO(base64.b64decode(frames[3]["frames"][0])))
    assert picture.format == "JPEG" and picture.size == (WIDTH, HEIGHT)
    states = [data["state"] for event, data in events if event == "lingbot.play.state"]
    assert states[0] == "waiting" and "running" in states and states[-1] == "ended"
    assert events[-1][1]["reason"] == "stop" and events[-1][1]["chunks_done"] == 2
    assert session.status()["state"] == "ended" and out["result"].latency_s and len(out["result"].chunk_s) == 2
    assert session.status()["node_id"] == "7"  # a page opened mid-session finds the node's panel


@pytest.mark.parametrize("overlap", [False, True])
def test_every_page_gets_the_counts_after_each_chunk(model, vae, overlap):
    """A view-only tab showed another state and chunk than the controller: state events went
    out only when the state's name changed, with the counts of that moment (before the
    chunk's decode, when overlapped). Now each chunk's last frames are followed by a state
    event whose counts include them."""
    session, writer, events = make_session(model, vae, mode="continuous", chunk_budget=3, overlap=overlap)
    thread, out = start(session)
    thread.join(60)
    assert out["result"].reason == "budget"
    lasts = [i for i, (event, data) in enumerate(events) if event == "lingbot.play.frames" and data["last"]]
    assert len(lasts) == 3
    for i, end in zip(lasts, lasts[1:] + [len(events)]):
        data = events[i][1]
        counts = {(d["chunks_done"], d["frames_done"]) for e, d in events[i + 1:end] if e == "lingbot.play.state"}
        assert (data["chunk"] + 1, data["first_frame"] + len(data["frames"])) in counts, (data["chunk"], counts)


# --------------------------------------------------------------------------- the warm-up

def test_a_warmed_up_session_makes_the_cold_sessions_frames_and_says_how_long_it_took(model, vae):
    """``warm_up`` (on a GPU by default, forced here): throwaway chunks before the page is told
    the session started; the session's latents and frames are the cold session's bit for bit
    (window 6, sink 3: the warm-up's commits evict), its time in the started event and the
    result. None (the default) on the CPU: no warm-up."""
    runs = {}
    for warm in (False, True, None):
        session, writer, events = make_session(model, vae, mode="continuous", chunk_budget=4, warm_up=warm)
        forwards = []
        real = model.forward
        model.forward = lambda *a, **k: forwards.append(session.controls.running) or real(*a, **k)
        try:
            result = session.run()
        finally:
            del model.forward
        runs[warm] = (result, writer, events, forwards)
    (cold, cold_writer, cold_events, cold_forwards), (warm, warm_writer, warm_events, warm_forwards) = \
        runs[False], runs[True]
    assert warm.chunks == cold.chunks == 4
    assert torch.equal(warm.latent, cold.latent)
    assert torch.equal(torch.cat(warm_writer.pieces, dim=1), torch.cat(cold_writer.pieces, dim=1))
    started = {run: next(data for name, data in events if name == "lingbot.play.started")
               for run, events in (("cold", cold_events), ("warm", warm_events))}
    assert cold.warm_up_s is None and started["cold"]["warm_up_s"] is None
    assert warm.warm_up_s > 0 and started["warm"]["warm_up_s"] == warm.warm_up_s
    # Window 6, sink 3: the warm-up ran chunks 0 and 1 (the cache full from chunk 1), one
    # denoising pass and the commit each, before any chunk of the session was asked for.
    assert len(warm_forwards) == len(cold_forwards) + 4 and not any(warm_forwards[:4])
    assert all(warm_forwards[4:]) and all(cold_forwards)
    assert runs[None][0].warm_up_s is None and torch.equal(runs[None][0].latent, cold.latent)


# --------------------------------------------------------------------------- a chunk in parts

def chunk_decodes(vae, latent: torch.Tensor) -> list[torch.Tensor]:
    """Each chunk of the session's latent decoded whole (3 latent frames a call), as the
    session decoded it before it sent chunks in parts."""
    decoder = vae.stream_decoder()
    with torch.inference_mode():
        out = [decoder.decode_next(latent[None, :, a:a + 3])[0].float() for a in range(0, latent.shape[1], 3)]
    decoder.close()
    return out


@pytest.mark.parametrize("overlap", [False, True])
def test_a_chunk_sent_per_latent_frame_is_bit_for_bit_the_whole_chunk_decode(model, vae, overlap):
    """Chunk 0's first latent frame gives 1 frame, every other one 4; the pieces written and
    the JPEGs sent are the whole-chunk decode's, also decoded on the worker thread."""
    session, writer, events = make_session(model, vae, mode="continuous", chunk_budget=3, overlap=overlap)
    threads = set()
    write = writer.write
    writer.write = lambda video: (threads.add(threading.current_thread().name), write(video))
    result = session.run()
    assert result.reason == "budget" and result.chunks == 3 and result.frames == 33
    if overlap:
        assert threads and all(name.startswith("lingbot-decode") for name in threads)
    else:
        assert threads == {"MainThread"}
    whole = chunk_decodes(vae, result.latent)
    assert [p.shape[1] for p in writer.pieces] == [1, 4, 4] + [4, 4, 4] * 2
    for c in range(3):
        assert torch.equal(torch.cat(writer.pieces[3 * c:3 * c + 3], dim=1), whole[c])
    with torch.inference_mode():
        assert torch.equal(torch.cat(whole, dim=1), vae.decode(result.latent[None])[0].float())
    frames = [d for e, d in events if e == "lingbot.play.frames"]
    assert [f["first_frame"] for f in frames] == [0, 1, 5, 9, 13, 17, 21, 25, 29]
    assert [jpeg for f in frames for jpeg in f["frames"]] == jpeg_frames(torch.cat(whole, dim=1))


@pytest.mark.parametrize("overlap", [False, True])
def test_a_chunks_first_frames_are_sent_and_written_before_its_last_latent_frame_is_decoded(model, vae, overlap):
    """Each part is sent to the page before it is written to the .mp4 (the file's H.264
    encode is not in the key → frame time), and a chunk's first part before its last
    latent frame is decoded."""
    order: list[tuple] = []
    session, writer, events = make_session(model, vae, mode="continuous", chunk_budget=2, overlap=overlap,
                                           emit=lambda event, data: order.append(
                                               ("sent", data["chunk"], data["part"], data["first_frame"]))
                                           if event == "lingbot.play.frames" else None)
    writer.write = lambda video: order.append(("written", video.shape[1]))
    real_open = session._open

    def open_instrumented() -> None:  # the session's stream decoder, recording each call
        real_open()
        decoder = session._decoder
        decode_next = decoder.decode_next

        def recorded(latent, cancel=None):
            order.append(("decode", decoder.latent_frames_done, latent.shape[2]))
            return decode_next(latent, cancel=cancel)

        decoder.decode_next = recorded

    session._open = open_instrumented
    assert session.run().chunks == 2
    expected = []
    for c, sizes in enumerate(([1, 4, 4], [4, 4, 4])):
        first = 0 if c == 0 else 9
        for part, n in enumerate(sizes):
            expected += [("decode", 3 * c + part, 1), ("sent", c, part, first), ("written", n)]
            first += n
    assert order == expected
    # the chunk's first frames are out before its last latent frame is decoded
    assert order.index(("sent", 1, 0, 9)) < order.index(("decode", 5, 1))


def test_a_cancel_in_a_chunks_later_parts_finishes_the_chunk_first(model, vae):
    """An interrupt seen once a chunk's first frames are out ends the session after that
    chunk: the file and the action log hold whole chunks."""
    holder: dict = {}

    def check() -> None:
        decoder = holder["session"]._decoder
        if decoder is not None and decoder.latent_frames_done >= 1:
            raise Interrupted("cancelled while chunk 0 decodes")

    session, writer, events = make_session(model, vae, mode="continuous", chunk_budget=3, check_interrupt=check,
                                           interrupt_types=(Interrupted,))
    holder["session"] = session
    with pytest.raises(Interrupted):
        session.run()
    assert session.chunks_done == 1 and [p.shape[1] for p in writer.pieces] == [1, 4, 4]
    assert session.action_log()["frames"] == 9 and session.end_reason == "interrupt"


# --------------------------------------------------------------------------- endings

def test_budget_ends_a_continuous_session(model, vae):
    session, writer, events = make_session(model, vae, mode="continuous", chunk_budget=2)
    result = session.run()  # continuous: nobody has to press anything
    assert result.reason == "budget" and result.chunks == 2 and writer.closed == 1
    assert result.log["actions"] == "none-20" and result.latency_s == []


def test_idle_ends_the_session_when_the_page_is_gone_and_frees_the_cache(model, vae):
    connected = {"now": True}
    session, writer, events = make_session(model, vae, idle_timeout_s=0.3,
                                           client_connected=lambda: connected["now"])
    thread, out = start(session)
    press(session, "w")
    cache = weakref.ref(session._generator.cache._k)
    time.sleep(0.5)  # connected: no idle end however long nobody presses
    assert not session.ended
    connected["now"] = False  # the tab closed
    begun = time.monotonic()
    thread.join(10)
    assert out["result"].reason == "idle" and 0.25 < time.monotonic() - begun < 5
    assert writer.closed == 1 and session._generator is None and cache() is None
    assert events[-1][1] == {"session_id": session.session_id, "node_id": "7", "state": "ended", "chunks_done": 1,
                             "frames_done": 9, "reason": "idle", "video": None}


def test_an_interrupt_while_waiting_propagates_and_ends_the_session(model, vae):
    flag = {"set": False}

    def check() -> None:
        if flag["set"]:
            raise Interrupted("interrupted")

    session, writer, events = make_session(model, vae, check_interrupt=check, interrupt_types=(Interrupted,))
    thread, out = start(session)
    press(session, "w")
    flag["set"] = True
    thread.join(10)
    assert isinstance(out["error"], Interrupted)
    assert session.end_reason == "interrupt" and writer.closed == 1 and session._generator is None
    assert events[-1][1]["reason"] == "interrupt"


def test_an_interrupt_mid_chunk_keeps_the_finished_chunks_and_frees_everything(model, vae):
    seen = {"in_second_chunk": 0}
    holder: dict = {}

    def check() -> None:
        session = holder["session"]
        if session.chunks_done == 1 and session.controls.running:
            seen["in_second_chunk"] += 1
            if seen["in_second_chunk"] > 3:  # a few forwards / blocks into the chunk
                raise Interrupted("cancelled mid-chunk")

    session, writer, events = make_session(model, vae, check_interrupt=check, interrupt_types=(Interrupted,))
    holder["session"] = session
    thread, out = start(session)
    press(session, "w")
    session.controls.set_keys(frozenset("wd"))
    thread.join(30)
    assert isinstance(out["error"], Interrupted) and seen["in_second_chunk"] == 4
    assert session.chunks_done == 1 and [p.shape[1] for p in writer.pieces] == [1, 4, 4] and writer.closed == 1
    assert session.end_reason == "interrupt" and session._generator is None and session._decoder is None
    assert session.action_log()["actions"] == "w-8"  # only what the finished chunk used


def test_an_error_ends_the_session_as_error(model, vae):
    session, writer, events = make_session(model, vae, mode="continuous")
    session.camera.next_chunk = lambda keys: (_ for _ in ()).throw(RuntimeError("broken camera"))
    with pytest.raises(RuntimeError, match="broken camera"):
        session.run()
    assert session.end_reason == "error" and writer.closed == 1 and events[-1][1]["state"] == "ended"


# --------------------------------------------------------------------------- the log on disk

# A session in its own process, its log saved as the Play node saves it (a new file renamed
# into place): two chunks, their latent kept by the test, then a third chunk asked for;
# the parent kills the process (kill -9) while that chunk is being made.
KILLED_SESSION = r"""
import sys, threading, time
from pathlib import Path
sys.path[:0] = [sys.argv[3], sys.argv[4]]
from _standalone import import_pack
import_pack()
import torch
torch.set_num_threads(1)
from fast_helpers import HEIGHT, WIDTH, image, prompt, tiny_fast_model, tiny_vae
from comfyui_lingbot_world.loaders.new_file import new_file, write_json
from comfyui_lingbot_world.pipeline.play import PlaySession, PlaySettings
from comfyui_lingbot_world.pipeline.play.registry import SessionRegistry
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy

log, latent = Path(sys.argv[1]), Path(sys.argv[2])
settings = PlaySettings(width=WIDTH, height=HEIGHT, seed=11, poll_s=0.005,
                        policy=CachePolicy(window=6, sink=3, dtype="bf16"))
recipe = {"prompt": "a street", "negative_prompt": "", "prompt_source": "text", "vae": None,
          "start_image": {"file": None, "sha256": None, "pixels_sha256": "0" * 64}}  # what the node adds
session = PlaySession(tiny_fast_model(), prompt(), tiny_vae(), image(), settings, registry=SessionRegistry(),
                      recipe=recipe, save_log=lambda entry: write_json(log, entry, indent=1))
threading.Thread(target=session.run, daemon=True).start()

def press(keys):
    while session.controls.running:
        time.sleep(0.005)
    done = session.chunks_done
    session.controls.set_keys(frozenset(keys))
    while session.chunks_done == done or session.controls.running:
        time.sleep(0.005)

press("w")
press("wj")
with new_file(latent) as partial:
    torch.save(session.latent(), partial)
session.controls.set_keys(frozenset("l"))
while not session.controls.running:
    time.sleep(0.005)
print("third chunk started", flush=True)
time.sleep(600)
"""


def test_a_session_killed_mid_chunk_leaves_a_log_that_replays_its_chunks(model, vae, tmp_path):
    """The log was written once, when the session ended: a kill -9 (an out-of-memory kill)
    lost it. Now it is on disk after every chunk, whole (renamed into place)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from comfyui_lingbot_world.pipeline.play.log_file import read_play_log

    tests = Path(__file__).resolve().parents[1]
    log, latent = tmp_path / "play_00001_.json", tmp_path / "latent.pt"
    child = subprocess.Popen([sys.executable, "-c", KILLED_SESSION, str(log), str(latent), str(tests.parent),
                              str(tests)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line == "third chunk started\n", child.stderr.read() if child.poll() is not None else line
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    entry = json.loads(log.read_text())
    assert (entry["chunks"], entry["frames"], entry["actions"], entry["ended"]) == (2, 21, "w-8,wj-12", None)
    recipe = read_play_log(log, "log")  # a log the Play Log node takes
    assert recipe.frames == 21 and recipe.actions == "w-8,wj-12"
    assert torch.equal(replay(model, vae, entry), torch.load(latent))


# --------------------------------------------------------------------------- checks

def test_one_session_at_a_time_and_the_ended_one_stays_readable(model, vae):
    registry = SessionRegistry()
    first, _, _ = make_session(model, vae, registry=registry, mode="continuous", chunk_budget=1)
    registry.begin(first)
    second, _, _ = make_session(model, vae, registry=registry)
    with pytest.raises(RuntimeError, match="already running"):
        second.run()
    registry.end(first)
    first.ended = True
    assert registry.running() == [] and registry.get(first.session_id) is first


def test_settings_refuse_the_full_cache_and_bad_values(model, vae):
    with pytest.raises(ValueError, match="full cache cannot be used"):
        settings(policy=CachePolicy(window=None, sink=0))
    with pytest.raises(ValueError, match="chunk_budget must be 1..320"):
        settings(chunk_budget=0)
    with pytest.raises(ValueError, match="idle_timeout"):
        settings(idle_timeout_s=0.0)
    with pytest.raises(ValueError, match="mode"):
        settings(mode="fast")
    with pytest.raises(ValueError, match="steps: 0 is not one of 4, 3, 2, 1"):
        settings(steps=0)
    with pytest.raises(ValueError, match=r"image: expected \[3, 32, 48\]"):
        PlaySession(model, prompt(), vae, torch.zeros(3, 16, 16), settings())
