"""Benchmark LingBot-World Play: a scripted session of ``--seconds`` of video (60 s = 80
chunks, 957 frames at 16 fps) with keys pressed programmatically through the same input
state the Play routes feed (``PlaySession.controls``: ``set_keys`` / ``act``), in
turn-based and continuous mode.

    python bench/play_session.py --package DIR --size 480x832 --seconds 60 --vram-cap-gb 24 \
        --out $OUT/play60_cap24.json

The DiT is any expert-shaped folder (``--dit``; by default the package's low-noise expert:
the synthetic A14B expert of ``python . make_checkpoint --preset a14b --layout nf4`` has the
Fast transformer's exact shapes). T5 encodes the prompt, the DiT loads once, then each mode
runs one whole session (its own KV cache, VAE and streams; the .mp4 written to a temporary
folder and the frames encoded as JPEG for the page, as in ComfyUI):

* turn: the driver releases the keys and presses the next ones of a walking script as soon
  as the previous chunk's last frames arrive (no thinking time): one chunk per press.
* continuous: chunks back to back; the driver changes the keys every ``--change-s``
  seconds of wall time, whenever that falls, as a player does.

Recorded per mode: ``key_to_frame_s`` (median, p90, all: the input's arrival → the first
frames of the chunk it steers decoded, written and encoded for the page — its first latent
frame's, sent before the rest of the chunk decodes; a change during a chunk steers the next
one), ``fps`` (video frames generated per second of the session),
``chunk_s`` (the transformer's time per chunk), ``decode_s`` per chunk,
``peak_vram_allocated_gb``; for the run ``peak_rss_anon_gb``, the cache settings and
``cap_gb``. Several GPUs and the live decoder (no package needed but a VAE file):

    python bench/play_session.py --synthetic a14b --weights fp8 --ranks 2 --vae VAE.safetensors \
        --decoders tiny --comfy .bench_host --seconds 60 --out $OUT/play60_sp2_tiny.json

``--synthetic``: the Fast transformer is built on each GPU from seeded random weights of the
A14B shapes (bench/_synthetic.py) and the prompt's states are random (no T5); ``--ranks N``:
sequence parallel over cuda:0..N-1 (``pipeline.parallel_pool``, as the Fast DiT Loader's
``devices sequence_parallel`` runs it); ``--vae-device``: where the VAE (and the decode) goes;
``--decoders tiny``: the chunks decoded by ComfyUI's tiny video VAE (TAEHV, 16 latent channels,
random weights: its speed, not its pictures) through ``nodes/host/tiny_vae.py``, the Play
node's ``live_decoder``. ``--decoders wan,tiny`` and ``--modes`` run every combination on the
same loaded model.

Checked on the CPU with a tiny package:

    python . make_checkpoint --preset tiny --layout nf4 --out /tmp/tiny
    python bench/play_session.py --package /tmp/tiny --device cpu --size 32x48 --seconds 2 --out /tmp/play.json
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import os
import json
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

import _pack  # noqa: F401  (registers the checkout as comfyui_lingbot_world)
from comfyui_lingbot_world.loaders.package import find_package  # noqa: E402
from comfyui_lingbot_world.pipeline.guards import VAE_PRECISIONS  # noqa: E402
from comfyui_lingbot_world.pipeline.image import as_pil, open_vae, vae_dtype  # noqa: E402
from comfyui_lingbot_world.pipeline.memory import release_module  # noqa: E402
from comfyui_lingbot_world.pipeline.play import PlaySession, PlaySettings  # noqa: E402
from comfyui_lingbot_world.pipeline.play.registry import SessionRegistry  # noqa: E402
from comfyui_lingbot_world.pipeline.text import encode_text  # noqa: E402
from comfyui_lingbot_world.pipeline.video_file import VideoWriter  # noqa: E402
from comfyui_lingbot_world.wan.conditioning import image_to_tensor  # noqa: E402
from comfyui_lingbot_world.wan.runtime.attention import CHOICES as ATTENTION_CHOICES  # noqa: E402
from comfyui_lingbot_world.wan.runtime.kv_cache import KV_DTYPES  # noqa: E402
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy  # noqa: E402
from comfyui_lingbot_world.wan.runtime.switches import STREAM_PRIORITY  # noqa: E402
from comfyui_lingbot_world.wan.scheduler import DEFAULT_FAST_STEPS, FAST_STEPS  # noqa: E402
from fast_chunks import PROMPT, cap_vram, load_image, sync  # noqa: E402
from bench_pipeline import env_record  # noqa: E402
from memory_plan import apply_memory_plan  # noqa: E402
from memwatch import GB, MemoryWatch  # noqa: E402

# A walk: forward, look around, turn, strafe, back (cycled for as many chunks as needed).
WALK = ("w", "w", "wj", "w", "wl", "l", "w", "d", "wi", "k", "w", "a", "s", "wj", "", "w")
FIRST_CHUNK, CHUNK_FRAMES = 9, 12
WARM_UP = {"auto": None, "on": True, "off": False}  # --warm-up -> PlaySettings.warm_up
STEADY_FROM = 0.25  # steady_fps leaves out the first quarter of a session's chunks (cache filling, captures)


def session_chunks(seconds: float, fps: int) -> int:
    """Chunks of a session of ``seconds`` of video: 60 s at 16 fps → 80 (957 frames)."""
    frames = int(round(seconds * fps))
    return 1 + max(0, frames - FIRST_CHUNK) // CHUNK_FRAMES


def summary(values: list[float]) -> dict:
    if not values:
        return {"median": None, "p90": None, "all": []}
    p90 = statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]
    return {"median": statistics.median(values), "p90": p90, "all": values}


class Driver:
    """Presses keys as a player would, through the session's input state (what the routes call)."""

    def __init__(self, session: PlaySession, mode: str, change_s: float) -> None:
        self.session, self.mode, self.change_s = session, mode, change_s
        self.frames_events = threading.Semaphore(0)
        self.started = threading.Event()
        self._stop = threading.Event()
        self.presses = 0
        self.delivered: list[tuple[float, int]] = []  # (time, frames sent so far) at each chunk's last part

    def on_event(self, event: str, data: dict) -> None:
        # A chunk arrives in parts (one per latent frame): the next press waits for its last.
        if event == "lingbot.play.frames" and data.get("last", True):
            self.delivered.append((time.perf_counter(), data["first_frame"] + len(data["frames"])))
            self.frames_events.release()
        elif event == "lingbot.play.started":
            self.started.set()

    def _wait(self, condition, timeout: float = 600.0) -> bool:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.session.ended or time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def run(self) -> None:
        controls = self.session.controls
        if not self._wait(self.started.is_set):  # pressed once the session is open, as the page does
            return
        step = 0
        if self.mode == "turn":
            while not self.session.ended:
                keys = WALK[step % len(WALK)]
                step += 1
                controls.set_keys(frozenset())  # release, then press: every chunk is asked for
                if not self._wait(lambda: not controls.running):
                    return
                if keys:
                    controls.set_keys(frozenset(keys))
                else:
                    controls.act("step")  # a chunk with no keys held
                self.presses += 1
                if not self.frames_events.acquire(timeout=600):
                    return
        else:
            while not self.session.ended and not self._stop.wait(self.change_s):
                keys = WALK[step % len(WALK)]
                step += 1
                controls.set_keys(frozenset(keys))
                self.presses += 1

    def stop(self) -> None:
        self._stop.set()

    def steady_fps(self) -> float | None:
        return steady_fps(self.delivered)


