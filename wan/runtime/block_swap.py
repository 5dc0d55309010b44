"""Block swap: keep K transformer blocks on the GPU, stream the others from pinned RAM.

An NF4 A14B expert is ~8.9 GiB, ~0.21 GiB of it in each of its 40 blocks' linear weights.
With block swap only K blocks keep those weights on the GPU; the weights of the other
blocks live in page-locked (pinned) host memory and are copied to the GPU on a side CUDA
stream while earlier blocks compute.

Which blocks are swapped (``swapped_blocks``): spread evenly over the stack, not the last
N-K. A swapped block's copy starts when the swapped block before it starts computing, so it
hides behind every block between the two. In the exact path a block computes many times
longer than its copy takes and either order hides; a Fast chunk's block computes in less time
than an fp8 block's copy over PCIe takes, so swapped blocks in a row would wait for their
copies, and spread ones (every second block or sparser) do not (bench/RESULTS.md).
``LINGBOT_SWAP_SPREAD=0`` swaps the last N-K blocks instead (to compare).

What moves is only the big part of a block: the ``weight`` of every linear-like layer
(``nn.Linear`` and subclasses such as bitsandbytes' ``Linear4bit``, whose weight is the
packed uint8 tensor). Biases, norms, modulation and 4-bit quant states (absmax, code) stay
on the GPU. A weight is swapped by assigning its parameter's ``.data``, so the Parameter
objects (and the quant state a 4-bit one carries) stay the same.

At most two swapped blocks hold GPU copies at any time: the one computing and the next one
arriving. GPU copies are allocated on the compute stream, and the side stream waits for the
compute stream before it writes into them, so memory the compute stream just freed is never
overwritten early; the compute stream waits on an event before it uses a copy. Dropping a
copy is therefore safe as soon as its block's kernels are queued.

Pinned memory comes from PyTorch's host allocator, which rounds every allocation up to a
power of two; weights are therefore packed into a few large allocations whose sizes waste
little (see ``plan_slabs``). For A14B NF4, one allocation per tensor would take ~47 %
more pinned RAM than the weights need, one per block ~18 % more.

Pure PyTorch: nothing here imports bitsandbytes.
"""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import torch
from torch import nn

from . import switches

log = logging.getLogger(__name__)

# Host tensors start on this byte boundary inside a slab (vectorized copies and kernels
# want aligned starts; 256 covers every dtype and the GPU allocator's own granularity).
HOST_ALIGNMENT = 256
# A slab holds at most this many blocks: the planner's search stays tiny.
MAX_BLOCKS_PER_SLAB = 16

TensorSpec = tuple[Sequence[int], torch.dtype]


# --------------------------------------------------------------------------- which weights

