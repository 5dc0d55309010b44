"""Benchmark LingBot-World Play where a person sees it: at a client of a real ComfyUI server.

    python bench/play_client.py --package DIR --comfy .bench_host --size 480x832 --seconds 60 \
        --steps 2 --weights fp8 --live-decoder --out $OUT/play_client_steps2.json

The script starts the test host (ComfyUI, ``--comfy``: a folder with its sources; by default the
tests' copy, tests/comfy_host.py) with the pack installed and the package ``--package`` (any
package folder: NF4, bf16, or fp8 from ``python . quantize --format fp8``) linked into its models
folder, queues the shipped Play template (example_workflows/, converted to an API prompt as the
page converts it, with the size, steps, cache, loader and decoder settings of the flags) over
HTTP with a ``client_id``, reads ``/ws?clientId=…`` as the page does (the only page: one
socket), and holds keys through the Play routes as the page posts them. Every message is
timestamped on arrival with ``time.monotonic`` — the clock of the server's ``sent_at`` on each
``lingbot.play.frames`` message, so the socket's delay is measured too (client and server on
one machine).

Sessions, one queued prompt each, in the same server (``--sessions``; the first is the cold
start): ``continuous`` plays a whole ``--seconds`` session (60 s: 80 chunks, 957 frames), the
keys changing every ``--change-s`` seconds; ``turn`` makes ``--presses`` chunks, one per key
press, each pressed as soon as the previous chunk's last part arrived. Per session:

* at the client: ``client_fps_session`` (frames received / wall time from the session's first
  key to its last frame, first chunk included), ``client_fps_steady`` (its last three quarters
  of chunks, from 3 chunks on), ``client_key_to_frame_s`` (median, p90: the POST of the input a
  chunk answered → the chunk's first part on arrival), ``client_first_frame_s``, ``socket_bytes_per_s`` (every message on
  the socket), ``transit_s`` (``sent_at`` → arrival);
* in process, the same session's own figures from its messages: ``server.fps_session`` /
  ``server.fps_steady`` (by ``sent_at``), ``server.key_to_frame_s`` (its ``latency_s``),
  ``first_chunk_s`` and ``chunk_s`` (the transformer's time, ``chunk_s``), and
  ``client_over_server_fps``;
* ``run_to_started_s`` (Run → the session open: T5, the transformer's load, the VAE, the start
  image's encode, and whatever warm-up the session runs before it reports itself started) and
  ``run_to_first_frame_s``.

``server_log``: the server's own lines about its device (the allocator ComfyUI chose) and the
pack's (per Play run: the transformer's and the decode's time a chunk, the CUDA graphs
captured and replayed, or why the passes ran eagerly).

The record's top level names ``gpu``, ``ranks`` and ``steps``, the cold start (the first
session's ``run_to_first_frame_s``, with the package read once before the server starts so it
is in the page cache, ``page_cache_read_s``), the server's start, and the main figures: the
continuous session's fps, the turn session's key → frame. ``--vram-cap-gb`` runs the server as
on a card of that size (bench/vram_cap_plugin). Checked on the CPU with the tiny Fast package
(tests/integration/test_bench_play_client.py):

    python bench/play_client.py --package /tmp/tiny_with_fast --device cpu --size 32x48 \
        --seconds 2 --presses 2 --out /tmp/play_client.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import _pack  # noqa: F401  (registers the checkout as comfyui_lingbot_world)
from play_session import WALK, session_chunks, steady_fps, summary  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT / "tests", ROOT / "tests" / "integration"):  # the test host's driver
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
import tiny_package  # noqa: E402
from comfy_host import comfy_root  # noqa: E402
from comfy_server import ComfyServer  # noqa: E402
from shipped_workflows import TEMPLATES, template_prompt  # noqa: E402

from comfyui_lingbot_world.pipeline.guards import VAE_PRECISIONS  # noqa: E402
from comfyui_lingbot_world.wan.runtime.kv_cache import KV_DTYPES  # noqa: E402
from comfyui_lingbot_world.wan.scheduler import DEFAULT_FAST_STEPS, FAST_STEPS  # noqa: E402

PACKAGE_NAME = "bench-package"  # models/lingbot/<this> links to --package
START_IMAGE = "lingbot_world_start.jpg"
PLAY_ROUTE = "/lingbot/play"
FRAMES, STATE, STARTED = "lingbot.play.frames", "lingbot.play.state", "lingbot.play.started"
ENDS = ("execution_success", "execution_error", "execution_interrupted")
PLUGIN = ROOT / "bench" / "vram_cap_plugin"
STEADY_LEAST = 3  # chunks a session needs for a steady rate (a short CPU check has a few)


# --------------------------------------------------------------------------- the page's socket

@dataclass(frozen=True)
class Message:
    at: float  # time.monotonic() on arrival
    nbytes: int  # the message's bytes on the socket
    kind: str
    data: dict  # a frames message's ``frames`` replaced by their count


class TimedSocket:
    """``/ws?clientId=…`` read in a thread, every message kept with its arrival time and size."""

    def __init__(self, url: str, client_id: str) -> None:
        self.url, self.client_id = f"{url}?clientId={client_id}", client_id
        self.messages: list[Message] = []
        self.closed_reason: str | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="play-client-ws", daemon=True)

    def start(self, timeout: float = 30.0) -> "TimedSocket":
        self._thread.start()
        if not self._connected.wait(timeout):
            raise RuntimeError(f"websocket {self.url} did not connect within {timeout} s")
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        import websocket  # websocket-client

        ws = websocket.create_connection(self.url, timeout=1.0)
        self._connected.set()
        try:
            while not self._stop.is_set():
                try:
                    opcode, payload = ws.recv_data()
                except websocket.WebSocketTimeoutException:
                    continue
                at = time.monotonic()
                if opcode == websocket.ABNF.OPCODE_CLOSE:
                    break
                kind, data = "binary", {}
                if opcode == websocket.ABNF.OPCODE_TEXT:
                    parsed = json.loads(payload)
                    kind, data = parsed.get("type", ""), parsed.get("data") or {}
                    if kind == FRAMES:
                        data = {**data, "frames": len(data["frames"])}
                with self._cond:
                    self.messages.append(Message(at, len(payload), kind, data))
                    self._cond.notify_all()
        except (websocket.WebSocketException, OSError) as error:
            self.closed_reason = f"{type(error).__name__}: {error}"
        finally:
            ws.close()
            with self._cond:
                self._cond.notify_all()

    def wait_for(self, match, start: int = 0, timeout: float = 600.0) -> Message:
        """The first message from index ``start`` on for which ``match(message)`` holds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for message in self.messages[start:]:
                    if match(message):
                        return message
                start = len(self.messages)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (not self._thread.is_alive() and self._connected.is_set()):
                    raise TimeoutError(f"no matching message within {timeout} s "
                                       f"(socket: {self.closed_reason or 'open'})")
                self._cond.wait(min(remaining, 0.5))

    def count(self) -> int:
        with self._cond:
            return len(self.messages)


