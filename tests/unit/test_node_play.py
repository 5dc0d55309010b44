"""nodes/play.py: LingBot-World Play inside the ComfyUI host (CPU) on the tiny Fast
transformer, steered through the session's input state as the routes do: the session's
latent equals the Fast clip nodes (Camera with the per-chunk Play keyframes, VAE Encode,
Fast Sampler) run from its action log, bit for bit; the .mp4 and the log beside it; a
session that makes no chunk; Cancel while waiting; refusals that name the input; nothing
left resident."""
from __future__ import annotations

import json
import threading
import types
import time
from pathlib import Path

import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402

from node_runs import (H, VAE_FILE, W, MemoryPlanAsked, encode_prompt, fast_not_resident, load_fast,  # noqa: E402
                       record_fast_runs, run_fast_sampler, start_image)
from comfyui_lingbot_world.nodes.camera import KEYFRAMES_PLAY, LingBotWorldCamera  # noqa: E402
from comfyui_lingbot_world.nodes.host import model_files  # noqa: E402
from comfyui_lingbot_world.nodes.host.routes import live_models  # noqa: E402
from comfyui_lingbot_world.nodes.play import LingBotWorldPlay  # noqa: E402
from comfyui_lingbot_world.nodes.vae import LingBotWorldVAEEncode  # noqa: E402
from comfyui_lingbot_world.pipeline.play import SESSIONS  # noqa: E402

clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)
NONE = model_files.NO_FILE


def video_frames(path: Path) -> int:
    import av

    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(container.streams.video[0]))


def play_inputs(fast_dit, text, **overrides) -> dict:
    values = dict(fast_dit=fast_dit, image=start_image(), vae=VAE_FILE, width=W, height=H, chunk_budget=6,
                  mode="turn", idle_timeout=60, kv_window=6, kv_sink=3, kv_dtype="bf16", shift=10.0, seed=5, fps=16,
                  filename_prefix="LingBotWorld/play", text=text)
    return {**values, **overrides}


def start(inputs: dict) -> tuple[threading.Thread, dict]:
    before = set(SESSIONS.running())
    out: dict = {}

    def run() -> None:
        try:
            out["output"] = LingBotWorldPlay.execute(**inputs)
        except BaseException as exc:  # noqa: BLE001 (the test reads what was raised)
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not (set(SESSIONS.running()) - before) and thread.is_alive():
        assert time.monotonic() < deadline, "the session never started"
        time.sleep(0.01)
    running = set(SESSIONS.running()) - before
    out["session"] = SESSIONS.get(running.pop()) if running else None
    return thread, out


