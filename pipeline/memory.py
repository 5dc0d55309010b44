"""Memory: every estimate the pack makes (one owner), and giving memory back now.

Estimates: the working room of the text encoder and the one-pass VAE stages
(``TEXT_WORKSPACE``, ``VAE_WORKSPACE``), a transformer's activations per token
(``activation_bytes``), a Fast run beside its transformer (``fast_run_bytes``: KV cache +
a chunk's activations; ``camera_terms_bytes``: a block's kept camera terms; ``graph_pool_bytes``:
the CUDA graphs' pool), the VAE streams of Fast Long Video and Play (``vae_stream_bytes``,
one budget for both), what fits a card (``fits``, ``plan_fast_memory``), and the host's
room (``host_room_bytes``, ``vae_workspace_bytes``, ``check_video_fits``). ``nodes/host/``
only asks ComfyUI for the room these name.

Giving back: VRAM to the driver and freed heap pages to the OS."""
from __future__ import annotations

import ctypes
import gc
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence, TypeVar

import torch
from torch import nn

from ..wan.config import DiTConfig
from ..wan.runtime.attention import attends_kept_operands
from ..wan.runtime.camera_terms import CameraTerms
from ..wan.runtime.kv_cache import KV_DTYPES, CachePolicy, KVCache

T = TypeVar("T")

GIB = 1 << 30
# Working memory beside the weights of a stage that loads its own model (T5, the one-pass
# VAE Encode / Decode); generous so a 480x832x81 clip does not run short.
TEXT_WORKSPACE = 1 * GIB
VAE_WORKSPACE = 6 * GIB
# Activation bytes per token and model feature while a transformer runs (hidden state in
# fp32, q/k/v/o and the FFN hidden layer in bf16): what ComfyUI should keep free beside it.
ACTIVATION_BYTES_PER_TOKEN_FEATURE = 24
KV_DTYPE_BYTES = 2  # the Fast cache's compute dtype (bf16) per value; int8 entries are counted by the policy
# kv_dtype "auto" (and every "fits" below) keeps a choice while the weights, the run's memory
# and ComfyUI's own reserve take at most this share of the device (the rest: fragmentation
# and other libraries).
AUTO_FIT_SHARE = 0.95
# Beside that share, room for what PyTorch's caching allocator holds reserved but
# unallocated in a Fast run near the card's size: the plan of the NF4 run that ran out of
# memory under a 16 GiB cap said 14.8 GiB, and 1.54 GiB sat reserved-unallocated at the failure
# (bench/results/2026-11-27_h200_fast_81_auto_cap16_oom.json). Every Fast memory plan keeps it
# free (with the 5 % above: 1.8 GiB on a 16 GiB card); the bf16 clip measured at 20.8 GiB
# under a 24 GiB cap still fits.
ALLOCATOR_SLACK = 1 << 30
# The VAE streams' carried state at 480x832 in float32 (docs/fast_engine.md#memory-of-the-vae-streams,
# computed from the layer shapes): the encoder's until the image condition is constant, the
# decoder's for the whole run. It scales with the frame's pixels; bf16 halves it.
_ENCODER_STATE_BYTES_480P = 2.24e9
_DECODER_STATE_BYTES_480P = 3.78e9
_STREAM_STATE_BYTES_480P = _ENCODER_STATE_BYTES_480P + _DECODER_STATE_BYTES_480P
_PIXELS_480P = 480 * 832
# Play's live decoder, ComfyUI's tiny video VAE (nodes/host/tiny_vae.py, bf16 on a GPU) at
# 480x832: its 45 MB of weights and carried memory blocks (kept), and one latent frame's
# decode (working memory). One chunk's stream decode in bf16 peaked 0.48 GB above the
# process on the CPU, 0.16 GB of it kept; the budget leaves room for cuDNN's workspaces.
_TINY_KEPT_BYTES_480P = 0.25 * GIB
_TINY_DECODE_BYTES_480P = 0.5 * GIB
# Fitted to a Fast run measured on an H100 (bench/memory_fit.py, 2026-12-06, 480x832, window 9,
# fp8 weights, CUDA graphs; bench/RESULTS.md): at its peak a run holds beside its cache and kept
# camera terms one chunk's activations, plus this share of them for the graphs' pool (a graphed
# pass allocates there, not in the eager cache: the int8 run peaked 0.27 GiB above its cache),
# plus, where a bf16 cache keeps fp8 operands, this share of those (its peak without kept terms
# sat 2.3 GiB higher than the int8 run's). With them every run measured is within 9 % of its
# estimate (tests/gpu/test_memory_plan_cuda.py holds 10 %).
GRAPH_POOL_SHARE = 0.25
KEPT_OPERANDS_PASS_SHARE = 0.25


