"""One forward of the LingBot-World transformer (``LingBotDiT.forward``), however it runs.

Every forward is the same pipeline (``run_model``): the patch embedding of x (and y), the
timestep embedding, the transformer blocks (``model.run_blocks``, which block swap may
own), the head, the unpatchify. With a sequence-parallel group the model's shard plan
(``LingBotDiT.sharding``, ``runtime/parallel.py``) cuts the tokens, the camera tokens and
the RoPE tables after the embedding and gathers the head's output: the same points for
every pass. The inputs are checked once (``check_forward``) before anything runs.

What differs is the pass, one per forward:

* ``exact_pass``: no KV cache; the whole latent (a CFG batch too) attends to itself and the
  text is embedded every forward.
* ``causal_pass`` (LingBot-World Fast): one chunk with the causal KV cache
  (``runtime/kv_cache.py``): RoPE's frame axis starts at the chunk's first frame, the text's
  keys and values are computed on a session's first pass and kept, and the pass runs inside
  the cache's ``in_pass`` (a commit that fails part way leaves the cache refused).
* ``graphed_pass`` (``runtime/cuda_graphs.py``): a causal pass whose shapes repeat,
  replayed from a CUDA graph of ``run_model``.

The model is duck-typed (``embed_patches``, ``embed_time``, ``embed_text``, ``patch_grid``,
``prepare_camera``, ``rope_tables``, ``run_blocks``, ``head``, ``unpatchify``, ``sharding``,
``blocks``, ``config``): nothing here imports wan/model.py.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from . import parallel as sequence_parallel
from .camera_terms import CameraTerms
from .cuda_graphs import graphed_pass, replays_graphs
from .kv_cache import KVCache
from .parallel import SequenceParallel

Rope = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Forward:
    """One forward's inputs, checked (``check_forward``). ``camera``: the whole camera tokens
    (or their ``CameraTerms``), not yet sharded."""

    x: torch.Tensor
    t: torch.Tensor
    context: torch.Tensor | Sequence[torch.Tensor] | None
    y: torch.Tensor | None
    camera: torch.Tensor | CameraTerms | None
    grid: tuple[int, int, int]
    cancel: Callable[[], None] | None
    kv_cache: KVCache | None
    commit: bool
    parallel: SequenceParallel | None

    @property
    def batch(self) -> int:
        return self.x.shape[0]

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def length(self) -> int:
        """Real tokens of the latent (before any padding a shard adds)."""
        return math.prod(self.grid)


def check_forward(model: Any, x: torch.Tensor, t: torch.Tensor,
                  context: torch.Tensor | Sequence[torch.Tensor] | None, y: torch.Tensor | None,
                  camera_tokens: torch.Tensor | CameraTerms | None, camera: torch.Tensor | None,
                  cancel: Callable[[], None] | None, kv_cache: KVCache | None, commit: bool,
                  parallel: SequenceParallel | None) -> Forward:
    """``LingBotDiT.forward``'s arguments checked, every pass's checks in one place; the
    Plücker ``camera`` turned into camera tokens."""
    cfg = model.config
    if commit and kv_cache is None:
        raise ValueError("commit=True needs a kv_cache")
    if camera is not None:
        if camera_tokens is not None:
            raise ValueError("pass either camera (Plücker) or camera_tokens, not both")
        camera_tokens = model.prepare_camera(camera)
    if x.dim() != 5:
        raise ValueError(f"x: expected [B, C, F, H, W], got shape {tuple(x.shape)}")
    channels = x.shape[1] + (0 if y is None else y.shape[1])
    if channels != cfg.in_dim:
        hint = " (I2V needs y with the mask and image latent)" if y is None else ""
        raise ValueError(f"x/y: {channels} input channels, the checkpoint expects {cfg.in_dim}{hint}")
    grid = model.patch_grid(x.shape[2:], "x")
    batch, length = x.shape[0], math.prod(grid)
    if camera_tokens is not None and (camera_tokens.dim() != 3 or camera_tokens.shape[0] not in (1, batch)
                                      or tuple(camera_tokens.shape[1:]) != (length, cfg.dim)):
        batches = "1" if batch == 1 else f"{batch} or 1"
        raise ValueError(f"camera_tokens: expected [{batches}, {length}, {cfg.dim}] for this latent, got "
                         f"{tuple(camera_tokens.shape)}")
    if parallel is not None:
        parallel.check_heads(cfg.num_heads)
    if kv_cache is not None:
        heads = model.sharding.local_heads(parallel, cfg.num_heads)  # a head-sharded cache
        kv_cache.check_geometry(grid[0], grid[1] * grid[2], heads, cfg.head_dim, cfg.num_layers, x.device)
        if batch != 1:
            raise ValueError(f"x: causal execution runs one sample (no CFG), got a batch of {batch}")
        if context is None and not kv_cache.cross_ready:
            raise ValueError("context: the cache holds no text keys yet; pass the text on the first pass")
    return Forward(x, t, context, y, camera_tokens, grid, cancel, kv_cache, commit, parallel)


def run_forward(model: Any, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor | Sequence[torch.Tensor] | None,
                y: torch.Tensor | None = None, camera_tokens: torch.Tensor | CameraTerms | None = None,
                camera: torch.Tensor | None = None, cancel: Callable[[], None] | None = None,
                kv_cache: KVCache | None = None, commit: bool = False,
                parallel: SequenceParallel | None = None) -> torch.Tensor | None:
    """``LingBotDiT.forward`` (its docstring says what each argument is): the inputs checked,
    then the pass that fits them."""
    forward = check_forward(model, x, t, context, y, camera_tokens, camera, cancel, kv_cache, commit, parallel)
    if kv_cache is None:
        return exact_pass(model, forward)
    if replays_graphs(model, kv_cache):
        return graphed_pass(model, forward, run_model)
    return causal_pass(model, forward)


def run_model(model: Any, forward: Forward, x: torch.Tensor, y: torch.Tensor | None, t: torch.Tensor, rope: Rope,
              text: torch.Tensor | None, camera: torch.Tensor | CameraTerms | None,
              head: bool) -> torch.Tensor | None:
    """Embed → blocks → head for ``x`` (and ``y``) at ``t``: every pass's forward, and what a
    CUDA graph holds. ``rope`` whole (cut here by the shard plan), ``camera`` already this
    rank's; ``head`` False: the blocks only (a commit pass needs only the cache they fill).
    Returns float32 [B, out_dim, F, H, W] on every rank."""
    plan, sp, length = model.sharding, forward.parallel, forward.length
    tokens = plan.split("tokens", sp, model.embed_patches(x, y))
    rope = plan.split("rope", sp, rope)
    e, e0 = model.embed_time(t, forward.batch, forward.device)
    with sequence_parallel.active(sp, length):
        tokens = model.run_blocks(tokens, e0, rope, text, camera, kv_cache=forward.kv_cache)
    if not head:
        return None
    return model.unpatchify(plan.gather("head", sp, model.head(tokens, e), length), forward.grid).float()


def exact_pass(model: Any, forward: Forward) -> torch.Tensor:
    """The whole latent at once, no cache: the text embedded for this forward."""
    text = model.embed_text(forward.context, forward.batch, forward.device)
    rope = model.rope_tables(forward.grid, forward.device)
    with cancel_before_blocks(model, forward.cancel):
        return run_model(model, forward, forward.x, forward.y, forward.t, rope, text, shard_camera(model, forward),
                         head=True)


def causal_pass(model: Any, forward: Forward) -> torch.Tensor | None:
    """One chunk with the causal cache, eagerly; None for a commit pass."""
    cache = forward.kv_cache
    text = None if cache.cross_ready else model.embed_text(forward.context, 1, forward.device)
    rope = model.rope_tables(forward.grid, forward.device, cache.frame_start)
    camera = shard_camera(model, forward)
    with cancel_before_blocks(model, forward.cancel), cache.in_pass(forward.commit):
        return run_model(model, forward, forward.x, forward.y, forward.t, rope, text, camera, head=not forward.commit)


def shard_camera(model: Any, forward: Forward) -> torch.Tensor | CameraTerms | None:
    """This rank's camera tokens by the shard plan (``CameraTerms``: this rank's shard of them,
    with its own kept terms)."""
    camera, sp = forward.camera, forward.parallel
    if camera is None or sp is None:
        return camera
    if isinstance(camera, CameraTerms):
        return camera.shard(sp, lambda tokens: model.sharding.split("camera", sp, tokens))
    return model.sharding.split("camera", sp, camera)


@contextlib.contextmanager
def cancel_before_blocks(model: Any, cancel: Callable[[], None] | None) -> Iterator[None]:
    """``cancel`` called before every transformer block (a pre-hook, so block swap's loop
    checks it too) while the context runs."""
    hooks = [block.register_forward_pre_hook(lambda *_: cancel()) for block in model.blocks] if cancel else []
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


__all__ = ["Forward", "causal_pass", "check_forward", "exact_pass", "run_forward", "run_model"]