# --------------------------------------------------------------------------- the server

def gpu_names() -> list[str]:
    """The GPUs as nvidia-smi names them (this process holds no CUDA context); none without it."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                         timeout=60).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


class GpuMemory:
    """nvidia-smi's used memory of GPU 0 every half second, while running; the peak in MiB."""

    def __init__(self) -> None:
        self.peak_mib: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "GpuMemory":
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i",
                                  "0"], capture_output=True, text=True, timeout=30).stdout.strip()
            if out.isdigit():
                self.peak_mib = max(self.peak_mib or 0, int(out))


def read_package(package: Path) -> dict:
    """Every file of the package read once (the page cache holds them after), timed."""
    started, total = time.perf_counter(), 0
    for path in sorted(p for p in package.rglob("*") if p.is_file()):
        with open(path, "rb") as handle:
            while chunk := handle.read(64 << 20):
                total += len(chunk)
    return {"page_cache_read_s": time.perf_counter() - started, "package_bytes": total}


def server_for(args: argparse.Namespace, base: Path) -> ComfyServer:
    """A ComfyUI of its own under ``base`` with the pack, the package, the start image and, with
    ``--live-decoder``, a tiny video VAE (random weights: its speed, not its pictures)."""
    host = Path(args.comfy) if args.comfy else comfy_root()
    if host is None or not (host / "main.py").is_file():
        raise SystemExit(f"--comfy: no ComfyUI sources at {host} (bench/server_carry.sh makes .bench_host)")
    extra, env = ["--preview-method", "none", *shlex.split(args.server_args)], {}
    if args.vram_cap_gb:
        plugins = base / "plugins"
        plugins.mkdir(parents=True)
        (plugins / "lingbot_vram_cap_plugin").symlink_to(PLUGIN, target_is_directory=True)
        config = base / "plugins.yaml"
        config.write_text(f"lingbot_vram_cap_plugin:\n  custom_nodes: {plugins}\n")
        extra += ["--extra-model-paths-config", str(config)]
        env["LINGBOT_VRAM_CAP_GB"] = str(args.vram_cap_gb)
    server = ComfyServer(base / "comfy", host_root=host, name="play_client", cpu=args.device == "cpu",
                         start_timeout=args.start_timeout, extra_args=extra, env=env, listen=False)
    target = server.models_dir / "lingbot" / PACKAGE_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(Path(args.package).resolve(), target_is_directory=True)
    start_image(args, server.input_dir / START_IMAGE)
    if args.live_decoder:
        tiny_package.write_tiny_video_vae(server.models_dir, host)
    return server


