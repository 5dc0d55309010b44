"""What each gloo rank of tests/unit/test_sequence_parallel.py runs (a module of its own so
that ``torch.multiprocessing.spawn`` can import it in the child processes).

Every rank builds the same seeded tiny model (4 heads, so 2 and 4 ranks split them), runs
the one-process forward and the sequence-sharded one itself, and writes the differences
to ``<out>/rank<r>.json``; the test asserts on them.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import types
from pathlib import Path

# The checkout as the package comfyui_lingbot_world, without running its __init__: a spawned
# rank inherits sys.path, and once a test has put the ComfyUI host on it, the __init__ would
# import ComfyUI's nodes (and its device setup) in the child.
if "comfyui_lingbot_world" not in sys.modules:
    _package = types.ModuleType("comfyui_lingbot_world")
    _package.__path__ = [str(Path(__file__).resolve().parents[1])]
    sys.modules["comfyui_lingbot_world"] = _package

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from comfyui_lingbot_world.wan.config import TINY  # noqa: E402
from comfyui_lingbot_world.wan.model import LingBotDiT  # noqa: E402
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy  # noqa: E402
from comfyui_lingbot_world.wan.runtime.parallel import SequenceParallel  # noqa: E402
from comfyui_lingbot_world.wan.runtime.switches import ATTENTION, SP_OVERLAP  # noqa: E402

CONFIG = dataclasses.replace(TINY, num_heads=4)  # head_dim 16
# Latent 3 x 6 x 10 with the (1, 2, 2) patch: 3 x 3 x 5 = 45 tokens (15 a frame), divisible
# by neither 2 nor 4, so the padding is exercised.
FRAMES, LAT_H, LAT_W = 3, 6, 10
TOKENS = FRAMES * (LAT_H // 2) * (LAT_W // 2)


def model(seed: int = 0) -> LingBotDiT:
    g = torch.Generator().manual_seed(seed)
    m = LingBotDiT(CONFIG)
    m.init_weights(generator=g)
    with torch.no_grad():
        for name, p in m.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise) if "norm" in name else p.add_(0.05 * noise)
    return m.eval()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check_exact(m: LingBotDiT, sp: SequenceParallel) -> dict:
    """(a) the exact path (batch of two, as batched CFG; camera tokens) against one process."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 16, FRAMES, LAT_H, LAT_W, generator=g)
    y = torch.randn(2, 20, FRAMES, LAT_H, LAT_W, generator=g)
    t = torch.tensor([937.0, 412.0])
    context = [torch.randn(n, CONFIG.text_dim, generator=g) for n in (7, 12)]
    plucker = torch.randn(1, 384, FRAMES, LAT_H, LAT_W, generator=g)
    want = m(x, t, context, y, camera=plucker)
    got = m(x, t, context, y, camera=plucker, parallel=sp)
    for block in m.blocks:  # per-token work in chunks of 4 tokens: spans inside the slice
        block.token_chunk = 4
    chunked = m(x, t, context, y, camera=plucker, parallel=sp)
    for block in m.blocks:
        del block.token_chunk
    return {"exact_rel": rel(got, want), "exact_chunked_rel": rel(chunked, want),
            "exact_shape_equal": list(got.shape) == list(want.shape)}


def check_shard_gather(sp: SequenceParallel) -> dict:
    """(c) shard then gather restores token order; the RoPE tables are cut like the tokens."""
    tokens = torch.arange(2 * TOKENS * 3, dtype=torch.float32).view(2, TOKENS, 3)
    local = sp.shard(tokens)
    start, _ = sp.span(TOKENS)
    real = max(0, min(local.shape[1], TOKENS - start))
    cos = torch.arange(TOKENS, dtype=torch.float32).view(TOKENS, 1, 1).expand(TOKENS, 1, 4).contiguous()
    cos_local, sin_local = LingBotDiT.sharding.split("rope", sp, (cos, cos.clone()))
    return {"gather_equal": bool(torch.equal(sp.gather(local, TOKENS), tokens)),
            "slice_is_mine": bool(torch.equal(local[:, :real], tokens[:, start:start + real])),
            "pad_is_zero": bool((local[:, real:] == 0).all()),
            "rope_slice_matches": bool(torch.equal(cos_local[:real], cos[start:start + real])),
            "rope_pad_is_identity": bool((cos_local[real:] == 1).all() and (sin_local[real:] == 0).all()),
            "local_tokens": local.shape[1]}


