"""The model executor (wan/runtime/executor.py) on the tiny Fast model, CPU:

- the inputs are checked once, before any pass: every bad input is refused with the same
  message whichever pass would have run (exact, causal, graphed), and a refused pass leaves
  the cache as it was;
- the pass is chosen by the cache: none → exact, causal until the cache is full and the
  text cached, graphed after (``CpuGraphs``: capture stood in on the CPU), causal again under
  block swap;
- the model's one shard plan (``LingBotDiT.sharding``) is what every pass cuts and gathers:
  each pass on a one-rank group splits the tokens, the camera and the RoPE tables and
  gathers the head's output (a commit pass: no head) through it, and gives the one-process
  result. Two and four ranks: tests/unit/test_sequence_parallel.py (gloo).
"""
from __future__ import annotations

import pytest
import torch

from comfyui_lingbot_world.wan.model import LingBotDiT
from comfyui_lingbot_world.wan.runtime import parallel as parallel_module
from comfyui_lingbot_world.wan.runtime.block_swap import BlockSwapper, SyncTransfer
from comfyui_lingbot_world.wan.runtime.executor import check_forward
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy
from comfyui_lingbot_world.wan.runtime.parallel import SequenceParallel
from fast_helpers import LAT_H, LAT_W, cpu_graphs, prompt
from fast_helpers import one_thread, model  # noqa: F401  (module fixtures)

G = torch.Generator().manual_seed(6)
X = torch.randn(1, 16, 3, LAT_H, LAT_W, generator=G)
Y = torch.randn(1, 20, 3, LAT_H, LAT_W, generator=G)
PLUCKER = torch.randn(1, 384, 3, LAT_H, LAT_W, generator=G)
T = torch.tensor([999.0])


def cache_at(model, state: str):
    """A cache whose next pass is ``state``'s: "causal" (empty) or "graphed" (full, the text
    cached, ``CpuGraphs``), or None ("exact")."""
    if state == "exact":
        return None
    cache = model.new_kv_cache(CachePolicy(window=6, sink=3), LAT_H, LAT_W, graphs=state == "graphed")
    if state == "graphed":
        with torch.inference_mode():
            model(X, T, [prompt()], y=Y, kv_cache=cache)
            model(X, T, None, y=Y, kv_cache=cache, commit=True)
        assert cache.full and cache.cross_ready and cache.graphs is not None
    return cache


BAD = [  # (what, arguments changed, the message)
    ("x of 4 dims", dict(x=X[0]), r"x: expected \[B, C, F, H, W\]"),
    ("no y", dict(y=None), "I2V needs y"),
    ("odd height", dict(x=X[..., :3, :], y=Y[..., :3, :]), "x: H=3 is not a multiple of the patch size 2"),
    ("camera tokens of another latent", dict(camera_tokens=torch.zeros(1, 5, 64)), r"camera_tokens: expected \[1, 18, 64\]"),
    ("camera twice", dict(camera=PLUCKER, camera_tokens=torch.zeros(1, 18, 64)), "either camera"),
    ("a CFG batch", dict(x=X.expand(2, -1, -1, -1, -1), y=Y.expand(2, -1, -1, -1, -1)), "one sample"),
    ("chunk of 2 frames", dict(x=X[:, :, :2], y=Y[:, :, :2]), "chunks of 3"),
]


@pytest.mark.parametrize("state", ["exact", "causal", "graphed"])
@pytest.mark.parametrize("what, change, message", BAD, ids=[b[0] for b in BAD])
def test_each_bad_input_is_refused_alike_before_any_pass(model, monkeypatch, state, what, change, message):
    cpu_graphs(monkeypatch)
    cache = cache_at(model, state)
    causal_only = what in ("a CFG batch", "chunk of 2 frames")
    embedded = []
    hook = model.patch_embedding.register_forward_hook(lambda *_: embedded.append(1))
    arguments = {**dict(x=X, t=T, context=[prompt()], y=Y, kv_cache=cache), **change}
    before = None if cache is None else (cache.committed, cache.frame_start)
    try:
        with torch.inference_mode():
            if causal_only and cache is None:
                model(**{**arguments, "kv_cache": None})  # fine without a cache
                return
            with pytest.raises(ValueError, match=message):
                model(**arguments)
        assert not embedded  # refused before the patch embedding ran
        if cache is not None:
            assert (cache.committed, cache.frame_start) == before and cache._broken is None and not cache._in_pass
    finally:
        hook.remove()
        if cache is not None:
            cache.close()
        model.release_state()