def activation_bytes(tokens: int, dim: int) -> int:
    """Working memory to keep free while a transformer of width ``dim`` runs on ``tokens`` tokens."""
    return int(tokens) * int(dim) * ACTIVATION_BYTES_PER_TOKEN_FEATURE


def lora_device_bytes(files: Sequence[Path]) -> int:
    """Device memory LoRA adapters (their ``files``) take while an expert carries them
    (their tensors move as stored), plus room for one dense weight + delta of the largest
    A14B linear (13824 x 5120 bf16), which ``dense()`` builds per sub-layer."""
    largest_linear = 13824 * 5120 * 2
    return sum(Path(f).stat().st_size for f in files) + (largest_linear if files else 0)


def vae_stream_bytes(height: int, width: int, precision: str = "fp32", decoder: bool = True) -> int:
    """Memory the VAE's stream encoder and decoder states take beside the VAE's weights
    (Fast Long Video and Play: one budget); ``decoder`` False: the encoder's alone (another
    decoder decodes the chunks)."""
    scale = height * width / _PIXELS_480P * (0.5 if precision == "bf16" else 1.0)
    return int((_STREAM_STATE_BYTES_480P if decoder else _ENCODER_STATE_BYTES_480P) * scale)


def vae_stream_budget(weights_bytes: int, height: int, width: int, precision: str = "fp32",
                      live_decoder: bool = False) -> int:
    """The VAE of a stream on the device: its weights and its streams' states; with Play's
    ``live_decoder`` (the tiny video VAE decodes the chunks), the Wan VAE's encoder state
    and what the tiny decoder keeps."""
    if live_decoder:
        tiny = int(_TINY_KEPT_BYTES_480P * height * width / _PIXELS_480P)
        return int(weights_bytes) + vae_stream_bytes(height, width, precision, decoder=False) + tiny
    return int(weights_bytes) + vae_stream_bytes(height, width, precision)


def vae_budgets(weights_bytes: int, height: int, width: int, precision: str = "fp32",
                live_decoder: bool = False) -> tuple[int, int]:
    """The VAE of a Fast stream (Fast Long Video, Play): its weights and streams on the
    device (``vae_stream_budget``) and one chunk's decode (``decode_chunk_bytes``), or the
    tiny decoder's with Play's ``live_decoder``."""
    decode = (int(_TINY_DECODE_BYTES_480P * height * width / _PIXELS_480P) if live_decoder
              else decode_chunk_bytes(height, width, precision))
    return vae_stream_budget(weights_bytes, height, width, precision, live_decoder), decode