def steady_fps(marks: list[tuple[float, int]], least: int = 5) -> float | None:
    """Frames per second over a session's last three quarters of chunks (after the cache
    filled and the graphs were captured): the rate a player sees once the walk is going.
    ``marks``: (time, frames so far) at each chunk's last part, in order; None for fewer
    than ``least`` chunks."""
    if len(marks) < max(2, least):
        return None
    (t0, f0), (t1, f1) = marks[int(len(marks) * STEADY_FROM)], marks[-1]
    return (f1 - f0) / (t1 - t0) if t1 > t0 else None


def tiny_decoder_factory(comfy: str, device: torch.device, dtype: torch.dtype):
    """ComfyUI's TAEHV for 16-channel (Wan 2.1) latents, seeded random weights, behind the
    Play node's live decoder (``nodes/host/tiny_vae.py``, imported without the node registry)."""
    import importlib
    import types

    sys.path.append(comfy)
    root = Path(__file__).resolve().parents[1]
    for name, folder in (("comfyui_lingbot_world.nodes", root / "nodes"),
                         ("comfyui_lingbot_world.nodes.host", root / "nodes" / "host")):
        if name not in sys.modules:  # bare packages: nodes/__init__.py would register every node
            package = types.ModuleType(name)
            package.__path__ = [str(folder)]
            sys.modules[name] = package
    from comfy.cli_args import args as comfy_args

    comfy_args.cpu = device.type == "cpu"  # before comfy.model_management looks for a GPU
    tiny = importlib.import_module("comfyui_lingbot_world.nodes.host.tiny_vae")
    from comfy.taesd.taehv import TAEHV

    model = TAEHV(latent_channels=16)
    generator = torch.Generator().manual_seed(5)
    for param in model.parameters():  # ComfyUI's layers skip init (its loaders fill them)
        param.data = torch.randn(param.shape, generator=generator) * 0.02
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    return lambda: tiny.TinyStreamDecoder(model, device, dtype)


