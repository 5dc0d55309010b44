"""The causal KV cache of LingBot-World Fast (wan/runtime/kv_cache.py): what each chunk
attends to under each policy (a probe on the keys the attention really receives), the
int8 error bound, the sizes the docstrings quote, inputs refused naming the input, and the
cache a model keeps between sessions (``KeptCache``: handed back reset for the same
arguments only, one at a time, freed on demand and with the model's weights)."""
from __future__ import annotations

import pytest
import torch

from comfyui_lingbot_world.pipeline.fast import FastGenerator, FastParams, OfficialOrderNoise, WholeI2V
from comfyui_lingbot_world.pipeline.memory import release_module
from comfyui_lingbot_world.wan.config import TINY
from comfyui_lingbot_world.wan.model import SelfAttention
from comfyui_lingbot_world.wan.runtime.kv_cache import (CachePolicy, KVCache, dequantize_int8, frames_bytes,
                                                         plan_commit, quantize_int8)
from fast_helpers import LAT_H, LAT_W, prompt, tiny_fast_model, whole_camera, video_frames
from fast_helpers import one_thread, model  # noqa: F401  (module fixtures)
from reference.official_fast import OfficialFastModel, generate_fast
from triton_interpreter import run_interpreted

FRAME_TOKENS = (LAT_H // 2) * (LAT_W // 2)


# --------------------------------------------------------------------------- the probe

class AttentionProbe:
    """Records the keys layer 0's self-attention receives on every pass."""

    def __init__(self, model, monkeypatch) -> None:
        self.target = model.blocks[0].self_attn
        self.keys: list[torch.Tensor] = []
        original = SelfAttention._attend

        def recording(attn, q, k, v):
            if attn is self.target:
                self.keys.append(k.detach().clone())
            return original(attn, q, k, v)

        monkeypatch.setattr(SelfAttention, "_attend", recording)

    def attended_frames(self, passes_per_chunk: int = 5, exact: bool = True) -> list[list[int]]:
        """Per pass, the absolute latent frames of the keys it saw. A committed frame is
        recognized by its keys as its chunk's commit pass left them (the last 3 frames of
        that pass); the last 3 frames of every pass are the chunk itself. int8 keys come
        back dequantized, so they are matched to the nearest committed frame instead."""
        signatures: dict[int, torch.Tensor] = {}
        out = []
        for p, keys in enumerate(self.keys):
            chunk = p // passes_per_chunk
            blocks = list(keys.split(FRAME_TOKENS))
            own, history = blocks[-3:], blocks[:-3]
            frames = []
            for block in history:
                distance = {f: (block.float() - sig.float()).abs().max().item() for f, sig in signatures.items()}
                ranked = sorted(distance, key=distance.get)
                best = ranked[0]
                if exact:
                    assert distance[best] == 0.0, "a history key matches no committed frame exactly"
                else:  # the nearest committed frame, and clearly so
                    assert len(ranked) == 1 or distance[best] < 0.2 * distance[ranked[1]]
                frames.append(best)
            assert len(set(frames)) == len(frames), "a frame appears twice among the keys"
            out.append(sorted(frames) + [3 * chunk + i for i in range(3)])
            if p % passes_per_chunk == passes_per_chunk - 1:  # the commit pass: remember the chunk's keys
                for i, block in enumerate(own):
                    signatures[3 * chunk + i] = block
        return out


def expected_frames(window: int | None, sink: int, chunk: int) -> list[int]:
    """Written from the policy's definition: the sink frames plus the most recent frames,
    `window` in all with the chunk itself."""
    start = 3 * chunk
    history = list(range(start))
    if window is None or len(history) <= window - 3:
        kept = history
    else:
        recent = window - 3 - sink
        kept = history[:sink] + (history[-recent:] if recent else [])
    return kept + [start, start + 1, start + 2]


@pytest.mark.parametrize("window,sink,dtype", [(None, 0, "bf16"), (6, 0, "bf16"), (9, 3, "bf16"), (6, 3, "bf16"),
                                               (10, 4, "bf16"), (9, 3, "int8")])
def test_probe_shows_which_frames_each_chunk_attends_to(model, monkeypatch, window, sink, dtype):
    latent_frames = 18  # 6 chunks: every policy here evicts
    probe = AttentionProbe(model, monkeypatch)
    params = FastParams(seed=5, policy=CachePolicy(window=window, sink=sink, dtype=dtype))
    plucker = whole_camera(video_frames(latent_frames))
    y = torch.randn(20, latent_frames, LAT_H, LAT_W, generator=torch.Generator().manual_seed(2))
    bookkeeping = []
    with FastGenerator(model, prompt(), WholeI2V(y), params, latent_frames=latent_frames) as session:
        for c in range(latent_frames // 3):
            bookkeeping += [sorted(session.cache.attended_frames())] * 5
            session.next_chunk(plucker[:, :, 3 * c:3 * c + 3])
    seen = probe.attended_frames(exact=dtype == "bf16")
    assert bookkeeping == seen  # the cache's own account of its slots agrees with the keys
    assert len(seen) == 5 * (latent_frames // 3)
    for p, frames in enumerate(seen):
        assert frames == expected_frames(window, sink, p // 5), (p, frames)
    if dtype == "bf16":  # the official roll, run by the reference, attends to the same frames on every pass
        reference = OfficialFastModel(model.state_dict(), TINY, local_attn_size=-1 if window is None else window,
                                      sink_size=sink)
        generate_fast(reference, prompt(), y, plucker, 5, kv_frames=window)
        assert reference.attended_frames == seen


def test_plan_commit_evicts_the_oldest_frames_outside_the_sink():
    # window 10, sink 4: capacity 7; frames 0..5 committed, chunk 6..8 arrives
    plan = plan_commit([0, 1, 2, 3, 4, 5], [6, 7, 8], capacity=7, sink=4)
    assert plan.dest == (6, 4, 5) and plan.slot_frames == (0, 1, 2, 3, 7, 8, 6)
    # the sink alone fills the capacity: the new chunk is evicted at once
    plan = plan_commit([0, 1, 2, 3, 4, 5], [6, 7, 8], capacity=6, sink=6)
    assert plan.dest == (None, None, None) and plan.slot_frames == (0, 1, 2, 3, 4, 5)
    plan = plan_commit([], [0, 1, 2], capacity=6, sink=3)
    assert plan.dest == (0, 1, 2) and plan.slot_frames == (0, 1, 2)


# --------------------------------------------------------------------------- int8

def test_int8_quantization_error_is_at_most_half_a_scale():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, 32, generator=g) * torch.logspace(-3, 2, 64)[:, None, None]
    x[3] = 0.0  # an all-zero token: scale 0, exact
    x[5, 1, 7] = 1e4  # an outlier only costs its own token and head
    q, scale = quantize_int8(x)
    assert q.dtype == torch.int8 and scale.shape == (64, 4) and scale.dtype == torch.float32
    back = dequantize_int8(q, scale, torch.empty_like(x))
    err = (x - back).abs()
    bound = scale[..., None] / 2
    assert (err <= bound * (1 + 4e-5)).all(), f"worst error {(err / bound.clamp_min(1e-30)).max():.6f} half-scales"
    assert torch.equal(back[3], x[3])
    assert (err[5, 0] <= scale[5, 0] / 2 * (1 + 4e-5)).all() and scale[5, 0] < 1e-1 < scale[5, 1]


_INTERPRETED_DEQUANT = """
import torch
from comfyui_lingbot_world.wan.runtime import triton_kernels as k
from comfyui_lingbot_world.wan.runtime.kv_cache import dequantize_int8_pytorch, quantize_int8
g = torch.Generator().manual_seed(0)
for shape in ((130, 3, 16), (7, 2, 128), (1, 1, 8)):
    x = torch.randn(*shape, generator=g) * torch.logspace(-2, 2, shape[0])[:, None, None]
    q, scale = quantize_int8(x)
    # float16: the interpreter rounds it as the GPU does (half to even); its bfloat16 cast
    # truncates, so bf16 is checked bit for bit on the GPU only
    want = dequantize_int8_pytorch(q, scale, torch.empty(shape, dtype=torch.float16))
    got = k.dequantize_int8(q, scale, torch.full(shape, float("nan"), dtype=torch.float16))
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), shape
    bf16 = k.dequantize_int8(q, scale, torch.empty(shape, dtype=torch.bfloat16)).float()
    exact = q.float() * scale[..., None]
    assert ((bf16 - exact).abs() <= exact.abs() * 2 ** -7).all(), shape  # within one bf16 step
shape = (7, 2, 16)
q, scale = quantize_int8(torch.randn(*shape, generator=g))
for bad in ((q.float(), scale, torch.empty(shape, dtype=torch.bfloat16)),
            (q, scale, torch.empty(shape, dtype=torch.float32)),
            (q, scale[:, :1], torch.empty(shape, dtype=torch.bfloat16)),
            (q, scale, torch.empty(shape[::-1], dtype=torch.bfloat16).transpose(0, 2))):
    try:
        k.dequantize_int8(*bad)
    except ValueError:
        pass
    else:
        raise AssertionError("a layout the kernel does not take was taken")
print("ok")
"""


def test_the_int8_dequantize_kernel_is_the_definition_bit_for_bit_under_the_cpu_interpreter():
    """Every layer's pass of an int8 cache dequantizes the committed frames; on CUDA one
    Triton pass (``triton_kernels.dequantize_int8``) does it. Its arithmetic is the
    definition's (a float32 product, one rounding half to even), so Triton's CPU interpreter
    checks it bit for bit in float16, and layouts it does not take are refused (they run
    the definition). bf16 bit for bit: the GPU twin in tests/gpu/test_attention_fp8_cuda.py."""
    run_interpreted(_INTERPRETED_DEQUANT)


def test_int8_cache_deviation_from_the_float_cache_is_small(model):
    """End to end over 6 chunks with eviction: the int8 cache's latent against the same run
    with an unquantized cache (float32 here)."""
    latent_frames = 18
    y = torch.randn(20, latent_frames, LAT_H, LAT_W, generator=torch.Generator().manual_seed(2))
    plucker = whole_camera(video_frames(latent_frames))
    out = {}
    for dtype in ("bf16", "int8"):
        params = FastParams(seed=5, policy=CachePolicy(window=9, sink=3, dtype=dtype))
        noise = OfficialOrderNoise(5, latent_frames, LAT_H, LAT_W)
        with FastGenerator(model, prompt(), WholeI2V(y), params, noise, latent_frames) as session:
            out[dtype] = torch.cat([session.next_chunk(plucker[:, :, c:c + 3]) for c in range(0, latent_frames, 3)], 1)
    diff = (out["int8"] - out["bf16"]).abs().max().item()
    rel = diff / out["bf16"].abs().max().item()
    print(f"int8 cache vs float cache: max abs deviation {diff:.3e} ({rel:.3e} of the latent's largest value)")
    assert 0 < rel < 2e-3, f"int8 deviation {diff:.3e} ({rel:.3e} relative)"
    assert torch.equal(out["int8"][:, :3], out["bf16"][:, :3])  # chunk 0 sees no committed frame


# --------------------------------------------------------------------------- sizes and inputs

def test_cache_bytes_match_the_documented_sizes():
    a14b_frame = frames_bytes(1, 1560, 40, 5120)  # 480x832: 30x52 tokens a latent frame
    assert abs(a14b_frame / 1e9 - 1.28) < 0.005
    geometry = dict(layers=40, heads=40, head_dim=128, frame_tokens=1560)
    bf16 = KVCache.estimate_bytes(CachePolicy(window=9, sink=3), **geometry)
    int8 = KVCache.estimate_bytes(CachePolicy(window=9, sink=3, dtype="int8"), **geometry)
    full = KVCache.estimate_bytes(CachePolicy(window=None), latent_frames=21, **geometry)
    assert abs(bf16 / 1e9 - (11.5 + 0.42)) < 0.05 and abs(int8 / 1e9 - 4.66) < 0.05
    assert abs(full / 1e9 - (26.8 + 0.42)) < 0.1
    tiny = dict(layers=2, heads=2, head_dim=32, frame_tokens=FRAME_TOKENS)
    for policy in (CachePolicy(window=9, sink=3), CachePolicy(window=9, sink=3, dtype="int8")):
        cache = KVCache(policy, dtype=torch.float32, device="cpu", **tiny)
        for layer in range(2):  # what the first pass adds: each layer's text keys and values
            cache.layer(layer).set_cross(torch.zeros(512, 64), torch.zeros(512, 64))
        assert cache.nbytes() == KVCache.estimate_bytes(policy, dtype_bytes=4, **tiny)


@pytest.mark.parametrize("kwargs,field", [
    (dict(window=2), "kv_window"), (dict(window=0), "kv_window"), (dict(window=9.5), "kv_window"),
    (dict(window=9, sink=9), "kv_sink"), (dict(window=9, sink=7), "kv_sink"), (dict(sink=-1), "kv_sink"),
    (dict(dtype="fp8"), "kv_dtype"),
])
def test_bad_policy_inputs_name_the_input(kwargs, field):
    with pytest.raises(ValueError, match=field):
        CachePolicy(**kwargs)


def test_full_cache_needs_a_length_and_whole_chunks():
    with pytest.raises(ValueError, match="kv_window"):
        CachePolicy(window=None).resolve(None)
    with pytest.raises(ValueError, match="frames: 10 latent frames"):
        CachePolicy(window=None).resolve(10)
    assert CachePolicy(window=None).resolve(21) == (21, 0)
    assert CachePolicy(window=30, sink=3).resolve(21) == (21, 0)  # covers the video: the full cache
    assert CachePolicy(window=9, sink=3).resolve(None) == (9, 3)


# --------------------------------------------------------------------------- kept between sessions

def _fill(model, cache: KVCache, chunks: int = 3) -> None:
    """``chunks`` chunks of one pass and a commit each (a camera, the text on the first)."""
    g = torch.Generator().manual_seed(4)
    with torch.inference_mode():
        for c in range(chunks):
            x, y = torch.randn(1, 16, 3, LAT_H, LAT_W, generator=g), torch.randn(1, 20, 3, LAT_H, LAT_W, generator=g)
            camera = torch.randn(1, 384, 3, LAT_H, LAT_W, generator=g)
            model(x, torch.tensor([999.0]), [prompt()] if c == 0 else None, y=y, camera=camera, kv_cache=cache)
            model(x, torch.tensor([0.0]), None, y=y, camera=camera, kv_cache=cache, commit=True)


@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
def test_a_kept_cache_comes_back_reset_for_the_same_arguments(model, kv_dtype):
    policy = CachePolicy(window=9, sink=3, dtype=kv_dtype)
    cache = model.new_kv_cache(policy, LAT_H, LAT_W, graphs=True)
    _fill(model, cache)
    buffers = [cache._k.data_ptr(), cache._v.data_ptr()] + [t.data_ptr() for kv in cache._cross for t in kv]
    cache.close()  # the session ends: the state goes, the tensors stay
    assert cache.closed and cache.committed == 0 and not cache.cross_ready and cache._k is not None
    with pytest.raises(RuntimeError, match="session ended"):
        _fill(model, cache, 1)
    again = model.new_kv_cache(policy, LAT_H, LAT_W, graphs=True)
    assert again is cache and not again.closed and (again.frame_start, again.slot_frames) == (0, [])
    if kv_dtype == "int8":
        assert not again._k_scale.any() and not again._v_scale.any()
    _fill(model, again)  # the text's keys go into the same tensors as before
    assert [again._k.data_ptr(), again._v.data_ptr()] + [t.data_ptr() for kv in again._cross for t in kv] == buffers
    # In use: another session gets a cache of its own, freed when it ends.
    other = model.new_kv_cache(policy, LAT_H, LAT_W, graphs=True)
    assert other is not again and other.keeper is None
    other.close()
    assert other._k is None and again._k is not None
    again.close()
    # Other arguments: the kept cache is freed before the new one is made, which is kept.
    wider = model.new_kv_cache(policy, LAT_H, LAT_W + 2, graphs=True)
    assert wider is not again and again._k is None and model._kept_cache.cache is wider
    wider.close()
    model.release_state()
    assert wider._k is None and model._kept_cache.cache is None


def test_without_graphs_a_cache_is_the_sessions_and_free_always_frees(model):
    plain = model.new_kv_cache(CachePolicy(), LAT_H, LAT_W)
    plain.close()
    assert plain._k is None and model._kept_cache.cache is None
    kept = model.new_kv_cache(CachePolicy(), LAT_H, LAT_W, graphs=True)
    kept.free()  # e.g. after an out-of-memory error: not kept
    assert kept._k is None and model._kept_cache.cache is None
    assert model.new_kv_cache(CachePolicy(), LAT_H, LAT_W, graphs=True) is not kept
    model.release_state()


def test_releasing_the_model_frees_its_kept_cache():
    """ComfyUI's unload (``release_module``) drops the kept cache with the weights, even while
    something still holds the model object."""
    tiny = tiny_fast_model(seed=1)
    cache = tiny.new_kv_cache(CachePolicy(), LAT_H, LAT_W, graphs=True)
    _fill(tiny, cache, 1)
    cache.close()
    assert cache._k is not None
    release_module(tiny)
    assert cache._k is None and cache._cross == [None] * TINY.num_layers