def check_fast(m: LingBotDiT, sp: SequenceParallel, chunks: int = 4, dtype: str = "bf16") -> dict:
    """(b) a Fast session: several chunks of two denoising passes and a commit each, the
    window (9, sink 3) evicting from the fourth chunk on; (d) the head-sharded cache holds
    the whole cache's heads of this rank."""
    g = torch.Generator().manual_seed(2)
    policy = CachePolicy(window=9, sink=3, dtype=dtype)
    whole = m.new_kv_cache(policy, LAT_H, LAT_W)
    shard = m.new_kv_cache(policy, LAT_H, LAT_W, parallel=sp)
    kept = m.new_kv_cache(policy, LAT_H, LAT_W, parallel=sp)  # the same run with the camera terms kept
    text = [torch.randn(9, CONFIG.text_dim, generator=g)]
    worst, terms_equal = 0.0, True
    for chunk in range(chunks):
        y = torch.randn(1, 20, FRAMES, LAT_H, LAT_W, generator=g)
        plucker = torch.randn(1, 384, FRAMES, LAT_H, LAT_W, generator=g)
        x = torch.randn(1, 16, FRAMES, LAT_H, LAT_W, generator=g)
        terms = m.prepare_camera(plucker, keep_terms=CONFIG.num_layers)
        for step, t in enumerate((999.0, 500.0)):
            context = text if chunk == 0 and step == 0 else None
            want = m(x, torch.tensor([t]), context, y, camera=plucker, kv_cache=whole)
            got = m(x, torch.tensor([t]), context, y, camera=plucker, kv_cache=shard, parallel=sp)
            with_terms = m(x, torch.tensor([t]), context, y, camera_tokens=terms, kv_cache=kept, parallel=sp)
            worst = max(worst, rel(got, want))
            terms_equal &= torch.equal(with_terms, got)
            x = want - 0.1 * x  # the next pass's input, the same on every rank
        assert m(x, torch.tensor([0.0]), None, y, camera=plucker, kv_cache=whole, commit=True) is None
        assert m(x, torch.tensor([0.0]), None, y, camera=plucker, kv_cache=shard, commit=True, parallel=sp) is None
        assert m(x, torch.tensor([0.0]), None, y, camera_tokens=terms, kv_cache=kept, commit=True, parallel=sp) is None
        terms_equal &= terms.nbytes > 0 and not terms._terms  # each rank keeps its shard's terms, not the whole's
    heads = CONFIG.num_heads // sp.size
    mine = slice(sp.rank * heads, (sp.rank + 1) * heads)
    used = whole.committed * whole.frame_tokens
    if dtype == "int8":
        k_whole, k_shard = whole._k8[:, :used], shard._k8[:, :used]
        v_whole, v_shard = whole._v8[:, :used], shard._v8[:, :used]
        cache_k = float((k_shard.float() - k_whole[:, :, mine].float()).abs().max())
        cache_v = float((v_shard.float() - v_whole[:, :, mine].float()).abs().max())
    else:
        def split(t: torch.Tensor) -> torch.Tensor:
            return t[:, :used].unflatten(-1, (-1, CONFIG.head_dim))

        cache_k = rel(split(shard._k), split(whole._k)[:, :, mine])
        cache_v = rel(split(shard._v), split(whole._v)[:, :, mine])
    return {f"fast_{dtype}_rel": worst, f"cache_{dtype}_k": cache_k, f"cache_{dtype}_v": cache_v,
            f"fast_{dtype}_terms_equal": bool(terms_equal),
            f"slots_equal_{dtype}": whole.slot_frames == shard.slot_frames,
            f"frame_start_equal_{dtype}": whole.frame_start == shard.frame_start,
            f"shard_heads_{dtype}": shard.heads, f"committed_{dtype}": whole.committed}


def check_fast_even(m: LingBotDiT, sp: SequenceParallel, chunks: int = 4) -> dict:
    """(b) again where the chunk's 36 tokens (latent width 8) split evenly over 2 and 4 ranks:
    the keys and values are received straight into the cache's slots. The exchanges
    overlapped (the default) and waited for one by one (``LINGBOT_SP_OVERLAP=0``) give the
    same numbers, and the one-process ones to float32 rounding."""
    lat_w = 8
    g = torch.Generator().manual_seed(3)
    policy = CachePolicy(window=9, sink=3)
    whole = m.new_kv_cache(policy, LAT_H, lat_w)
    caches = {mode: m.new_kv_cache(policy, LAT_H, lat_w, parallel=sp) for mode in ("1", "0")}
    text = [torch.randn(9, CONFIG.text_dim, generator=g)]
    worst, same = 0.0, True
    try:
        for chunk in range(chunks):
            y = torch.randn(1, 20, FRAMES, LAT_H, lat_w, generator=g)
            plucker = torch.randn(1, 384, FRAMES, LAT_H, lat_w, generator=g)
            x = torch.randn(1, 16, FRAMES, LAT_H, lat_w, generator=g)
            for step, t in enumerate((999.0, 500.0, 0.0)):
                commit = step == 2
                context = text if chunk == 0 and step == 0 else None
                want = m(x, torch.tensor([t]), context, y, camera=plucker, kv_cache=whole, commit=commit)
                got = {}
                for mode, cache in caches.items():
                    os.environ[SP_OVERLAP.name] = mode
                    got[mode] = m(x, torch.tensor([t]), context, y, camera=plucker, kv_cache=cache, commit=commit,
                                  parallel=sp)
                if commit:
                    continue
                worst = max(worst, rel(got["1"], want))
                same &= torch.equal(got["1"], got["0"])
                x = want - 0.1 * x
        same &= torch.equal(caches["1"]._k, caches["0"]._k) and torch.equal(caches["1"]._v, caches["0"]._v)
    finally:
        os.environ.pop(SP_OVERLAP.name, None)
    return {"fast_even_rel": worst, "fast_even_overlap_off_equal": bool(same),
            "fast_even_local_tokens": sp.local_length(FRAMES * (LAT_H // 2) * (lat_w // 2))}


def run(rank: int, world: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault(ATTENTION.name, "sdpa")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        sp = SequenceParallel.from_group()
        m = model()
        with torch.no_grad():
            result = {"rank": rank, "world": world} | check_shard_gather(sp) | check_exact(m, sp)
            result |= check_fast(m, sp) | check_fast(m, sp, chunks=4, dtype="int8") | check_fast_even(m, sp)
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def build(device) -> LingBotDiT:
    """A model factory for pipeline/parallel_pool/ (picklable: the workers call it)."""
    return model().to(device)