def run_mode(args, mode: str, model, text: torch.Tensor, vae_file: Path, pixels: torch.Tensor,
             policy: CachePolicy, device: torch.device, watch: MemoryWatch, folder: Path,
             decoder_name: str = "wan") -> dict:
    height, width = pixels.shape[1:]
    chunks = session_chunks(args.seconds, args.fps)
    settings = PlaySettings(width=width, height=height, seed=0, shift=args.shift, chunk_budget=chunks, mode=mode,
                            idle_timeout_s=3600.0, policy=policy, fps=args.fps, vae_precision=args.vae_precision,
                            attention=args.attention, camera_terms=args.camera_terms or 0, poll_s=0.001,
                            cuda_graphs=args.cuda_graphs, steps=args.steps, warm_up=WARM_UP[args.warm_up])
    record: dict = {"mode": mode, "chunks_asked": chunks, "decoder": decoder_name}
    with watch.phase(f"session_{mode}_{decoder_name}") as phase:
        # The VAE where the memory plan puts it (--memory auto on a small card: maybe the CPU).
        vae_device = device if getattr(args, "vae_on_gpu", True) else torch.device("cpu")
        if args.vae_device:
            vae_device = torch.device(args.vae_device)
        record["vae_device"] = str(vae_device)
        vae = open_vae(vae_file, vae_device, vae_dtype(vae_device, args.vae_precision))
        decoder = (tiny_decoder_factory(args.comfy, vae_device, torch.bfloat16 if vae_device.type == "cuda"
                                        else torch.float32) if decoder_name == "tiny" else None)
        session = None
        try:
            with VideoWriter(folder / f"play_{mode}_{decoder_name}.mp4", fps=args.fps) as writer:
                holder: dict = {}
                session = PlaySession(model, text, vae, pixels, settings, writer=writer,
                                      emit=lambda e, d: holder["driver"].on_event(e, d),
                                      registry=SessionRegistry(), overlap=args.overlap, decoder=decoder)
                driver = Driver(session, mode, args.change_s)
                holder["driver"] = driver
                thread = threading.Thread(target=driver.run, daemon=True)
                thread.start()
                started = time.perf_counter()
                result = session.run()
                elapsed = time.perf_counter() - started
                driver.stop()
                thread.join(5)
        finally:
            release_module(vae)
            del vae
    record.update({
        "reason": result.reason, "chunks": result.chunks, "frames": result.frames, "session_s": elapsed,
        "presses": driver.presses, "fps": result.frames / elapsed, "steady_fps": driver.steady_fps(),
        "key_to_frame_s": summary(result.latency_s), "chunk_s": summary(result.chunk_s),
        "decode_s": summary(result.decode_s),
        # The warm-up before the session started (null: none ran) and the first chunk after it.
        "warm_up_s": result.warm_up_s, "first_chunk_s": result.chunk_s[0] if result.chunk_s else None,
        "peak_vram_allocated_gb": phase.get("peak_vram_allocated_gb"),
        "peak_vram_reserved_gb": phase.get("peak_vram_reserved_gb"),
        "video_bytes": (folder / f"play_{mode}_{decoder_name}.mp4").stat().st_size,
    })
    return record


