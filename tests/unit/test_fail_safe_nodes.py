"""Themed (hostile inputs, node level; inside the ComfyUI host, on the CPU). Index:

11. symlink loops in the model and input listings visit each real folder once
    (test_symlink_loops_visit_each_real_folder_once).
9. GET /lingbot/status (nodes/host/routes.py): folders relative to their model folder, never
   stalling the event loop, counting tracked models until released.
The pipeline and loader level: test_fail_safe.py.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from comfy_host import run_async, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported

import folder_paths  # noqa: E402

from comfyui_lingbot_world.nodes.host import model_files, routes  # noqa: E402


@pytest.fixture
def dirs(tmp_path, monkeypatch) -> dict[str, Path]:
    out = {kind: tmp_path / "models" / kind for kind in ("lingbot", "text_encoders", "vae", "diffusion_models")}
    for kind, path in out.items():
        path.mkdir(parents=True)
        monkeypatch.setitem(folder_paths.folder_names_and_paths, kind,
                            ([str(path)], set(folder_paths.supported_pt_extensions)))
    out["input"] = tmp_path / "input"
    out["input"].mkdir()
    monkeypatch.setattr(folder_paths, "input_directory", str(out["input"]))
    return out


# --------------------------------------------------------------------------- 11. symlink loops


def test_symlink_loops_visit_each_real_folder_once(dirs):
    root = dirs["lingbot"]
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "umt5.pth").write_bytes(b"x")
    for i in range(5):  # each link points back to the top: exponential without the check
        (root / "a" / f"loop{i}").symlink_to(root, target_is_directory=True)
    seen = [here for here, _, _ in model_files._walk(root)]
    assert len(seen) == 3  # lingbot, a, a/b
    assert len({p.resolve() for p in seen}) == len(seen)
    started = time.monotonic()
    assert model_files.list_weight_files(("lingbot",), ("umt5",)) == ["lingbot/a/b/umt5.pth"]
    assert time.monotonic() - started < 5.0  # the loops unchecked take minutes

    inputs = dirs["input"]
    (inputs / "traj").mkdir()
    (inputs / "traj" / "poses.npy").write_bytes(b"x")
    for i in range(5):
        (inputs / "traj" / f"up{i}").symlink_to(inputs, target_is_directory=True)
    assert model_files.list_input_files(".npy") == ["traj/poses.npy"]


# --------------------------------------------------------------------------- 9. status route


def test_status_names_expert_folders_relative_to_their_model_folder(dirs):
    folder = dirs["lingbot"] / "pkg" / "high_noise_model_bnb_nf4"
    assert routes.display_name(folder) == "lingbot/pkg/high_noise_model_bnb_nf4"
    assert routes.display_name(dirs["diffusion_models"] / "x") == "diffusion_models/x"
    assert routes.display_name("/somewhere/else/expert") == "expert"  # never an absolute path


def _max_loop_stall(handler_calls: int, use_thread: bool) -> tuple[float, dict]:
    """Largest gap between ticks of a 5 ms ticker while ``handler_calls`` status requests run."""

    async def main():
        gaps = [0.0]
        stop = asyncio.Event()

        async def ticker():
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last - 0.005)
                last = now

        async def one():
            return await routes.status_off_loop() if use_thread else routes.status()

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.02)
        results = await asyncio.gather(*(one() for _ in range(handler_calls)))
        stop.set()
        await tick
        return max(gaps), results[0]

    return run_async(main())


def test_status_never_stalls_the_event_loop():
    # A busy server holds millions of Python objects; the old route scanned them all on
    # the event loop (0.3-0.6 s per call, ~4 s of stall for 8 pollers here).
    ballast = [[i] for i in range(1_500_000)]
    started = time.perf_counter()
    routes.status()
    one_call = time.perf_counter() - started
    stall, state = _max_loop_stall(8, use_thread=True)
    del ballast
    print(f"one status call {one_call * 1000:.1f} ms; longest event-loop stall with 8 concurrent calls "
          f"{stall * 1000:.1f} ms")
    assert state["dit_models_alive"] == 0 and state["experts_resident"] == []
    assert one_call < 0.05 and stall < 0.05, (one_call, stall)


def test_status_counts_tracked_models_until_they_are_released():
    from comfyui_lingbot_world.loaders.live import track
    from comfyui_lingbot_world.pipeline.memory import release_module
    from comfyui_lingbot_world.wan.vae import VAE_TINY, WanVAE

    vae = track(WanVAE(VAE_TINY))
    assert routes.status()["vaes_alive"] == 1
    release_module(vae)  # the pack frees weights even if a reference lingers
    assert routes.status()["vaes_alive"] == 0
    kept = track(WanVAE(VAE_TINY))
    del kept
    assert routes.status()["vaes_alive"] == 0  # weak references keep nothing alive