def start_image(args: argparse.Namespace, path: Path) -> None:
    """The start image in the server's input folder, upright (EXIF applied) as the in-process
    benches read it, or seeded noise of the session's size."""
    from fast_chunks import load_image

    load_image(args.image, *size_of(args)).convert("RGB").save(path)


def size_of(args: argparse.Namespace) -> tuple[int, int]:
    height, width = (int(v) for v in args.size.lower().split("x"))
    return height, width


# --------------------------------------------------------------------------- the prompt

def package_file(object_info: dict, node: str, field: str, wanted: str | None = None) -> str:
    """The entry of a file combo under the linked package (``wanted``: its leaf's start)."""
    spec = object_info[node]["input"]["required"][field]
    options = spec[0] if isinstance(spec[0], list) else spec[1]["options"]
    prefix = f"lingbot/{PACKAGE_NAME}/"
    ours = [o for o in options if o.startswith(prefix) and (wanted is None or o[len(prefix):].startswith(wanted))]
    if not ours:
        raise SystemExit(f"--package: the {node} node's {field} lists nothing under {prefix}"
                         f"{wanted or ''} (it lists {options[:8]}); is it a LingBot-World package with "
                         "LingBot-World Fast in it?")
    return ours[0]


def play_prompt(object_info: dict, args: argparse.Namespace, mode: str, chunk_budget: int, take: int) -> dict:
    """The Play template as the page queues it, with the flags' settings and a prompt of its own
    (``take``: every session encodes its text, as a person typing a new one)."""
    ui = json.loads((ROOT / "example_workflows" / f"{TEMPLATES['lingbot_play']}.json").read_text(encoding="utf-8"))
    graph = template_prompt(ui, object_info)
    nodes = {node["class_type"]: node["inputs"] for node in graph.values()}
    height, width = size_of(args)
    nodes["LoadImage"]["image"] = START_IMAGE
    text = nodes["LingBotWorldTextEncode"]
    text.update(t5_file=package_file(object_info, "LingBotWorldTextEncode", "t5_file"),
                tokenizer=package_file(object_info, "LingBotWorldTextEncode", "tokenizer"))
    text["prompt"] += f" Take {take}."
    loader = nodes["LingBotWorldFastDiTLoader"]
    loader["fast_model"] = package_file(object_info, "LingBotWorldFastDiTLoader", "fast_model", args.fast_folder)
    loader.update({k: v for k, v in (("bf16_quantize", args.bf16_quantize), ("block_swap", args.block_swap),
                                     ("weights", args.weights), ("devices", args.devices),
                                     ("attention", args.attention)) if v is not None})
    play = nodes["LingBotWorldPlay"]
    play.update(vae=package_file(object_info, "LingBotWorldPlay", "vae"), width=width, height=height, mode=mode,
                chunk_budget=chunk_budget, idle_timeout=args.idle_timeout, kv_window=args.kv_window,
                kv_sink=args.kv_sink, kv_dtype=args.kv_dtype, fps=args.fps, precision=args.vae_precision,
                steps=args.steps, seed=take)
    if args.live_decoder:
        graph["90"] = {"class_type": "VAELoader", "inputs": {"vae_name": tiny_package.TINY_VIDEO_VAE}}
        play["live_decoder"] = ["90", 0]
    return graph