def swappable_weights(block: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, layer) of every linear-like layer of ``block`` with a weight, in module order."""
    return [(name, m) for name, m in block.named_modules()
            if isinstance(m, nn.Linear) and m._parameters.get("weight") is not None]


def _blocks_of(model: nn.Module) -> nn.ModuleList:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise TypeError(f"{type(model).__name__} has no 'blocks' ModuleList; block swap needs a transformer stack")
    return blocks


def swapped_blocks(resident: int, num_layers: int) -> list[int]:
    """The blocks block swap keeps off the device when ``resident`` of ``num_layers`` stay,
    ascending: spread evenly, the j-th at floor((j + 1) * N / S) - 1 for S swapped blocks.
    The last block is always swapped; while at most half are, a swapped block follows at
    least one that stays, so its copy (started with the forward or with the previous
    swapped block) overlaps that block's compute."""
    resident = min(max(int(resident), 0), int(num_layers))
    count = num_layers - resident
    if count <= 0:
        return []
    if not switches.SWAP_SPREAD():  # the last N-K blocks instead (to compare)
        return list(range(resident, num_layers))
    return [(j + 1) * num_layers // count - 1 for j in range(count)]


def swapped_weight_keys(model: nn.Module, resident: int) -> list[list[str]]:
    """State-dict keys of the weights that block swap keeps in host memory, one list per
    swapped block (``swapped_blocks``). Works on a model built on the meta device."""
    blocks = _blocks_of(model)
    return [[f"blocks.{index}.{name}.weight" for name, _ in swappable_weights(blocks[index])]
            for index in swapped_blocks(resident, len(blocks))]


def resident_blocks(blocks_on_gpu: int | None, num_layers: int, device: torch.device | str) -> int | None:
    """How many blocks stay on ``device`` for a loader's ``blocks_on_gpu`` argument.

    None means "no block swap" (everything on the device): ``blocks_on_gpu`` is None or at
    least ``num_layers``, or the device is not CUDA (block swap only pays off, and only
    works, with a GPU and pinned host memory; a warning says it was ignored). Messages name
    the DiT Loader's widget (``block_swap``), the number users set.
    """
    if blocks_on_gpu is None:
        return None
    if isinstance(blocks_on_gpu, bool) or not isinstance(blocks_on_gpu, int) or blocks_on_gpu < 0:
        raise ValueError(f"block_swap={blocks_on_gpu!r}: expected the number of blocks to keep on the GPU (0 or more)")
    if blocks_on_gpu >= num_layers:
        return None
    device = torch.device(device)
    if device.type != "cuda":
        log.warning("LingBot: block_swap=%d ignored: block swap needs a CUDA device, the expert loads on %s",
                    blocks_on_gpu, device)
        return None
    return blocks_on_gpu


# --------------------------------------------------------------------------- host memory

def _pow2_ceil(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else n


def _aligned(n: int) -> int:
    return -(-n // HOST_ALIGNMENT) * HOST_ALIGNMENT


def plan_slabs(sizes: Sequence[int], max_group: int = MAX_BLOCKS_PER_SLAB) -> list[range]:
    """Split consecutive blocks (``sizes`` in bytes) into groups, one allocation each, so
    that the total of the groups' sizes rounded up to powers of two is the least.

    PyTorch's pinned allocator rounds each allocation up to a power of two; a lone A14B NF4
    block (217.5 MiB) would take 256 MiB, nine of them share 2 GiB with 4 % unused.
    """
    count = len(sizes)
    best = [0] + [None] * count  # best[i]: least rounded total for blocks [0, i)
    start_of = [0] * (count + 1)
    for end in range(1, count + 1):
        total = 0
        for start in range(end - 1, max(end - 1 - max_group, -1), -1):
            total += sizes[start]
            cost = best[start] + _pow2_ceil(total)
            if best[end] is None or cost < best[end]:
                best[end], start_of[end] = cost, start
    groups = []
    end = count
    while end > 0:
        groups.append(range(start_of[end], end))
        end = start_of[end]
    return groups[::-1]


def allocate_host_tensors(specs: Sequence[Sequence[TensorSpec]], pin: bool = True) -> list[list[torch.Tensor]]:
    """Uninitialized CPU tensors of the given (shape, dtype), one list per block.

    The tensors of consecutive blocks are views into a few large (pinned, when ``pin``)
    byte buffers; each starts on a HOST_ALIGNMENT boundary.
    """
    def nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
        return _aligned(int(torch.Size(shape).numel()) * dtype.itemsize)

    block_sizes = [sum(nbytes(*spec) for spec in block) for block in specs]
    out: list[list[torch.Tensor]] = [[] for _ in specs]
    for group in plan_slabs(block_sizes):
        total = sum(block_sizes[i] for i in group)
        slab = torch.empty(total, dtype=torch.uint8, pin_memory=pin)
        offset = 0
        for index in group:
            for shape, dtype in specs[index]:
                size = int(torch.Size(shape).numel()) * dtype.itemsize
                out[index].append(slab[offset:offset + size].view(dtype).view(tuple(shape)))
                offset += _aligned(size)
    return out


def host_weights_for(model: nn.Module, resident: int, spec: Callable[[str], TensorSpec],
                     pin: bool = True) -> dict[str, torch.Tensor]:
    """Empty host tensors for every weight block swap keeps off the GPU, by state-dict key.

    ``spec(key)`` gives the (shape, dtype) the weight will have (for a 4-bit layer, that of
    its packed storage). A loader fills these from the checkpoint instead of the GPU.
    """
    keys = swapped_weight_keys(model, resident)
    tensors = allocate_host_tensors([[spec(key) for key in block] for block in keys], pin=pin)
    return {key: tensor for block_keys, block in zip(keys, tensors) for key, tensor in zip(block_keys, block)}


# --------------------------------------------------------------------------- transfers

class Transfer(Protocol):
    """How host weights reach the compute device."""

    pins_host: bool  # whether host weights must be in pinned memory

    def fetch(self, hosts: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], Any]:
        """Start copying ``hosts`` to the device; returns the device tensors and a token
        for ``wait``. Called on the compute stream; the copies may still be in flight."""

    def wait(self, token: Any) -> None:
        """Make work queued after this call (on the compute stream) see the copies."""


class CudaStreamTransfer:
    """Copies on a side CUDA stream, overlapping the compute stream's work."""

    pins_host = True

    def __init__(self, device: torch.device | str) -> None:
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"CudaStreamTransfer needs a CUDA device, got {device}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def fetch(self, hosts: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], torch.cuda.Event]:
        compute = torch.cuda.current_stream(self.device)
        # Plain (not inference-mode) tensors: they become parameters' data for a while.
        with torch.inference_mode(False), torch.no_grad():
            # Allocated on the compute stream, so freeing them later needs no stream sync;
            # the side stream waits for the compute stream because these bytes may be
            # ones the compute stream has just freed and is still reading.
            copies = [torch.empty(h.shape, dtype=h.dtype, device=self.device) for h in hosts]
            self.stream.wait_stream(compute)
            with torch.cuda.stream(self.stream):
                for copy, host in zip(copies, hosts):
                    copy.copy_(host, non_blocking=True)
                done = torch.cuda.Event()
                done.record(self.stream)
        return copies, done

    def wait(self, token: torch.cuda.Event) -> None:
        torch.cuda.current_stream(self.device).wait_event(token)


class SyncTransfer:
    """Copies on the calling thread, with no overlap: the same contract without streams
    (tests, and a reference when debugging the CUDA path)."""

    pins_host = False

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)

    def fetch(self, hosts: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], None]:
        with torch.inference_mode(False), torch.no_grad():
            return [host.to(self.device, copy=True) for host in hosts], None

    def wait(self, token: None) -> None:
        pass