def fast_run_bytes(config: DiTConfig, policy: CachePolicy, latent_height: int, latent_width: int, latent_frames: int | None,
                   extra: int = 0, attention: str | None = None) -> int:
    """Working memory a Fast run needs beside its transformer (``config``: a ``DiTConfig``):
    the policy's KV cache (text keys and values included) and one chunk's activations,
    plus ``extra`` bytes (e.g. ``vae_stream_budget``). ``attention``: the run's kernel
    choice; with ``flash_fp8`` a bf16 cache also keeps its fp8 operands."""
    _, ph, pw = config.patch_size
    frame_tokens = (latent_height // ph) * (latent_width // pw)
    def cache_bytes(fp8_operands: bool) -> int:
        return KVCache.estimate_bytes(policy, layers=config.num_layers, heads=config.num_heads,
                                      head_dim=config.head_dim, frame_tokens=frame_tokens, dtype_bytes=KV_DTYPE_BYTES,
                                      latent_frames=latent_frames, text_tokens=config.text_len,
                                      fp8_operands=fp8_operands)

    cache = cache_bytes(attends_kept_operands(attention))
    operands = cache - cache_bytes(False)  # the kept fp8 operands (0: none kept)
    return (cache + int(KEPT_OPERANDS_PASS_SHARE * operands) + activation_bytes(policy.chunk * frame_tokens, config.dim)
            + int(extra))


def camera_terms_bytes(config: DiTConfig, latent_height: int, latent_width: int, chunk: int, ranks: int = 1) -> int:
    """What keeping one block's camera terms for a Fast chunk takes on each of ``ranks``
    GPUs (a sequence-parallel run keeps its token shard's): ``wan.runtime.camera_terms.CameraTerms``."""
    _, ph, pw = config.patch_size
    tokens = chunk * (latent_height // ph) * (latent_width // pw)
    return CameraTerms.estimate_bytes(-(-tokens // max(int(ranks), 1)), config.dim, 1)


def graph_pool_bytes(config: DiTConfig, latent_height: int, latent_width: int, chunk: int, ranks: int = 1) -> int:
    """The CUDA graphs' memory pool of a Fast session on each GPU beyond a chunk's eager
    activations (``GRAPH_POOL_SHARE`` of them, measured)."""
    _, ph, pw = config.patch_size
    tokens = -(-chunk * (latent_height // ph) * (latent_width // pw) // max(int(ranks), 1))
    return int(GRAPH_POOL_SHARE * activation_bytes(tokens, config.dim))


# The weights' auto keeps this share of the card (at least WEIGHTS_RESERVE_MIN) free of the
# transformer's weights, for the activations, the VAE and the Fast KV cache (Fast at 480x832
# with the int8 cache needed about 7 GiB of working memory beside an NF4 transformer): a rule
# of thumb.
WEIGHTS_RESERVE_FRACTION = 0.25
WEIGHTS_RESERVE_MIN = 8 * GIB


def weights_budget(card_bytes: int) -> int:
    """What weights ``auto`` lets a transformer's weights take of a card of ``card_bytes``."""
    return int(card_bytes) - max(WEIGHTS_RESERVE_MIN, int(card_bytes * WEIGHTS_RESERVE_FRACTION))


def fits(need: int, total: int, slack: int = 0) -> bool:
    """Whether ``need`` bytes fit a device of ``total`` bytes (``AUTO_FIT_SHARE`` of it,
    less ``slack`` bytes kept free)."""
    return int(need) + int(slack) <= AUTO_FIT_SHARE * int(total)


def empty_device_cache() -> None:
    """Collect garbage, return cached CUDA blocks and cached pinned host memory (block
    swap's weights), and trim the C heap (glibc only)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        _empty_pinned_cache()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # musl or no glibc: nothing to trim
            pass


def _empty_pinned_cache() -> None:
    # PyTorch keeps freed pinned blocks for reuse; without this a released block-swapped
    # expert would keep holding its page-locked RAM.
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)  # torch >= 2.9
    if empty is None:
        empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()


def release_module(module: nn.Module | None) -> None:
    """Drop every tensor a module holds so its memory is freed even if the module lingers.

    A node output or a traceback may keep a reference to the module object; clearing its
    parameters and buffers makes sure the weights themselves go, and a module's
    ``release_state()`` what it keeps beside them (the Fast transformer's kept KV cache).
    """
    if module is None:
        return
    for sub in module.modules():
        release_state = getattr(sub, "release_state", None)
        if callable(release_state):
            release_state()
        for name in list(sub._parameters):
            sub._parameters[name] = None
        for name in list(sub._buffers):
            sub._buffers[name] = None
    empty_device_cache()


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def resolve_device(device: torch.device | str | None) -> torch.device:
    if device is None or str(device) == "auto":
        return default_device()
    return torch.device(device)


def build_or_release(build: Callable[[], T]) -> T:
    """``build()``; if it fails, the half-built model is freed before the error goes on.

    A loader that fails midway (a truncated shard, a CUDA OOM) holds the partly filled
    model in its local variables, and the traceback keeps those frames (and so the weights)
    alive for as long as the error is kept: by ComfyUI, until the next prompt. Clearing the
    frames below this one drops them now.
    """
    try:
        return build()
    except BaseException as exc:
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__.tb_next)
        empty_device_cache()
        raise


def total_ram_bytes() -> int | None:
    """Physical memory of this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        try:
            import psutil  # ComfyUI depends on it; Windows has no sysconf

            return int(psutil.virtual_memory().total)
        except Exception:  # noqa: BLE001
            return None


def host_room_bytes() -> tuple[int, str] | None:
    """What this process may still allocate on the host, and what sets it; None where the
    OS does not say.

    Physical RAM, lowered by what the OS enforces on this process: a cgroup memory limit
    (containers, systemd) less the group's current use, and the address-space and data
    limits (``ulimit -v`` / ``-d``) less the process's current size. Allocations beyond a
    limit fail inside the allocator, so the check below must know them.
    """
    found: list[tuple[int, str]] = []
    ram = total_ram_bytes()
    if ram is not None:
        found.append((ram, f"this machine's {ram / 2**30:.1f} GiB of RAM"))
    cgroup = _cgroup_room()
    if cgroup is not None:
        found.append((cgroup, f"the {cgroup / 2**30:.1f} GiB left under this process group's memory limit"))
    for name, room in _rlimit_rooms():
        found.append((room, f"the {room / 2**30:.1f} GiB left under its {name} limit"))
    return min(found) if found else None


CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
# (limit, usage, page-cache entry of memory.stat) in cgroup v2 and v1.
_CGROUP_FILES = {"v2": ("memory.max", "memory.current", "file"),
                 "v1": ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_cache")}


def _cgroup_folders() -> list[tuple[str, Path]]:
    """This process's memory cgroup folders (v2 and v1), where mounted; the mount's root as
    a fallback (inside a container the group is often mounted as the root)."""
    found = []
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, group = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            base, kind = CGROUP_ROOT, "v2"
        elif "memory" in controllers.split(","):
            base, kind = CGROUP_ROOT / "memory", "v1"
        else:
            continue
        for folder in (base / group.strip().lstrip("/"), base):
            if (folder / _CGROUP_FILES[kind][0]).is_file():
                found.append((kind, folder))
                break
    return found


def _cgroup_room() -> int | None:
    """The memory limit of this process's cgroup less what the group uses that cannot be
    reclaimed (its page cache, e.g. memory-mapped checkpoints, can); None without a limit."""
    rooms = []
    for kind, folder in _cgroup_folders():
        limit_file, usage_file, cache_key = _CGROUP_FILES[kind]
        try:
            limit = (folder / limit_file).read_text().strip()
            if limit == "max" or int(limit) >= 2**60:  # v1 writes "no limit" as a huge number
                continue
            stat = dict(line.split()[:2] for line in (folder / "memory.stat").read_text().splitlines() if line.strip())
            used = int((folder / usage_file).read_text()) - int(stat.get(cache_key, 0))
            rooms.append(max(int(limit) - used, 0))
        except (OSError, ValueError):
            continue
    return min(rooms) if rooms else None


def _rlimit_rooms() -> list[tuple[str, int]]:
    """(limit name, bytes left) for the address-space and data limits that are set."""
    try:
        import resource

        page = os.sysconf("SC_PAGE_SIZE")
        size, _, _, _, _, data, _ = (int(v) for v in Path("/proc/self/statm").read_text().split())
    except (ImportError, OSError, ValueError, AttributeError):
        return []
    rooms = []
    for name, limit, used in (("address-space (ulimit -v)", resource.RLIMIT_AS, size * page),
                              ("data (ulimit -d)", resource.RLIMIT_DATA, data * page)):
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY:
            rooms.append((name, max(soft - used, 0)))
    return rooms


# Host bytes per pixel of each frame held at once: float32 RGB frames. Encode holds the
# conditioning clip (12); decode the decoded video and the IMAGE batch made from it (24).
ENCODE_BYTES_PER_PIXEL = 3 * 4
DECODE_BYTES_PER_PIXEL = 2 * 3 * 4
_HOST_BYTES_PER_PIXEL = DECODE_BYTES_PER_PIXEL

# What the VAE itself takes on the host while it runs on the CPU, per pixel of the frame
# (or decode tile) it works on: its activations and convolution buffers for one chunk of
# frames. Measured (peak RSS, float32, chunks of 1+4 frames, 256x256 to 1024x1024) with VAEs
# of base width 8, 16 and 96 (Wan2.1's): about 2 KB plus 160 B (encode) or 210 B (decode)
# per unit of base width; Wan2.1's on the CPU takes ~7 GB (encode) or ~9 GB (decode) at
# 480x832. The real peak has an allocator's slack on top: 25 % is added.
_VAE_BYTES_PER_PIXEL = 2048
_VAE_BYTES_PER_PIXEL_PER_WIDTH = {"encode": 160, "decode": 210}


def vae_workspace_bytes(base_width: int, pixels: int, direction: str) -> int:
    """Host bytes a VAE of ``base_width`` (``VAEGeometry.dim``) running on the CPU takes
    for frames (or tiles) of ``pixels`` pixels; ``direction`` is "encode" or "decode"."""
    per_pixel = _VAE_BYTES_PER_PIXEL + _VAE_BYTES_PER_PIXEL_PER_WIDTH[direction] * int(base_width)
    return int(1.25 * per_pixel * int(pixels))


def check_video_fits(frames: int, height: int, width: int, ram_bytes: int | None = None,
                     bytes_per_pixel: int = _HOST_BYTES_PER_PIXEL, workspace_bytes: int = 0,
                     workspace_hint: str = "") -> None:
    """Refuse, before anything is allocated, a video that cannot fit in what this process
    may allocate on the host (``host_room_bytes``, or ``ram_bytes`` when given).

    The need is the frames held at once (``bytes_per_pixel`` per pixel of every frame) plus
    ``workspace_bytes`` (the VAE's own on the CPU: ``vae_workspace_bytes``). 4096x4096 at
    1601 frames would otherwise try to allocate over 160 GB and take the process down, and
    2048x2048x81 with the VAE on the CPU failed in the allocator after a 7 GB peak; the
    message gives the size, the need and what to change.
    """
    room = host_room_bytes() if ram_bytes is None else (ram_bytes, f"this machine's {ram_bytes / 2**30:.1f} GiB of RAM")
    frames_bytes = int(bytes_per_pixel) * int(frames) * int(height) * int(width)
    need = frames_bytes + int(workspace_bytes)
    if room is not None and need > room[0]:
        parts = (f" ({frames_bytes / 2**30:.1f} GiB for the frames, {workspace_bytes / 2**30:.1f} GiB for the VAE "
                 f"working on the CPU)") if workspace_bytes else " for its frames alone"
        raise ValueError(
            f"width x height x frames = {width}x{height}x{frames} needs about {need / 2**30:.1f} GiB of RAM{parts}, "
            f"more than {room[1]}; reduce width, height or frames{workspace_hint}"
        )


# --------------------------------------------------------------------------- a Fast run on a card

# Blocks of the transformer's weights in flight while blocks stream from pinned RAM
# (wan/runtime/block_swap.py: the swapped block computing and the next one arriving).
SWAP_BLOCKS_IN_FLIGHT = 2
MIN_BLOCKS_ON_GPU = 1
# The share of blocks that may be swapped while their copies still hide behind the other
# blocks' compute (block swap spreads them: wan/runtime/block_swap.py). At half, every
# second block is swapped and its copy has two blocks' compute to arrive in: an fp8 A14B
# block (0.46 GB) took 8.7 ms from pinned RAM on an H100 (52 GB/s) against ~5.5 ms of
# compute per block and pass in a Fast chunk. A block's kept camera terms (0.09 GiB at
# 480x832) save ~4 ms a chunk, so under block swap the plan swaps up to this share to keep
# them: measured under a 24 GiB cap on an H100, 31 blocks on the GPU with terms of 4 ran a
# chunk in 1.311 s, 21 blocks with terms of all 40 in 1.200 s (bench/RESULTS.md).
SWAP_HIDDEN_SHARE = 0.5
# A chunk's VAE decode working memory at 480x832 (activations of the stream decoder's
# chunk, beside its carried state): what the overlap adds beside the next chunk's generation.
_DECODE_BYTES_480P = 1.5 * GIB


def decode_chunk_bytes(height: int, width: int, precision: str = "fp32") -> int:
    """Working memory of one chunk's stream decode (the overlap holds it beside a generation)."""
    return int(_DECODE_BYTES_480P * height * width / _PIXELS_480P * (0.5 if precision == "bf16" else 1.0))


@dataclass(frozen=True)
class FastMemoryPlan:
    """What a Fast run keeps where on a card (``plan_fast_memory``)."""

    kv_dtype: str  # "bf16" | "int8"
    blocks_on_gpu: int | None  # None: every block on the GPU; else the others stream from pinned RAM
    vae_on_gpu: bool  # False: the VAE and its streams on the CPU
    overlap: bool  # chunk n decoded beside chunk n+1's generation
    need: int  # the estimate on the card, bytes
    fits: bool  # False: even the smallest plan exceeds the card (it is still the best try)
    camera_terms: int = 0  # blocks whose camera scale/shift are kept for the chunk's forwards
    cuda_graphs: bool = False  # the chunk's passes captured and replayed (FastParams.cuda_graphs)

    def describe(self) -> str:
        blocks = "all blocks" if self.blocks_on_gpu is None else f"{self.blocks_on_gpu} blocks"
        terms = f", camera terms of {self.camera_terms} blocks kept per chunk" if self.camera_terms else ""
        graphs = ", CUDA graphs" if self.cuda_graphs else ""
        return (f"{self.kv_dtype} cache, {blocks} on the GPU, VAE on the {'GPU' if self.vae_on_gpu else 'CPU'}, "
                f"decode {'overlapped' if self.overlap else 'sequential'}{terms}{graphs}, ~{self.need / GIB:.1f} GiB")


def plan_fast_memory(card_bytes: int, transformer_bytes: int, blocks: int, run_bytes: Mapping[str, int],
                     vae_bytes: int = 0, decode_bytes: int = 0, reserve_bytes: int = 0,
                     kv_dtype: str | None = None, terms_bytes: int = 0, graph_bytes: int = 0) -> FastMemoryPlan:
    """The Fast nodes' ``auto`` memory settings for a card of ``card_bytes`` (one function:
    the kv_dtype, block swap, where the VAE runs, and the decode overlap). Its kv_dtype is the
    one rule of kv_dtype ``auto``: the Fast nodes (``nodes/host/fast_model.py``) and the
    bench's ``--memory auto`` (``bench/memory_plan.py``) take it from here.

    ``transformer_bytes``: the Fast transformer with every block on the GPU (``blocks``
    blocks); ``run_bytes``: ``fast_run_bytes`` per cache dtype ("bf16", "int8");
    ``vae_bytes``: the VAE's weights and stream states on the GPU (0: none, a clip);
    ``decode_bytes``: one chunk's decode working memory (``decode_chunk_bytes``);
    ``reserve_bytes``: what the host keeps (ComfyUI's minimum inference memory);
    ``kv_dtype``: the user's choice (None: auto). Cheapest first, each step taken only
    while the run does not fit (``fits``): the bf16 cache, then int8; all blocks on the GPU,
    then the fewest blocks off it that fit (at least ``MIN_BLOCKS_ON_GPU`` kept); the VAE
    on the GPU, then on the CPU. The decode overlaps the next chunk when its working memory
    also fits (a VAE on the CPU: always, its memory is the host's). Last, the camera terms of
    as many blocks as fit beside the rest are kept per chunk (``terms_bytes``: one block's,
    ``camera_terms_bytes``; 0: not offered; under block swap more blocks are swapped for
    them, up to ``SWAP_HIDDEN_SHARE`` of the blocks), after the CUDA graphs' memory pool when it fits
    (``graph_bytes``: ``graph_pool_bytes``; 0: not offered; only with every block on the
    GPU: a swapped block's weights arrive at new addresses every pass). Each fit keeps
    ``ALLOCATOR_SLACK`` free."""
    per_block = transformer_bytes / max(int(blocks), 1)
    dtypes = [kv_dtype] if kv_dtype is not None else list(KV_DTYPES)

    def need(dtype: str, on_gpu: int | None, vae_gpu: bool) -> int:
        off_gpu = 0 if on_gpu is None else max(blocks - on_gpu - SWAP_BLOCKS_IN_FLIGHT, 0)
        weights = transformer_bytes - off_gpu * per_block
        return int(weights + run_bytes[dtype] + (vae_bytes if vae_gpu else 0) + reserve_bytes)

    def plan(dtype: str, on_gpu: int | None, vae_gpu: bool) -> FastMemoryPlan | None:
        base = need(dtype, on_gpu, vae_gpu)
        if not fits(base, card_bytes, ALLOCATOR_SLACK):
            return None
        overlap = not vae_gpu or fits(base + decode_bytes, card_bytes, ALLOCATOR_SLACK)
        total = base + (decode_bytes if overlap and vae_gpu else 0)
        graphs = graph_bytes > 0 and on_gpu is None and fits(total + graph_bytes, card_bytes, ALLOCATOR_SLACK)
        total += int(graph_bytes) if graphs else 0
        room = AUTO_FIT_SHARE * card_bytes - ALLOCATOR_SLACK - total
        terms = 0 if terms_bytes <= 0 else min(int(room // terms_bytes), int(blocks))
        return FastMemoryPlan(dtype, on_gpu, vae_gpu, overlap, total + terms * int(terms_bytes), True, terms, graphs)

    def traded(found: FastMemoryPlan) -> FastMemoryPlan:
        # Under block swap, blocks' camera terms are worth more than blocks kept on the GPU
        # while the swapped blocks' copies hide (``SWAP_HIDDEN_SHARE``): swap more blocks,
        # up to that share, while it keeps more terms.
        if found.blocks_on_gpu is None or terms_bytes <= 0:
            return found
        best = found
        least = max(blocks - int(SWAP_HIDDEN_SHARE * blocks), MIN_BLOCKS_ON_GPU)
        for on_gpu in range(found.blocks_on_gpu - 1, least - 1, -1):
            if best.camera_terms >= blocks:
                break
            other = plan(found.kv_dtype, on_gpu, found.vae_on_gpu)
            if other is not None and other.camera_terms > best.camera_terms:
                best = other
        return best

    swaps = range(max(blocks - SWAP_BLOCKS_IN_FLIGHT - 1, MIN_BLOCKS_ON_GPU), MIN_BLOCKS_ON_GPU - 1, -1)
    steps = [(dtype, None) for dtype in dtypes] + [(dtypes[-1], on_gpu) for on_gpu in swaps]
    for vae_gpu in (True, False) if vae_bytes else (True,):
        for dtype, on_gpu in steps:
            found = plan(dtype, on_gpu, vae_gpu)
            if found is not None:
                return traded(found)
    dtype = dtypes[-1]
    return FastMemoryPlan(dtype, MIN_BLOCKS_ON_GPU, not vae_bytes, False, need(dtype, MIN_BLOCKS_ON_GPU, False), False)