# --------------------------------------------------------------------------- a session

class Page:
    """What the page sends: the held keys, through the Play routes; ``posts``: the time just
    before each POST."""

    def __init__(self, server: ComfyServer, socket: TimedSocket, session_id: str) -> None:
        self.server, self.socket, self.session_id = server, socket, session_id
        self.posts: list[float] = []

    def keys(self, keys: str) -> None:
        self.posts.append(time.monotonic())
        reply = self.server.post(f"{PLAY_ROUTE}/{self.session_id}/keys",
                                 {"client_id": self.socket.client_id, "keys": keys})
        if reply.status_code not in (200, 410):  # 410: it ended meanwhile
            raise RuntimeError(f"keys {keys!r}: {reply.status_code} {reply.text}")

    def wait_idle(self, timeout: float = 600.0) -> None:
        """Until the session makes no chunk (on a GPU the chunk is done before its last part
        is decoded; without the overlap, after it is sent)."""
        deadline = time.monotonic() + timeout
        while self.server.get(f"{PLAY_ROUTE}/{self.session_id}").json()["state"] == "running":
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Play session still runs a chunk after {timeout} s")
            time.sleep(0.002)


def is_frames(session_id: str, chunk: int | None = None, part: int | None = None, last: bool | None = None):
    def match(m: Message) -> bool:
        d = m.data
        return (m.kind == FRAMES and d.get("session_id") == session_id and (chunk is None or d["chunk"] == chunk)
                and (part is None or d["part"] == part) and (last is None or d["last"] == last))
    return match


def ended(session_id: str):
    return lambda m: m.kind == STATE and m.data.get("session_id") == session_id and m.data.get("state") == "ended"


def drive_turn(page: Page, presses: int) -> int:
    """One chunk per press (released, then held: a new press), the next once the chunk's last
    part arrived and the session waits again (a press while a chunk runs only changes the held
    keys); the presses made."""
    walk = [k for k in WALK if k]
    for chunk in range(presses):
        page.keys("")
        page.keys(walk[chunk % len(walk)])
        last = page.socket.wait_for(lambda m: is_frames(page.session_id, chunk, last=True)(m)
                                    or ended(page.session_id)(m))
        if last.kind != FRAMES:
            return chunk + 1
        page.wait_idle()
    return presses


def drive_continuous(page: Page, change_s: float, stop: threading.Event) -> None:
    """Keys changed every ``change_s`` seconds until the session ends, the first at once."""
    held, step = None, 0
    while not stop.is_set():
        keys = WALK[step % len(WALK)]
        step += 1
        if keys != held:
            page.keys(keys)
            held = keys
        stop.wait(change_s)


