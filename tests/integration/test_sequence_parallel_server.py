"""``devices=sequence_parallel`` in a real ComfyUI server on the CPU: two gloo ranks (the
test-only plugin tests/integration/cpu_ranks_plugin gives the Fast DiT Loader two CPU
devices where the pack offers the mode on GPUs only), the tiny Fast transformer, queued over
HTTP. The CPU twin of tests/gpu/test_server_two_gpus.py, in one test (~1 minute on 2 cores):

* the Fast clip template runs with a worker process spawned from ComfyUI's main.py; the
  worker is kept warm, and the Play workflow's session (turn mode, keys posted as the page
  posts them) runs on the same worker;
* a worker killed during the session fails the prompt with a message naming the device and
  rank; the next prompt starts a new worker and succeeds;
* ``POST /free`` stops the worker (its process is gone, ``/lingbot/status`` shows none);
* stopping the server leaves no process of it behind.
"""
from __future__ import annotations

import pytest

import sp_server
import tiny_package
from comfy_host import ROOT
from comfy_server import ComfyServer

PLUGIN = ROOT / "tests" / "integration" / "cpu_ranks_plugin"


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory: pytest.TempPathFactory):
    return tiny_package.comfy_models_builder(tmp_path_factory)


@pytest.fixture(scope="module")
def comfy_server_options(tmp_path_factory) -> dict:
    plugins = tmp_path_factory.mktemp("cpu_ranks_nodes")
    (plugins / "lingbot_cpu_ranks_plugin").symlink_to(PLUGIN, target_is_directory=True)
    config = plugins.parent / f"{plugins.name}.yaml"
    config.write_text(f"lingbot_cpu_ranks_plugin:\n  custom_nodes: {plugins}\n")
    return {"extra_args": ["--extra-model-paths-config", str(config)]}


def test_fast_and_play_on_two_cpu_ranks_a_killed_worker_free_and_shutdown(comfy_server: ComfyServer) -> None:
    server = comfy_server
    assert "sequence parallel on 2 CPU ranks" in server.log_text()
    object_info = server.object_info()
    assert sp_server.workers(server) is None  # nothing started before a run asks for it

    result = server.run(sp_server.fast_clip_prompt(object_info, seed=1), timeout=240)
    sp_server.check_video(server, result, frames=9)
    state = sp_server.workers(server)
    assert state["running"] and state["devices"] == ["cpu", "cpu"] and state["loaded"] == {}, state
    (worker,) = state["pids"]
    assert worker in sp_server.descendants(server.process.pid)

    # Play on the warm worker: two chunks steered by keys, then a kill between chunks.
    prompt_id, session = sp_server.start_play(server, "turn", chunk_budget=20)
    sp_server.press(server, session, "w")
    sp_server.wait_for(lambda: sp_server.play_events(server, "frames", session), "the first chunk", server)
    assert sp_server.worker_pids(server) == [worker]  # the same process: kept warm between prompts
    sp_server.kill(worker)
    assert sp_server.wait_gone([worker], timeout=10) == []
    sp_server.wait_for(lambda: server.get(f"{sp_server.PLAY_ROUTE}/{session}").json()["state"] != "running",
                       "the first chunk to end", server)
    sp_server.press(server, session, "d")  # the next chunk needs the dead worker
    failed = server.wait(prompt_id, timeout=120)
    assert failed.status == "error", failed.describe()
    message = sp_server.error_message(failed)
    assert "sequence-parallel worker on cpu (rank 1) exited with code -9" in message, message
    assert failed.error["node_type"] == "LingBotWorldPlay", failed.describe()
    assert not sp_server.workers(server)["running"]

    # The next prompt starts a new worker and runs.
    result = server.run(sp_server.fast_clip_prompt(object_info, seed=2), timeout=240)
    sp_server.check_video(server, result, frames=9)
    (again,) = sp_server.worker_pids(server)
    assert again != worker

    # POST /free stops the worker.
    server.free()
    sp_server.wait_for(lambda: sp_server.workers(server) is None, "/free to stop the worker", server, timeout=30)
    assert sp_server.wait_gone([again]) == []

    # No process of the server outlives it (a warm worker at the time of the stop).
    result = server.run(sp_server.fast_clip_prompt(object_info, seed=3), timeout=240)
    sp_server.check_video(server, result, frames=9)
    children = sp_server.descendants(server.process.pid)
    assert sp_server.worker_pids(server)[0] in children
    server.stop()
    assert sp_server.wait_gone(children) == [], "processes of the server outlived it"