def test_the_checked_forward_holds_the_latent_grid_and_the_camera_tokens(model):
    """``check_forward`` turns a Plücker camera into camera tokens once and says the latent's
    patch grid and real token count (what every pass and the shard plan cut by)."""
    with torch.inference_mode():
        forward = check_forward(model, X, T, [prompt()], Y, None, PLUCKER, None, None, False, None)
        tokens = model.prepare_camera(PLUCKER)
    grid = (3, LAT_H // 2, LAT_W // 2)
    assert forward.grid == grid and forward.length == 3 * (LAT_H // 2) * (LAT_W // 2) and forward.batch == 1
    assert torch.equal(forward.camera, tokens) and forward.kv_cache is None and not forward.commit


def test_the_first_causal_pass_needs_the_text_and_a_commit_needs_a_cache(model):
    cache = model.new_kv_cache(CachePolicy(), LAT_H, LAT_W)
    with torch.inference_mode():
        with pytest.raises(ValueError, match="context: the cache holds no text keys yet"):
            model(X, T, None, y=Y, kv_cache=cache)
        with pytest.raises(ValueError, match="commit=True needs a kv_cache"):
            model(X, T, [prompt()], y=Y, commit=True)
    assert not cache._in_pass and cache._broken is None
    cache.close()


def test_the_pass_follows_the_cache(model, monkeypatch):
    """Graphs only once the cache is full and the text cached, never under block swap."""
    cpu_graphs(monkeypatch)
    cache = model.new_kv_cache(CachePolicy(window=6, sink=3), LAT_H, LAT_W, graphs=True)
    graphs = cache.graphs
    try:
        with torch.inference_mode():
            calls = lambda: graphs.eager + graphs.replays  # noqa: E731
            model(X, T, [prompt()], y=Y, kv_cache=cache)
            model(X, T, None, y=Y, kv_cache=cache, commit=True)  # fills the cache (window 6: one chunk)
            assert calls() == 0 and cache.full
            model(X, T, None, y=Y, kv_cache=cache)
            assert calls() == 1  # graphed
            swapper = BlockSwapper(model, 1, transfer=SyncTransfer("cpu"))
            try:
                model(X, T, None, y=Y, kv_cache=cache)
            finally:
                swapper.remove()
            assert calls() == 1  # block swap: causal
    finally:
        cache.close()
        model.release_state()


class RecordingPlan:
    """The model's shard plan, recording the points each pass cuts and gathers."""

    def __init__(self, plan) -> None:
        self.plan, self.points = plan, []

    def split(self, point, sp, value):
        self.points.append(("split", point))
        return self.plan.split(point, sp, value)

    def gather(self, point, sp, x, length):
        self.points.append(("gather", point))
        return self.plan.gather(point, sp, x, length)

    def local_heads(self, sp, heads):
        return self.plan.local_heads(sp, heads)


def one_rank_group(monkeypatch) -> SequenceParallel:
    """A group of one rank with the collectives done in process (no process group needed)."""
    def all_to_all_single(out, inp, group=None, async_op=False):
        out.copy_(inp)

    monkeypatch.setattr(parallel_module.dist, "all_to_all_single", all_to_all_single)
    monkeypatch.setattr(parallel_module.dist, "all_gather", lambda parts, x, group=None: parts[0].copy_(x))
    return SequenceParallel(rank=0, size=1)


@pytest.mark.parametrize("state", ["exact", "causal", "graphed"])
def test_every_pass_cuts_and_gathers_by_the_one_plan(model, monkeypatch, state):
    cpu_graphs(monkeypatch)
    sp = one_rank_group(monkeypatch)
    plan = RecordingPlan(LingBotDiT.sharding)
    outs = {}
    try:
        for parallel in (None, sp):
            cache = cache_at(model, state)
            monkeypatch.setattr(LingBotDiT, "sharding", plan)
            plan.points.clear()
            tokens = model.prepare_camera(PLUCKER, keep_terms=1)
            with torch.inference_mode():
                outs[parallel is None] = model(X, T, [prompt()] if state != "graphed" else None, y=Y,
                                              camera_tokens=tokens, kv_cache=cache, parallel=parallel)
                committed = None if cache is None else model(X, T, None, y=Y, camera_tokens=tokens, kv_cache=cache,
                                                             commit=True, parallel=parallel)
            if cache is not None:
                assert committed is None
                cache.close()
            model.release_state()
        points = ([("split", "camera"), ("split", "tokens"), ("split", "rope"), ("gather", "head")]
                  + ([] if state == "exact" else [("split", "tokens"), ("split", "rope")]))  # the commit: no head
        assert sorted(plan.points) == sorted(points)
        torch.testing.assert_close(outs[False], outs[True], rtol=1e-5, atol=1e-5)
    finally:
        model.release_state()