def key_to_frame(frames: list[Message], posts: list[float]) -> list[float]:
    """Per chunk that answered an input: the POST of that input → the chunk's first part on
    arrival. The server names the input by its arrival (``sent_at`` − ``latency_s``, its
    monotonic clock, this machine's): the last POST sent before it is the one."""
    out = []
    for m in frames:
        if m.data["part"] != 0 or m.data["latency_s"] is None:
            continue
        arrived = m.data["sent_at"] - m.data["latency_s"]
        sent = [at for at in posts if at <= arrived]
        if sent:
            out.append(m.at - sent[-1])
    return out


def run_session(server: ComfyServer, socket: TimedSocket, prompt: dict, mode: str, args: argparse.Namespace) -> dict:
    begin = socket.count()
    queued = time.monotonic()
    prompt_id = server.queue(prompt, client_id=socket.client_id)
    started = socket.wait_for(lambda m: m.kind == STARTED, begin, timeout=args.start_timeout + 600)
    session_id = started.data["session_id"]
    page = Page(server, socket, session_id)
    # The player's first key as soon as the panel is live (in turn mode the first press).
    stop, presses = threading.Event(), None
    if mode == "turn":
        presses = drive_turn(page, args.presses)
    else:
        driver = threading.Thread(target=drive_continuous, args=(page, args.change_s, stop), daemon=True)
        driver.start()
    end = socket.wait_for(ended(session_id), begin, timeout=args.session_timeout)
    stop.set()
    if mode != "turn":
        driver.join(30)
    finish = socket.wait_for(lambda m: m.kind in ENDS and m.data.get("prompt_id") == prompt_id, begin, timeout=120)
    with socket._cond:
        messages = socket.messages[begin:]
    record = session_record(messages, session_id, queued, started, page.posts, end, finish)
    return {"mode": mode, "presses": presses if presses is not None else len(page.posts),
            "log": action_log(messages, started.data["node_id"]), **record}


def action_log(messages: list[Message], node_id: str) -> dict | None:
    """What the session's action log (the Play node's ``executed`` text) says it ran with."""
    for m in messages:
        if m.kind == "executed" and str(m.data.get("node")) == node_id:
            log = json.loads(m.data["output"]["text"][0])
            return {k: log.get(k) for k in ("steps", "kv_dtype", "kv_window", "kv_sink", "chunks", "frames",
                                            "live_decoder")}
    return None


def session_record(messages: list[Message], session_id: str, queued: float, started: Message, posts: list[float],
                   end: Message, finish: Message) -> dict:
    """A session's figures from its messages (``posts``: the key POSTs, the first is the
    session's first key)."""
    frames = [m for m in messages if is_frames(session_id)(m)]
    if not frames:
        return {"reason": end.data.get("reason"), "result": finish.kind, "frames": 0}
    first_key = posts[0]
    lasts = [m for m in frames if m.data["last"]]
    count = sum(m.data["frames"] for m in frames)
    marks_client = [(m.at, m.data["first_frame"] + m.data["frames"]) for m in lasts]
    marks_server = [(m.data["sent_at"], m.data["first_frame"] + m.data["frames"]) for m in lasts]
    chunk_s = [m.data["chunk_s"] for m in lasts]
    server_k2f = [m.data["latency_s"] for m in frames if m.data["part"] == 0 and m.data["latency_s"] is not None]
    window = [m for m in messages if first_key <= m.at <= frames[-1].at]
    span = frames[-1].at - first_key
    steady_chunks = chunk_s[int(len(chunk_s) * 0.25):] or chunk_s
    fps_session = count / span
    fps_server = count / (frames[-1].data["sent_at"] - first_key)
    return {
        "reason": end.data.get("reason"), "result": finish.kind, "chunks": len(lasts), "frames": count,
        "run_to_started_s": started.at - queued, "run_to_first_frame_s": frames[0].at - queued,
        "client_first_frame_s": frames[0].at - first_key,
        "client_fps_session": fps_session, "client_fps_steady": steady_fps(marks_client, STEADY_LEAST),
        "client_key_to_frame_s": summary(key_to_frame(frames, posts)),
        "first_chunk_s": chunk_s[0], "chunk_s": summary(chunk_s),
        "first_chunk_over_steady": chunk_s[0] / statistics.median(steady_chunks),
        "socket_bytes": sum(m.nbytes for m in window), "socket_bytes_per_s": sum(m.nbytes for m in window) / span,
        "frame_message_bytes": sum(m.nbytes for m in frames),
        "transit_s": summary([m.at - m.data["sent_at"] for m in frames]),
        "server": {"fps_session": fps_server, "fps_steady": steady_fps(marks_server, STEADY_LEAST),
                   "key_to_frame_s": summary(server_k2f), "first_frame_s": frames[0].data["sent_at"] - first_key},
        "client_over_server_fps": fps_session / fps_server,
        "prompt_s": finish.at - queued,
    }