def synthetic_config(name: str):
    from comfyui_lingbot_world.wan.config import A14B, TINY

    return {"a14b": A14B, "tiny": TINY}[name]


def random_text(config, tokens: int = 24) -> torch.Tensor:
    """Stand-in prompt states [tokens, text_dim] (synthetic runs: the transformer's cost does not
    depend on them)."""
    return torch.randn(tokens, config.text_dim, generator=torch.Generator().manual_seed(3))


def load_dit(args, dit: Path | None, device: torch.device):
    """(model, pool): the Fast transformer on ``device``, or with ``--ranks N`` its rank-0 copy
    driving N-1 workers (``ParallelModel``; pool to close after)."""
    from comfyui_lingbot_world.pipeline.parallel_pool import LoadExpert, ParallelModel, RankPool, apply_env

    if args.synthetic:
        from _synthetic import SyntheticDiT

        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        factory = SyntheticDiT(synthetic_config(args.synthetic), dtype, weights=args.weights or "bf16")
    else:
        factory = LoadExpert(str(dit), args.weights or args.quantize, args.blocks_on_gpu or None)
    if args.ranks <= 1:
        return factory(device), None
    if device.type == "cuda" and torch.cuda.device_count() < args.ranks:
        raise SystemExit(f"--ranks {args.ranks} needs {args.ranks} GPUs; torch.cuda.device_count() is "
                         f"{torch.cuda.device_count()}")
    apply_env()
    devices = [torch.device("cuda", i) for i in range(args.ranks)] if device.type == "cuda" else [device] * args.ranks
    pool = RankPool(devices).start()
    try:
        return ParallelModel(pool, "dit", pool.load("dit", factory, local=factory(devices[0]))), pool
    except BaseException:
        pool.close()
        raise