def wait_until(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def press(session, keys: str) -> None:
    wait_until(lambda: not session.controls.running)
    done = session.chunks_done
    session.controls.set_keys(frozenset())
    session.controls.set_keys(frozenset(keys))
    wait_until(lambda: session.chunks_done > done and not session.controls.running)


def test_the_action_log_replays_through_the_fast_clip_nodes_bit_for_bit(fast_installed):
    text = encode_prompt()
    fast_dit, _ = load_fast()
    thread, out = start(play_inputs(fast_dit, text))
    session = out["session"]
    for keys in ("w", "wj", "l"):
        press(session, keys)
    session.controls.act("stop")
    thread.join(120)
    video, log_text, latent = out["output"].args
    log = json.loads(log_text)
    assert log["actions"] == "w-8,wj-12,l-12" and log["frames"] == 33 and log["keyframes"] == KEYFRAMES_PLAY
    assert fast_not_resident(fast_dit) and live_models()["vaes_alive"] == 0

    path = Path(video.get_stream_source())
    assert video_frames(path) == 33
    assert json.loads(path.with_suffix(".json").read_text()) == log
    assert out["output"].ui["text"] == [log_text]

    # The Fast clip workflow, from the log: Camera (actions, per chunk (Play)), VAE Encode, Fast Sampler.
    camera = LingBotWorldCamera.execute("actions", "dolly_in", 1.0, NONE, NONE, log["width"], log["height"],
                                        log["frames"], actions=log["actions"], keyframes=log["keyframes"])[0]
    i2v = LingBotWorldVAEEncode.execute(start_image(), VAE_FILE, log["width"], log["height"], log["frames"],
                                        "auto", precision=log["vae_precision"])[0]
    replay = run_fast_sampler(fast_dit, text, i2v, camera, seed=log["seed"], kv_window=log["kv_window"],
                              kv_sink=log["kv_sink"], kv_dtype=log["kv_dtype"], shift=log["shift"])
    assert replay["samples"].shape == latent["samples"].shape == (1, 16, 9, H // 8, W // 8)
    assert torch.equal(replay["samples"], latent["samples"])
    # the official act2cam timing of the same string is another camera: the option matters
    official = LingBotWorldCamera.execute("actions", "dolly_in", 1.0, NONE, NONE, W, H, 33,
                                          actions=log["actions"])[0]
    assert not torch.equal(official.plucker, camera.plucker)


def test_a_session_without_any_chunk_saves_nothing_and_says_so(fast_installed):
    fast_dit, _ = load_fast()
    outputs = fast_installed["output"]
    thread, out = start(play_inputs(fast_dit, encode_prompt(), idle_timeout=1))
    thread.join(60)  # no controller (no server): nobody is connected, so the idle timeout applies
    assert isinstance(out["error"], RuntimeError)
    assert "ended (idle) before any chunk was made" in str(out["error"])
    assert not list(outputs.rglob("*.mp4")) and not list(outputs.rglob("*.json"))
    assert fast_not_resident(fast_dit) and live_models()["vaes_alive"] == 0


def test_cancel_while_waiting_interrupts_keeps_the_video_and_frees_everything(fast_installed):
    fast_dit, _ = load_fast()
    thread, out = start(play_inputs(fast_dit, encode_prompt()))
    session = out["session"]
    press(session, "a")
    mm.interrupt_current_processing(True)
    thread.join(60)
    assert isinstance(out["error"], mm.InterruptProcessingException)
    assert session.end_reason == "interrupt"
    (video,) = list(fast_installed["output"].rglob("*.mp4"))
    assert video_frames(video) == 9
    assert json.loads(video.with_suffix(".json").read_text())["actions"] == "a-8"
    assert fast_not_resident(fast_dit) and live_models()["vaes_alive"] == 0


@pytest.mark.parametrize("change, message", [
    ({"kv_window": 3, "kv_sink": 3}, "kv_sink=3 must be smaller than kv_window=3"),
    ({"mode": "fast"}, "mode: 'fast' is not one of turn, continuous"),
    ({"chunk_budget": 0}, "chunk_budget must be 1..320"),
    ({"width": 40}, "width"),
    ({"fast_dit": "not a model"}, "fast_dit: expected the output of LingBot-World Fast DiT Loader"),
    ({"live_decoder": object()}, "live_decoder: expected a tiny video VAE for Wan 2.1"),
    ({"steps": 5}, "steps: 5 is not one of 4, 3, 2, 1"),
])
def test_bad_inputs_are_refused_before_anything_loads(fast_installed, change, message):
    fast_dit, _ = load_fast()
    with pytest.raises(ValueError, match=message):
        LingBotWorldPlay.execute(**{**play_inputs(fast_dit, encode_prompt()), **change})
    assert fast_not_resident(fast_dit) and SESSIONS.running() == []


def test_every_queue_runs_a_new_session():
    assert LingBotWorldPlay.fingerprint_inputs() != LingBotWorldPlay.fingerprint_inputs()


def test_the_action_log_file_alone_replays_the_session_bit_for_bit(fast_installed, monkeypatch):
    """Issue 27: the log held no prompt and no start image, so a replay as the README said
    it did not reproduce the session. Now the log beside the .mp4 is the whole recipe: the
    prompt texts, the start image (the Load Image file's name, its sha256 and the pixels'),
    the VAE, the seed, the settings and the keys; from that file alone (and the input file it
    names) the Fast clip nodes give the session's latent, bit for bit."""
    import hashlib
    from types import SimpleNamespace

    import numpy as np
    from PIL import Image

    from node_runs import FAST, T5_FILE, TOKENIZER
    from comfyui_lingbot_world.nodes.fast_sampler import LingBotWorldFastSampler
    from comfyui_lingbot_world.nodes.text_encode import LingBotWorldTextEncode

    def load_image(name: str) -> torch.Tensor:  # what the core Load Image node does (nodes.py)
        with Image.open(fast_installed["input"] / name) as file:
            return torch.from_numpy(np.array(file.convert("RGB")).astype(np.float32) / 255.0)[None]

    pixels = np.random.default_rng(3).integers(0, 256, (40, 60, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(fast_installed["input"] / "lighthouse.png")
    # The running prompt as ComfyUI hands it to the node: Load Image "lighthouse.png" -> Play.
    monkeypatch.setattr(LingBotWorldPlay, "hidden", SimpleNamespace(unique_id="6", prompt={
        "1": {"class_type": "LoadImage", "inputs": {"image": "lighthouse.png"}},
        "6": {"class_type": "LingBotWorldPlay", "inputs": {"image": ["1", 0]}}}))
    text = LingBotWorldTextEncode.execute(T5_FILE, TOKENIZER, "a lighthouse on a cliff", "fog", "auto")[0]
    fast_dit, _ = load_fast(FAST)
    thread, out = start(play_inputs(fast_dit, text, image=load_image("lighthouse.png"), seed=11))
    session = out["session"]
    for keys in ("d", "ik"):
        press(session, keys)
    session.controls.act("stop")
    thread.join(120)
    video, _, latent = out["output"].args
    log_path = Path(video.get_stream_source()).with_suffix(".json")
    del text, session, out  # from here on: the log file (and the input file it names) only

    log = json.loads(log_path.read_text())
    assert (log["prompt"], log["negative_prompt"], log["prompt_source"]) == ("a lighthouse on a cliff", "fog", "text")
    image_file = fast_installed["input"] / log["start_image"]["file"]
    assert hashlib.sha256(image_file.read_bytes()).hexdigest() == log["start_image"]["sha256"]

    replay_text = LingBotWorldTextEncode.execute(T5_FILE, TOKENIZER, log["prompt"], log["negative_prompt"], "auto")[0]
    replay_image = load_image(log["start_image"]["file"])
    assert hashlib.sha256(replay_image[0].numpy().tobytes()).hexdigest() == log["start_image"]["pixels_sha256"]
    camera = LingBotWorldCamera.execute("actions", "dolly_in", 1.0, NONE, NONE, log["width"], log["height"],
                                        log["frames"], actions=log["actions"], keyframes=log["keyframes"])[0]
    i2v = LingBotWorldVAEEncode.execute(replay_image, log["vae"], log["width"], log["height"], log["frames"], "auto",
                                        precision=log["vae_precision"])[0]
    replay = LingBotWorldFastSampler.execute(fast_dit, i2v, "sliding_window", log["kv_window"], log["kv_sink"],
                                             log["kv_dtype"], log["shift"], log["seed"], text=replay_text,
                                             camera=camera)[0]
    assert replay["samples"].shape == latent["samples"].shape
    assert torch.equal(replay["samples"], latent["samples"])


def test_a_two_step_session_replays_through_the_play_log_node_bit_for_bit(fast_installed):
    """steps 2 on the Play node: the log records it, the Play Log node gives it back, and the
    Fast clip nodes fed by the Play Log node alone (its steps into the Fast Sampler's, as the
    replay template wires them) make the session's latent bit for bit; the Fast Sampler at
    its default 4 steps makes another."""
    from node_runs import T5_FILE, TOKENIZER
    from comfyui_lingbot_world.nodes.play_log import LingBotWorldPlayLog
    from comfyui_lingbot_world.nodes.text_encode import LingBotWorldTextEncode

    text = LingBotWorldTextEncode.execute(T5_FILE, TOKENIZER, "a harbour at dawn", "rain", "auto")[0]
    fast_dit, _ = load_fast()
    thread, out = start(play_inputs(fast_dit, text, steps=2, seed=9))
    session = out["session"]
    for keys in ("w", "l"):
        press(session, keys)
    forwards = session._generator.forwards
    session.controls.act("stop")
    thread.join(120)
    video, log_text, latent = out["output"].args
    assert json.loads(log_text)["steps"] == 2 and forwards == 2 * 3  # 2 steps + the commit, per chunk
    del text, session
    name = Path(video.get_stream_source()).with_suffix(".json").relative_to(fast_installed["output"]).as_posix()
    (image, prompt, negative, actions, frames, width, height, seed, shift, kv_window, kv_sink, kv_dtype, precision,
     steps) = LingBotWorldPlayLog.execute(name, image=start_image()).args
    assert steps == 2
    replay_text = LingBotWorldTextEncode.execute(T5_FILE, TOKENIZER, prompt, negative, "auto")[0]
    camera = LingBotWorldCamera.execute("actions", "dolly_in", 1.0, NONE, NONE, width, height, frames,
                                        actions=actions, keyframes=KEYFRAMES_PLAY)[0]
    i2v = LingBotWorldVAEEncode.execute(image, VAE_FILE, width, height, frames, "auto", precision=precision)[0]
    settings = dict(seed=seed, kv_window=kv_window, kv_sink=kv_sink, kv_dtype=kv_dtype, shift=shift)
    replay = run_fast_sampler(fast_dit, replay_text, i2v, camera, steps=steps, **settings)
    assert torch.equal(replay["samples"], latent["samples"])
    four = run_fast_sampler(fast_dit, replay_text, i2v, camera, **settings)
    assert (four["samples"] - latent["samples"]).abs().max() > 1e-3


def test_a_start_image_from_another_node_is_recorded_by_its_pixels():
    from comfyui_lingbot_world.nodes.play import start_image_record, start_image_source

    assert start_image_source(None) is None
    record = start_image_record(start_image(), start_image_source(None))
    assert record["file"] is None and record["sha256"] is None and len(record["pixels_sha256"]) == 64


def tiny_comfy_vae():
    """What core's Load VAE makes of a lighttaew2_1 file: ComfyUI's VAE around its TAEHV
    (seeded random weights of the real layout)."""
    import comfy.sd
    from comfy.taesd.taehv import TAEHV

    generator = torch.Generator().manual_seed(6)
    sd = {k: torch.randn(v.shape, generator=generator) * 0.02 for k, v in TAEHV(latent_channels=16).state_dict().items()}
    return comfy.sd.VAE(sd=sd)


def test_a_live_decoder_makes_the_frames_and_the_log_says_so(fast_installed):
    """With core's tiny VAE connected the .mp4 holds its frames (the latent is the same session's)."""
    text = encode_prompt()
    fast_dit, _ = load_fast()
    thread, out = start(play_inputs(fast_dit, text, live_decoder=tiny_comfy_vae(), chunk_budget=2))
    session = out["session"]
    press(session, "w")
    press(session, "d")
    thread.join(120)
    video, log_text, latent = out["output"].args
    log = json.loads(log_text)
    assert log["frames"] == 21 and log["live_decoder"].startswith("tiny video VAE")
    assert video_frames(Path(video.get_stream_source())) == 21
    assert latent["samples"].shape == (1, 16, 6, H // 8, W // 8)
    assert fast_not_resident(fast_dit) and live_models()["vaes_alive"] == 0


def test_the_memory_plan_gets_the_vae_streams_budget_or_the_live_decoders(fast_installed, monkeypatch):
    """The room asked for the VAE is ``vae_budgets`` of the VAE file's size, the size and the
    precision (as Fast Long Video's); with a live decoder, the Wan encoder's and the tiny
    decoder's only."""
    from comfyui_lingbot_world.nodes import play
    from comfyui_lingbot_world.pipeline.memory import vae_budgets

    calls = record_fast_runs(monkeypatch, play)
    text, (fast_dit, _) = encode_prompt(), load_fast()
    for live_decoder in (None, tiny_comfy_vae()):
        with pytest.raises(MemoryPlanAsked):
            LingBotWorldPlay.execute(**play_inputs(fast_dit, text, precision="bf16", live_decoder=live_decoder))
    size = (fast_installed["package"] / "Wan2.1_VAE.pth").stat().st_size
    assert [(c["vae"], c["decode"]) for c in calls] == [vae_budgets(size, H, W, "bf16", live) for live in (False, True)]
    assert calls[1]["vae"] < calls[0]["vae"] and SESSIONS.running() == []


def test_the_action_log_replaces_a_link_at_its_name_and_never_writes_through_it(fast_installed, tmp_path):
    """A link planted at the running session's .json name (its .mp4 is there from the start)
    made the log overwrite a file outside the output folder."""
    outside = tmp_path / "outside.txt"
    outside.write_text("not the pack's")
    fast_dit, _ = load_fast()
    thread, out = start(play_inputs(fast_dit, encode_prompt()))
    session = out["session"]
    (video,) = fast_installed["output"].rglob("*.mp4")
    video.with_suffix(".json").symlink_to(outside)
    press(session, "w")
    session.controls.act("stop")
    thread.join(120)
    assert Path(out["output"].args[0].get_stream_source()) == video
    assert outside.read_text() == "not the pack's"
    log = video.with_suffix(".json")
    assert not log.is_symlink() and json.loads(log.read_text())["actions"] == "w-8"


def test_the_action_log_is_on_disk_after_every_chunk(fast_installed):
    """The log was written once, when the session ended: a process killed mid-session lost it
    (the .mp4 keeps its frames). Now each chunk's log is on disk before the next chunk starts."""
    fast_dit, _ = load_fast()
    thread, out = start(play_inputs(fast_dit, encode_prompt()))
    session = out["session"]
    logs = []
    for keys in ("w", "wj"):
        press(session, keys)
        (log,) = fast_installed["output"].rglob("*.json")
        logs.append(json.loads(log.read_text()))
    assert [(entry["chunks"], entry["frames"], entry["actions"], entry["ended"]) for entry in logs] == [
        (1, 9, "w-8", None), (2, 21, "w-8,wj-12", None)]
    session.controls.act("stop")
    thread.join(120)
    assert json.loads(log.read_text())["ended"] == "stop"
    # each write went to a new file renamed into place: nothing else is left beside them
    assert sorted(p.name for p in log.parent.iterdir()) == [log.name, log.with_suffix(".mp4").name]


def test_a_cancel_before_the_first_chunk_leaves_no_video(fast_installed):
    """A Cancel before any chunk left a 0-byte .mp4 that does not play: it is removed."""
    fast_dit, _ = load_fast()
    thread, out = start(play_inputs(fast_dit, encode_prompt()))
    assert list(fast_installed["output"].rglob("*.mp4"))  # the file is made before the session opens
    mm.interrupt_current_processing(True)
    thread.join(60)
    assert isinstance(out["error"], mm.InterruptProcessingException)
    assert not list(fast_installed["output"].rglob("*.mp4")) and not list(fast_installed["output"].rglob("*.json"))
    assert fast_not_resident(fast_dit) and live_models()["vaes_alive"] == 0


def test_the_pages_hear_what_the_node_does_before_its_session_starts(fast_installed, monkeypatch):
    """The panel said "Run the workflow to start a session" through the whole start (380 s
    on a CPU): every page now hears each step, and a failure before the session began."""
    from comfyui_lingbot_world.nodes import play as play_node
    from comfyui_lingbot_world.nodes.host import play_run

    events: list = []
    monkeypatch.setattr(play_run, "emitter", lambda: lambda event, data: events.append((event, dict(data))))
    monkeypatch.setattr(LingBotWorldPlay, "hidden", types.SimpleNamespace(unique_id="6", prompt=None))
    fast_dit, _ = load_fast()
    thread, out = start(play_inputs(fast_dit, encode_prompt()))
    out["session"].controls.act("stop")
    thread.join(120)
    before = [data for event, data in events[:next(i for i, (e, _) in enumerate(events) if e.endswith(".started"))]]
    assert [(d["node_id"], d["step"]) for d in before] == [
        ("6", "loading the model"), ("6", "encoding the image"), ("6", "warming up")]
    assert all(event == "lingbot.play.starting" for event, _ in events[:3])

    events.clear()

    def no_room(*args, **kwargs):
        raise RuntimeError("not enough memory for the transformer\nmore detail")
    monkeypatch.setattr(play_node, "prepared_fast_run", no_room)
    with pytest.raises(RuntimeError, match="not enough memory"):
        LingBotWorldPlay.execute(**play_inputs(fast_dit, encode_prompt()))
    assert events == [("lingbot.play.starting", {"session_id": None, "node_id": "6", "step": "loading the model"}),
                      ("lingbot.play.starting", {"session_id": None, "node_id": "6", "step": None,
                                                 "error": "not enough memory for the transformer"})]
    assert not list(fast_installed["output"].rglob("*.mp4"))  # nor an empty video left behind


def test_a_failure_after_the_session_started_is_not_told_as_a_start_that_failed(fast_installed, monkeypatch):
    """Only a node that fails before its session started says "did not start" (step null)."""
    from comfyui_lingbot_world.nodes import play as play_node
    from comfyui_lingbot_world.nodes.host import play_run

    events: list = []
    monkeypatch.setattr(play_run, "emitter", lambda: lambda event, data: events.append((event, dict(data))))
    real = play_node.run_play_session

    def session_then_failure(*args, **kwargs):
        real(*args, **kwargs)
        raise RuntimeError("the disk filled after the session")
    monkeypatch.setattr(play_node, "run_play_session", session_then_failure)
    fast_dit, _ = load_fast()
    thread, out = start(play_inputs(fast_dit, encode_prompt()))
    press(out["session"], "w")
    out["session"].controls.act("stop")
    thread.join(120)
    assert "the disk filled" in str(out["error"])
    assert any(event.endswith(".started") for event, _ in events)
    assert [d for event, d in events if event == "lingbot.play.starting" and d.get("step") is None] == []