# --------------------------------------------------------------------------- the run

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--package", required=True, help="a package folder holding LingBot-World Fast (any layout)")
    p.add_argument("--fast-folder", default="lingbot_world_fast",
                   help="the start of the Fast transformer's folder name in the package (the first the Fast DiT "
                        "Loader lists: lingbot_world_fast, ..._bnb_nf4, ..._fp8)")
    p.add_argument("--comfy", help="ComfyUI's sources (default: the tests' host copy)")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="where the server computes")
    p.add_argument("--size", default="480x832")
    p.add_argument("--image", help="the start image (default: seeded noise)")
    p.add_argument("--sessions", default="continuous,turn",
                   help="comma list of continuous / turn, one queued prompt each, in one server (the first: cold)")
    p.add_argument("--seconds", type=float, default=60.0, help="continuous: seconds of video (60: 80 chunks)")
    p.add_argument("--presses", type=int, default=20, help="turn: key presses, one chunk each")
    p.add_argument("--change-s", type=float, default=1.3, help="continuous: seconds between key changes")
    p.add_argument("--fps", type=int, default=16)
    p.add_argument("--steps", type=int, default=DEFAULT_FAST_STEPS, choices=FAST_STEPS)
    p.add_argument("--kv-window", type=int, default=9)
    p.add_argument("--kv-sink", type=int, default=3)
    p.add_argument("--kv-dtype", default="auto", choices=("auto", *KV_DTYPES))
    p.add_argument("--vae-precision", default="bf16", choices=VAE_PRECISIONS)
    loader = p.add_argument_group("the Fast DiT Loader's inputs (default: the template's)")
    loader.add_argument("--weights", help="as stored, fp8, int8, nf4, bf16, auto")
    loader.add_argument("--bf16-quantize", help="none or nf4 (a bf16 folder quantized on load)")
    loader.add_argument("--block-swap", type=int, help="blocks kept on the GPU (0: all)")
    loader.add_argument("--devices", help="single, sequence_parallel, decode_on_second_gpu, auto")
    loader.add_argument("--attention", help="auto or a backend of wan/runtime/attention.py")
    p.add_argument("--live-decoder", action="store_true",
                   help="Play's live_decoder: core's Load VAE with a tiny video VAE (random weights)")
    p.add_argument("--vram-cap-gb", type=float, default=None, help="the server as on a card of this size")
    p.add_argument("--server-args", default="", help="more arguments for ComfyUI's main.py, as one string "
                   "(\"--disable-cuda-malloc\": PyTorch's own allocator, under which Play captures CUDA graphs)")
    p.add_argument("--no-page-cache", action="store_true", help="do not read the package before the start")
    p.add_argument("--idle-timeout", type=int, default=600)
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--session-timeout", type=float, default=900.0)
    args = p.parse_args(argv)
    sessions = [s.strip() for s in args.sessions.split(",") if s.strip()]
    if not sessions or set(sessions) - {"continuous", "turn"}:
        p.error(f"--sessions: {args.sessions!r}; give continuous and/or turn")
    package = Path(args.package)
    if not package.is_dir():
        p.error(f"--package: {package} is not a folder")
    gpus = gpu_names() if args.device == "cuda" else []
    record: dict = {
        "gpu": gpus[0] if gpus else "cpu", "ranks": len(gpus) if args.devices == "sequence_parallel" else 1,
        "steps": args.steps, "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv), "package": str(package),
        "size": args.size, "seconds": args.seconds, "presses": args.presses, "fps_video": args.fps,
        "kv_window": args.kv_window, "kv_sink": args.kv_sink, "kv_dtype": args.kv_dtype,
        "vae_precision": args.vae_precision, "weights": args.weights, "bf16_quantize": args.bf16_quantize,
        "block_swap": args.block_swap, "devices": args.devices, "attention": args.attention,
        "live_decoder": args.live_decoder, "cap_gb": args.vram_cap_gb, "server_args": args.server_args,
        "env": {k: v for k, v in os.environ.items() if k.startswith("LINGBOT_")}, "sessions": [],
    }
    if not args.no_page_cache:
        record.update(read_package(package))
    base = Path(tempfile.mkdtemp(prefix="lingbot-play-client-"))
    try:
        server = server_for(args, base)
        begun = time.perf_counter()
        with server, GpuMemory() as memory:
            record["server_start_s"] = time.perf_counter() - begun
            object_info = server.object_info()
            socket = TimedSocket(f"ws://127.0.0.1:{server.port}/ws", uuid.uuid4().hex).start()
            try:
                for take, mode in enumerate(sessions):
                    budget = args.presses if mode == "turn" else session_chunks(args.seconds, args.fps)
                    prompt = play_prompt(object_info, args, mode, budget, take)
                    session = run_session(server, socket, prompt, mode, args)
                    record["sessions"].append(session)
                    print(json.dumps({k: session.get(k) for k in ("mode", "chunks", "client_fps_session",
                                                                  "client_fps_steady", "first_chunk_s",
                                                                  "run_to_first_frame_s")}, default=str), flush=True)
                    write(record, args.out)  # after every session: a timeout keeps the others
            finally:
                socket.close()
                # What the server said of its device (its allocator) and of each session (the
                # transformer's and the decode's time a chunk, its CUDA graphs or why none).
                record["server_log"] = [line for line in server.log_text().splitlines()
                                        if line.startswith(("LingBot", "Device:"))][-60:]
            record["gpu_used_peak_mib"] = memory.peak_mib
    finally:
        shutil.rmtree(base, ignore_errors=True)
    record.update(headline(record["sessions"]))
    write(record, args.out)
    print(json.dumps({k: record.get(k) for k in ("gpu", "steps", "cold_start_s", "client_fps_session",
                                                 "client_fps_steady", "client_key_to_frame_s")}, default=str))
    return 0


def headline(sessions: list[dict]) -> dict:
    """The record's main figures: the cold start (the first session), the first continuous
    session's rates and the first turn session's key → frame, each with its in-process twin."""
    cont = next((s for s in sessions if s["mode"] == "continuous" and s["frames"]), None)
    turn = next((s for s in sessions if s["mode"] == "turn" and s["frames"]), None)
    out = {"cold_start_s": sessions[0].get("run_to_first_frame_s") if sessions else None}
    if cont is not None:
        out.update({k: cont[k] for k in ("client_fps_session", "client_fps_steady", "first_chunk_s",
                                         "socket_bytes_per_s")})
        out["in_process_fps_session"], out["in_process_fps_steady"] = (cont["server"]["fps_session"],
                                                                       cont["server"]["fps_steady"])
    if turn is not None:
        out["client_key_to_frame_s"] = {k: turn["client_key_to_frame_s"][k] for k in ("median", "p90")}
        out["in_process_key_to_frame_s"] = {k: turn["server"]["key_to_frame_s"][k] for k in ("median", "p90")}
    return out


def write(record: dict, out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(record, indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