def _attention_used(choice: str, device: torch.device) -> str:
    """The attention kernel the session's forwards run (``--attention``; auto: the nodes' rule),
    named as the backend table names it."""
    from comfyui_lingbot_world.wan.runtime.attention import attention_backend, backend_name

    with attention_backend(choice):
        return backend_name(device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--package", help="a package folder (T5, VAE, tokenizer, and expert folders)")
    p.add_argument("--dit", help="the Fast transformer's folder (default: the package's low-noise expert)")
    p.add_argument("--t5")
    p.add_argument("--tokenizer")
    p.add_argument("--vae")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--text-device", help="where T5 runs (default: the device)")
    p.add_argument("--size", default="480x832")
    p.add_argument("--seconds", type=float, default=60.0, help="seconds of video a session makes (60: 80 chunks)")
    p.add_argument("--fps", type=int, default=16)
    p.add_argument("--modes", default="turn,continuous")
    p.add_argument("--change-s", type=float, default=1.3, help="continuous mode: seconds between key changes")
    p.add_argument("--kv-window", type=int, default=9)
    p.add_argument("--kv-sink", type=int, default=3)
    p.add_argument("--kv-dtype", default="bf16", choices=KV_DTYPES)
    p.add_argument("--vae-precision", default="fp32", choices=tuple(VAE_PRECISIONS))
    p.add_argument("--shift", type=float, default=10.0)
    p.add_argument("--steps", type=int, default=DEFAULT_FAST_STEPS, choices=FAST_STEPS,
                   help="denoising steps a chunk: 4 (official) or the first 3, 2, 1 of its timesteps")
    p.add_argument("--camera-terms", type=int, default=None,
                   help="blocks whose camera terms a chunk keeps (FastParams.camera_terms; 40: all, 0: none); "
                        "default: the memory plan's with --memory auto, else 0")
    p.add_argument("--attention", default="auto", choices=ATTENTION_CHOICES,
                   help="attention kernel; auto: the nodes' rule (wan/runtime/attention.py decide)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="replay each chunk's passes from CUDA graphs once the cache is full (with --memory auto: "
                        "where the plan has room for their pool)")
    p.add_argument("--warm-up", default="auto", choices=tuple(WARM_UP),
                   help="the generator's warm-up before each session starts (PlaySettings.warm_up; auto: on a GPU, "
                   "as the Play node; off: the first chunk pays the kernel compilation and the graph capture)")
    p.add_argument("--vram-cap-gb", type=float, default=None)
    p.add_argument("--blocks-on-gpu", type=int, default=0)
    p.add_argument("--quantize", default=None)
    p.add_argument("--weights", default=None, choices=("bf16", "nf4", "fp8", "int8"),
                   help="the kind the DiT's linears are held and multiplied in (default: as stored)")
    p.add_argument("--image")
    p.add_argument("--pipeline", default="overlap", choices=("overlap", "sequential"),
                   help="overlap: chunk n decoded and sent while chunk n+1 generates; sequential: one after the other")
    p.add_argument("--synthetic", nargs="?", const="a14b", default=None, choices=("a14b", "tiny"),
                   help="the Fast transformer from seeded random weights of these shapes (a14b: the real ones; "
                   "tiny: the CPU check's), built on each GPU, and random prompt states (no package, no T5; "
                   "give --vae)")
    p.add_argument("--ranks", type=int, default=1, help="sequence parallel over cuda:0..N-1 (1: one GPU)")
    p.add_argument("--vae-device", default=None, help="where the VAE and the decode go (default: the DiT's device)")
    p.add_argument("--decoders", default="wan", help="comma-separated: wan (the Wan VAE's stream decoder), "
                   "tiny (ComfyUI's TAEHV through nodes/host/tiny_vae.py; needs --comfy)")
    p.add_argument("--comfy", default=None, help="folder holding ComfyUI's sources (comfy/), for --decoders tiny")
    p.add_argument("--stream-priority", default="on",
                   help="comma-separated on/off: the generation on a highest-priority CUDA stream beside the decode "
                   "(pipeline.fast.worker.generation_first; off: LINGBOT_STREAM_PRIORITY=0); each value a session")
    p.add_argument("--memory", default="manual", choices=("manual", "auto"),
                   help="auto: kv dtype, blocks on the GPU and overlap as the nodes choose them for a card of "
                   "--vram-cap-gb (pipeline.memory.plan_fast_memory); manual: the flags as given")
    args = p.parse_args(argv)
    args.overlap = args.pipeline == "overlap"

    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    text_device = torch.device(args.text_device) if args.text_device else device
    height, width = (int(v) for v in args.size.lower().split("x"))
    files = find_package(args.package) if args.package else None
    decoders = [d.strip() for d in args.decoders.split(",") if d.strip()]
    if "tiny" in decoders and not args.comfy:
        p.error("--decoders tiny needs --comfy (a folder with ComfyUI's comfy/ sources)")
    if args.synthetic:
        if not args.vae:
            p.error("--synthetic needs --vae (a Wan 2.1 VAE file, e.g. make_checkpoint --parts vae)")
        if args.memory == "auto":
            p.error("--synthetic plans no memory (there are no files to size): use --memory manual")
        dit = t5 = tokenizer = None
    else:
        dit = Path(args.dit) if args.dit else files.low
        t5 = Path(args.t5) if args.t5 else files.t5
        tokenizer = Path(args.tokenizer) if args.tokenizer else (files.tokenizer if files else None)
    vae_file = Path(args.vae) if args.vae else files.vae
    plan = (apply_memory_plan(args, dit, vae_file, device, args.vae_precision, live_decoder=decoders == ["tiny"])
            if args.memory == "auto" else None)
    args.camera_terms = args.camera_terms or 0
    policy = CachePolicy(window=args.kv_window, sink=args.kv_sink, dtype=args.kv_dtype)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    cap_vram(args.vram_cap_gb, device)
    record: dict = {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "torch": torch.__version__, "size": args.size, "seconds": args.seconds, "fps_video": args.fps,
        "chunks": session_chunks(args.seconds, args.fps), "kv_window": policy.window, "kv_sink": policy.sink,
        "kv_dtype": policy.dtype, "vae_precision": args.vae_precision, "cap_gb": args.vram_cap_gb,
        "blocks_on_gpu": args.blocks_on_gpu or None, "dit": str(dit), "modes": {},
        "pipeline": "overlap" if args.overlap else "sequential", "memory_plan": plan, "weights": args.weights,
        "camera_terms": args.camera_terms, "cuda_graphs": args.cuda_graphs, "warm_up": args.warm_up,
        "synthetic": args.synthetic,
        "ranks": args.ranks, "steps": args.steps, "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "attention": _attention_used(args.attention, device),
        "env": env_record(),
    }
    pixels = image_to_tensor(as_pil(load_image(args.image, height, width)), height, width)
    try:
        with MemoryWatch() as watch, tempfile.TemporaryDirectory(prefix="lingbot-play-bench-") as folder:
            with watch.phase("text_encode") as ph:
                text = (random_text(synthetic_config(args.synthetic)) if args.synthetic else
                        encode_text(t5, tokenizer, PROMPT, "", text_device,
                                    cache_dir=Path(folder) / "text_cache").positive)
            record["text_encode_s"] = ph["seconds"]
            with watch.phase("dit_load") as ph:
                model, pool = load_dit(args, dit, device)
                sync(device)
            record["dit_load_s"] = ph["seconds"]
            try:
                if pool is not None:
                    record["link"] = pool.measure_link()
                priorities = [v.strip() for v in args.stream_priority.split(",") if v.strip()]
                for priority, decoder_name, mode in itertools.product(priorities, decoders, modes):
                    os.environ[STREAM_PRIORITY.name] = "0" if priority == "off" else "1"
                    key = mode if decoders == ["wan"] else f"{mode}_{decoder_name}"
                    key += "" if priorities == ["on"] else f"_priority_{priority}"
                    try:
                        record["modes"][key] = run_mode(args, mode, model, text, vae_file, pixels, policy,
                                                        device, watch, Path(folder), decoder_name)
                    except torch.cuda.OutOfMemoryError as exc:
                        record["modes"][key] = {"mode": mode, "decoder": decoder_name, "oom": str(exc)[:600]}
                        torch.cuda.empty_cache()
            finally:
                if pool is not None:
                    model.close()
                    pool.close()
            release_module(model)
            del model
        record["phases"] = watch.phases
        record["peak_rss_anon_gb"] = watch.peak_anon / GB
        record["peak_rss_file_gb"] = watch.peak_file / GB
    except torch.cuda.OutOfMemoryError as exc:
        record["oom"] = str(exc)[:600]
    Path(args.out).write_text(json.dumps(record, indent=2, default=str))
    brief = {mode: {k: (v["median"] if isinstance(v, dict) and "median" in v else v)
                    for k, v in r.items()
                    if k in ("fps", "steady_fps", "key_to_frame_s", "chunk_s", "decode_s", "peak_vram_allocated_gb",
                             "oom")}
             for mode, r in record["modes"].items()}
    print(json.dumps({"cap_gb": args.vram_cap_gb, "kv_dtype": policy.dtype, **brief}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