# --------------------------------------------------------------------------- the swapper

@dataclass
class _OnDevice:
    """A swapped block whose weights have device copies (arriving or installed)."""

    params: list[nn.Parameter]
    hosts: list[torch.Tensor]
    copies: list[torch.Tensor]
    ready: Any
    installed: bool = False


class BlockSwapper:
    """Run a model with all but ``resident`` blocks' linear weights streamed from host
    memory (the blocks of ``swapped_blocks``).

    Installs itself as the model's ``run_blocks`` (the transformer loop of ``LingBotDiT``);
    ``remove()`` undoes that. Weights of the swapped blocks that are not yet in host
    memory (pinned, for the CUDA transfer) are moved there now; weights a loader already
    put in pinned memory stay where they are.
    """

    def __init__(self, model: nn.Module, resident: int, device: torch.device | str | None = None,
                 transfer: Transfer | None = None) -> None:
        blocks = _blocks_of(model)
        if isinstance(resident, bool) or not isinstance(resident, int) or resident < 0:
            raise ValueError(f"resident={resident!r}: expected the number of blocks to keep on the device (0 or more)")
        if "run_blocks" in vars(model):
            raise RuntimeError("this model already has a block runner installed (remove the other BlockSwapper first)")
        self.resident = min(resident, len(blocks))
        self._blocks = blocks
        self._swapped = tuple(swapped_blocks(self.resident, len(blocks)))
        # the swapped block whose copy starts when each swapped block starts computing
        self._next = dict(zip(self._swapped, self._swapped[1:]))
        swapped = set(self._swapped)
        # (layer, parameter name) per block; nothing for resident blocks. Layers, not
        # Parameters, are held so that a released model's weights are really freed.
        self._weights: list[list[tuple[nn.Module, str]]] = [
            [(layer, "weight") for _, layer in swappable_weights(block)] if index in swapped else []
            for index, block in enumerate(blocks)
        ]
        self.device = torch.device(device) if device is not None else _compute_device(model, self._weights)
        if transfer is None:
            if self.device.type != "cuda":
                raise ValueError(f"block swap needs a CUDA device; the model is on {self.device}. "
                                 "Load it without block swap on this device.")
            transfer = CudaStreamTransfer(self.device)
        self._transfer = transfer
        self._on_device: dict[int, _OnDevice] = {}
        self._move_to_host()
        self._model = weakref.ref(model)
        model.run_blocks = self.run_blocks  # an instance attribute shadows LingBotDiT.run_blocks

    # -- introspection -----------------------------------------------------------------

    @staticmethod
    def of(model: nn.Module) -> "BlockSwapper | None":
        """The swapper installed on ``model``, if any."""
        owner = getattr(vars(model).get("run_blocks"), "__self__", None)
        return owner if isinstance(owner, BlockSwapper) else None

    @property
    def swapped(self) -> tuple[int, ...]:
        """The blocks whose weights live in host memory (``swapped_blocks``), ascending."""
        return self._swapped

    def blocks_on_device(self) -> list[int]:
        """Swapped blocks that currently have device copies (at most two, during a forward)."""
        return sorted(self._on_device)

    def host_bytes(self) -> int:
        """Bytes of weights kept in host memory."""
        return sum(p.numel() * p.element_size() for index in self.swapped for p in self._params(index))

    # -- setup -------------------------------------------------------------------------

    def _params(self, index: int) -> list[nn.Parameter]:
        params = []
        for layer, name in self._weights[index]:
            param = layer._parameters.get(name)
            if param is None:
                raise RuntimeError(f"block {index}: a swapped layer has no {name} (the model was released); "
                                   "load the expert again")
            params.append(param)
        return params

    def _is_host_ready(self, tensor: torch.Tensor) -> bool:
        if tensor.device.type != "cpu" or self.device.type == "cpu":
            return False
        return tensor.is_pinned() or not self._transfer.pins_host

    @torch.no_grad()
    def _move_to_host(self) -> None:
        moving = [[p for p in self._params(index) if not self._is_host_ready(p.data)] for index in self.swapped]
        specs = [[(p.shape, p.dtype) for p in block] for block in moving]
        if not any(specs):
            return
        for block, hosts in zip(moving, allocate_host_tensors(specs, pin=self._transfer.pins_host)):
            for param, host in zip(block, hosts):
                host.copy_(param.data)
                param.data = host

    # -- the transformer loop ----------------------------------------------------------

    def run_blocks(self, x: torch.Tensor, e0: torch.Tensor, rope: Any, context: torch.Tensor | None,
                   camera: torch.Tensor | None, kv_cache: Any = None) -> torch.Tensor:
        """LingBotDiT.run_blocks with the next swapped block's weights arriving while the
        blocks up to it compute. ``kv_cache`` (causal execution) is passed on: each block
        gets its layer of it."""
        blocks, swapped = self._blocks, set(self._swapped)
        try:
            if self._swapped:
                self._fetch(self._swapped[0])  # overlaps the resident blocks before it (or waits, with none)
            for index, block in enumerate(blocks):
                if index in swapped:
                    self._install(index)
                    following = self._next.get(index)
                    if following is not None:
                        self._fetch(following)
                if kv_cache is None:
                    x = block(x, e0, rope, context, camera)
                else:
                    x = block(x, e0, rope, context, camera, kv_cache.layer(index))
                if index in swapped:
                    self._drop(index)
        finally:
            self._drop_all()  # after an error (e.g. out of memory) the model stays consistent
        return x

    def _fetch(self, index: int) -> None:
        if index in self._on_device:
            return
        params = self._params(index)
        hosts = [p.data for p in params]
        copies, ready = self._transfer.fetch(hosts)
        self._on_device[index] = _OnDevice(params, hosts, copies, ready)

    def _install(self, index: int) -> None:
        self._fetch(index)
        entry = self._on_device[index]
        self._transfer.wait(entry.ready)
        for param, copy in zip(entry.params, entry.copies):
            param.data = copy
        entry.installed = True

    def _drop(self, index: int) -> None:
        entry = self._on_device.pop(index, None)
        if entry is None:
            return
        if entry.installed:
            for param, host in zip(entry.params, entry.hosts):
                param.data = host
        else:
            # Never used: still make the compute stream wait for the copy, so the memory
            # is not handed to new compute work while the side stream writes into it.
            self._transfer.wait(entry.ready)

    def _drop_all(self) -> None:
        for index in list(self._on_device):
            self._drop(index)

    # -- undo --------------------------------------------------------------------------

    @torch.no_grad()
    def remove(self, restore_weights: bool = True) -> None:
        """Uninstall; with ``restore_weights`` the swapped weights move back to the device
        (the model is then fully resident and runs without the swapper)."""
        self._drop_all()
        model = self._model()
        if model is not None and vars(model).get("run_blocks") == self.run_blocks:
            del model.run_blocks
        if restore_weights:
            for index in self.swapped:
                for param in self._params(index):
                    param.data = param.data.to(self.device)


def _compute_device(model: nn.Module, swapped: list[list[tuple[nn.Module, str]]]) -> torch.device:
    """The device of the first model parameter that block swap does not move."""
    moving = {id(layer._parameters[name]) for block in swapped for layer, name in block}
    for param in model.parameters():
        if id(param) not in moving:
            return param.device
    raise ValueError("cannot tell the model's device: every parameter is swapped; pass device=")
