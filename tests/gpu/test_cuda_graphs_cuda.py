"""CUDA graphs of LingBot-World Fast's passes (wan/runtime/cuda_graphs.py, LingBotDiT's graphed
path): a session whose passes are captured and replayed gives the eager session's output bit
for bit, chunk after chunk (new cameras, new timesteps, the commit's slot moves, bf16 and
int8 caches, fp8 and bf16 weights, kept or computed camera terms); block swap and a session
off CUDA stay eager; the same on two GPUs with NCCL inside the graphs. The warm start
(``FastGenerator.warm_up``): a warm-started session's chunks equal a cold one's bit for bit,
its warm-up captured every graph it replays, and the next session on the same model gets
the kept cache back and captures nothing; a Play session warmed up (the default on CUDA)
makes the cold session's frames. The CPU side (graphs off, the cache's bookkeeping):
tests/unit/test_cuda_graphs.py, tests/unit/test_fast_generator_warm_up.py."""
from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import pytest
import torch

from comfyui_lingbot_world.pipeline.experts import load_expert
from comfyui_lingbot_world.pipeline.fast import FastGenerator, FastParams, WholeI2V
from comfyui_lingbot_world.pipeline.play import PlaySession, PlaySettings
from comfyui_lingbot_world.pipeline.play.registry import SessionRegistry
from comfyui_lingbot_world.wan.runtime.dense import runs_on
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy
from fast_helpers import HEIGHT, WIDTH, SHAPED, image, prompt, shaped_bf16_and_fp8, tiny_fast_model, tiny_vae

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
STEPS = (999.0, 978.0, 947.0, 825.0)
# window 9, sink 3 (the default): chunks 0 and 1 fill the cache eagerly; from chunk 2 on the
# passes repeat, the denoising ones captured at the chunk's second pass, the commit at the
# second full chunk's.
POLICY = dict(window=9, sink=3)
CHUNKS = 6


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return shaped_bf16_and_fp8(tmp_path_factory.mktemp("cuda_graphs"), seed=5)


def session(model, graphs: bool, keep: int | str, camera: bool, kv_dtype: str = "bf16",
            latent: tuple[int, int] = (8, 8), frames: int = 3,
            kept_fp8: list | None = None) -> tuple[torch.Tensor, object]:
    """Every pass's output of a CHUNKS-chunk session (a new camera and new noise per chunk),
    and the cache's graphs (None when not made); ``kept_fp8`` gets whether the cache kept
    fp8 attention operands."""
    g = torch.Generator().manual_seed(11)
    h, w = latent
    device = model.patch_embedding.weight.device
    text = [torch.randn(7, model.config.text_dim, generator=g).to(device)]
    cache = model.new_kv_cache(CachePolicy(**POLICY, dtype=kv_dtype), h, w, graphs=graphs)
    outs = []
    with torch.inference_mode():
        for chunk in range(CHUNKS):
            x = torch.randn(1, 16, frames, h, w, generator=g).to(device)
            y = torch.randn(1, 20, frames, h, w, generator=g).to(device)
            tokens = None
            if camera:
                tokens = model.prepare_camera(torch.randn(1, 384, frames, h, w, generator=g).to(device),
                                              keep_terms=model.config.num_layers if keep == "all" else keep)
            for t in STEPS:
                out = model(x, torch.tensor([t], device=device), text if not outs else None, y=y,
                            camera_tokens=tokens, kv_cache=cache)
                outs.append(out)
                x = (x - 0.1 * out).contiguous()
            assert model(x, torch.tensor([0.0], device=device), None, y=y, camera_tokens=tokens, kv_cache=cache,
                         commit=True) is None
    found = cache.graphs
    stats = None if found is None else (found.captures, found.replays, found.disabled)
    if kept_fp8 is not None:
        kept_fp8.append(cache._fp8 is not None)
    cache.close()
    return torch.stack(outs), stats


def _need(kind: str) -> None:
    if kind != "bf16" and not runs_on(kind, torch.cuda.get_device_capability()):
        pytest.skip(f"{kind} does not run on this card")


@pytest.mark.parametrize("kind, kv_dtype, keep, camera", [
    ("bf16", "bf16", "all", True),   # every block's camera terms kept
    ("bf16", "int8", 2, True),      # half kept, half computed inside the graph
    ("bf16", "bf16", 0, False),     # no camera
    ("fp8", "bf16", "all", True),    # the Play default: fp8 weights, bf16 cache, terms kept
    ("fp8", "int8", 0, True),       # the 16 GB plan's cache, terms computed per pass
])
def test_graphed_session_equals_eager_bit_for_bit(folders, kind, kv_dtype, keep, camera) -> None:
    _need(kind)
    model = load_expert(folders["fp8" if kind == "fp8" else "bf16"], CUDA, quantize=None if kind == "bf16" else kind)
    eager, none = session(model, False, keep, camera, kv_dtype)
    graphed, (captures, replays, disabled) = session(model, True, keep, camera, kv_dtype)
    assert none is None and disabled is None
    # Chunks 2..5 run through the graphs: one denoising graph (captured at chunk 2's second
    # pass), one commit graph (captured at chunk 3's commit).
    assert captures == 2, captures
    # 16 denoising passes in chunks 2..5: 1 warm-up + 15 replays (the capture's included); 4
    # commits: 1 warm-up + 3 replays.
    assert replays == 15 + 3, replays
    assert torch.equal(graphed, eager), (
        f"first differing pass {int((graphed != eager).flatten(1).any(1).nonzero()[0])}, "
        f"max |diff| {float((graphed - eager).abs().max())}")


def test_fp8_attention_with_kept_operands_equals_casting_every_pass(folders, monkeypatch) -> None:
    """flash_fp8 (FlashAttention 3 on fp8 operands) with the cache keeping the committed
    frames' cast: the same outputs bit for bit as every pass casting all its keys and values
    (LINGBOT_KV_FP8_KEEP=0), eagerly and replayed from graphs (the commit's moves, the last
    layer's stale cast)."""
    from comfyui_lingbot_world.wan.runtime import attention as attn
    from comfyui_lingbot_world.wan.runtime.switches import KV_FP8_KEEP

    _need("fp8")
    if not attn.ATTENTION_BACKENDS["flash_fp8"].runs_on("cuda", torch.cuda.get_device_capability()):
        pytest.skip("flash_fp8 runs on Hopper only")
    if attn._fa3() is None:
        pytest.skip("FlashAttention 3 is not installed (pip install fa3-fwd)")
    model = load_expert(folders["fp8"], CUDA, quantize="fp8")
    kept: list[bool] = []
    with attn.attention_backend("flash_fp8"):
        eager, _ = session(model, False, "all", True, kept_fp8=kept)
        graphed, (captures, replays, disabled) = session(model, True, "all", True, kept_fp8=kept)
        monkeypatch.setenv(KV_FP8_KEEP.name, "0")
        cast, _ = session(model, False, "all", True, kept_fp8=kept)
    assert kept == [True, True, False]
    assert disabled is None and (captures, replays) == (2, 18)
    assert torch.equal(eager, cast), f"max |diff| {float((eager - cast).abs().max())}"
    assert torch.equal(graphed, eager), f"max |diff| {float((graphed - eager).abs().max())}"


def test_block_swap_runs_eagerly_and_the_same(folders) -> None:
    model = load_expert(folders["bf16"], CUDA, blocks_on_gpu=1)
    eager, _ = session(model, False, "all", True)
    graphed, (captures, replays, disabled) = session(model, True, "all", True)
    assert (captures, replays) == (0, 0) and disabled is None
    assert torch.equal(graphed, eager)


def test_weights_moved_mid_session_capture_again(folders) -> None:
    """ComfyUI may unload the transformer and load it again between prompts: graphs captured
    on the old addresses must not be replayed (they would read freed memory)."""
    model = load_expert(folders["bf16"], CUDA)
    g = torch.Generator().manual_seed(2)
    cache = model.new_kv_cache(CachePolicy(**POLICY), 8, 8, graphs=True)
    text = [torch.randn(7, SHAPED.text_dim, generator=g).cuda()]
    x, y = torch.randn(1, 16, 3, 8, 8, generator=g).cuda(), torch.randn(1, 20, 3, 8, 8, generator=g).cuda()
    t = torch.tensor([999.0], device=CUDA)
    with torch.inference_mode():
        for chunk in range(4):
            for _ in range(2):
                model(x, t, text if chunk == 0 else None, y=y, kv_cache=cache)
            model(x, torch.tensor([0.0], device=CUDA), None, y=y, kv_cache=cache, commit=True)
        want = model(x, t, None, y=y, kv_cache=cache)
        replays = cache.graphs.replays
        assert cache.graphs.captures == 2 and replays >= 1 and cache.graphs.keys
        model.cpu(), model.to(CUDA)  # every weight at a new address
        got = model(x, t, None, y=y, kv_cache=cache)
    # The graphs were dropped: this pass ran eagerly (the first sighting of its key again).
    assert not cache.graphs.keys and cache.graphs.replays == replays
    assert torch.equal(got, want)
    cache.close()


def fast_session(model, params: FastParams, warm: bool, latent: tuple[int, int] = (8, 8), frames: int = 3) -> dict:
    """A CHUNKS-chunk open-ended Fast session (a new camera each chunk), warmed up or not: its
    chunks, the warm-up's record, the cache's graphs and what they did during the chunks
    (captures, eager runs, replays)."""
    g = torch.Generator().manual_seed(13)
    h, w = latent
    y = torch.randn(20, frames * CHUNKS, h, w, generator=g)
    text = torch.randn(7, model.config.text_dim, generator=g)
    cameras = [torch.randn(1, 384, frames, h, w, generator=g) for _ in range(CHUNKS)]
    generator = FastGenerator(model, text, WholeI2V(y), params)
    record = generator.warm_up() if warm else None
    graphs = generator.cache.graphs

    def counts() -> tuple[int, int, int]:
        return (0, 0, 0) if graphs is None else (graphs.captures, graphs.eager, graphs.replays)

    before = counts()
    chunks = torch.stack([generator.next_chunk(camera).cpu() for camera in cameras])
    done = tuple(a - b for a, b in zip(counts(), before))
    cache = generator.cache
    generator.close()
    return {"chunks": chunks, "record": record, "graphs": graphs, "during": done, "cache": cache}


@pytest.mark.parametrize("kind, kv_dtype, terms", [("bf16", "bf16", 4), ("fp8", "bf16", 4), ("fp8", "int8", 0)])
def test_a_warm_started_session_equals_a_cold_one_and_the_next_session_reuses_its_graphs(folders, kind, kv_dtype,
                                                                                          terms) -> None:
    _need(kind)
    model = load_expert(folders["fp8" if kind == "fp8" else "bf16"], CUDA, quantize=None if kind == "bf16" else kind)
    params = FastParams(seed=3, policy=CachePolicy(**POLICY, dtype=kv_dtype), camera_terms=terms, cuda_graphs=True)
    eager = fast_session(model, dataclasses.replace(params, cuda_graphs=False), warm=False)
    cold = fast_session(model, params, warm=False)
    model.release_state()  # the warm session starts with nothing kept
    warm = fast_session(model, params, warm=True)
    second = fast_session(model, params, warm=True)
    graphs = warm["graphs"]
    assert graphs is not None and graphs.disabled is None
    # Chunks 2..5 of a cold session capture their two graphs on the way (one denoising, one commit).
    assert cold["during"][0] == 2
    # The warm-up captured both; the session's 20 graphed passes (chunks 2..5) only replay.
    assert warm["record"].captures == 2 and warm["during"] == (0, 0, 20)
    # The next session: the same cache and graphs, nothing captured, its warm-up 3 chunks.
    assert second["graphs"] is graphs and second["cache"] is warm["cache"]
    assert (second["record"].captures, second["record"].chunks) == (0, 3) and second["during"] == (0, 0, 20)
    assert graphs.captures == 2
    for run in (cold, warm, second):
        assert torch.equal(run["chunks"], eager["chunks"]), (
            f"max |diff| {float((run['chunks'] - eager['chunks']).abs().max())}")
    model.release_state()


def test_a_warm_play_session_on_cuda_makes_the_cold_sessions_frames() -> None:
    """The Play default on CUDA: the warm-up (on the chunks' stream, beside the decode
    worker) before the session starts; graphs on; the same latents and frames as a cold
    session, the warm-up's seconds in the result."""
    model = tiny_fast_model().cuda()
    vae = tiny_vae(seed=1).cuda()
    made = {}
    for warm in (False, None):
        pieces: list[torch.Tensor] = []
        writer = types.SimpleNamespace(write=lambda video, kept=pieces: kept.append(video.clone()), close=lambda: None)
        settings = PlaySettings(width=WIDTH, height=HEIGHT, seed=11, chunk_budget=5, mode="continuous", poll_s=0.005,
                                policy=CachePolicy(window=6, sink=3), cuda_graphs=True, warm_up=warm)
        result = PlaySession(model, prompt(), vae, image(), settings, writer=writer, registry=SessionRegistry(),
                             overlap=True).run()
        made[warm] = (result, pieces)
        model.release_state()
    (cold, cold_pieces), (warm, warm_pieces) = made[False], made[None]
    assert cold.warm_up_s is None and warm.warm_up_s > 0
    assert torch.equal(warm.latent, cold.latent)
    assert len(warm_pieces) == len(cold_pieces) == 15
    assert all(torch.equal(a, b) for a, b in zip(warm_pieces, cold_pieces))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_the_warm_up_on_two_gpus_captures_on_every_rank_and_equals_a_cold_session() -> None:
    """Through a ``ParallelModel``: the warm-up's forwards run on the worker too (its graphs
    captured there in lock-step, NCCL inside), the worker's cache comes back reset with rank
    0's, and the warm session's chunks are the cold one's bit for bit."""
    import parallel_ranks
    from comfyui_lingbot_world.pipeline.parallel_pool import ParallelModel, RankPool

    devices = [torch.device("cuda", i) for i in range(2)]
    pool = RankPool(devices).start()

    def loaded() -> ParallelModel:  # a fresh copy on both ranks: nothing kept, nothing captured
        local = parallel_ranks.build(devices[0])
        return ParallelModel(pool, "tiny", pool.load("tiny", parallel_ranks.build, local=local), cfg_split=False)

    try:
        shape = (parallel_ranks.LAT_H, 8)
        params = FastParams(seed=2, camera_terms=parallel_ranks.CONFIG.num_layers, cuda_graphs=True)
        cold = fast_session(loaded(), params, warm=False, latent=shape, frames=parallel_ranks.FRAMES)
        parallel = loaded()
        warm = fast_session(parallel, params, warm=True, latent=shape, frames=parallel_ranks.FRAMES)
        second = fast_session(parallel, params, warm=True, latent=shape, frames=parallel_ranks.FRAMES)
        assert cold["during"][0] == 2
        assert warm["record"].captures == 2 and warm["during"] == (0, 0, 20)
        assert second["record"].captures == 0 and second["during"] == (0, 0, 20)
        assert torch.equal(warm["chunks"], cold["chunks"]) and torch.equal(second["chunks"], cold["chunks"])
    finally:
        pool.close()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("latent_width", [10, 8], ids=["padded", "even"])
def test_sequence_parallel_graphs_equal_eager_on_two_gpus(latent_width: int) -> None:
    """Every rank captures and replays the same passes; the all-to-alls (started beside the
    projections, ``async_op``) and the gather are NCCL kernels inside the graphs. ``even``:
    the chunk's tokens split without padding, so keys and values land straight in the cache."""
    import parallel_ranks
    from comfyui_lingbot_world.pipeline.parallel_pool import ParallelModel, RankPool

    devices = [torch.device("cuda", i) for i in range(2)]
    reference = parallel_ranks.build(devices[0])
    pool = RankPool(devices).start()
    try:
        parallel = ParallelModel(pool, "tiny", pool.load("tiny", parallel_ranks.build, local=reference))
        shape = (parallel_ranks.LAT_H, latent_width)
        eager, _ = session(parallel, False, "all", True, latent=shape, frames=parallel_ranks.FRAMES)
        graphed, (captures, replays, disabled) = session(parallel, True, "all", True, latent=shape,
                                                         frames=parallel_ranks.FRAMES)
        assert disabled is None and captures == 2 and replays > 0
        assert torch.equal(graphed, eager)
        one, _ = session(reference, False, "all", True, latent=shape, frames=parallel_ranks.FRAMES)
        assert float((graphed - one).norm() / one.norm()) < 1e-4  # the split itself: float32 rounding
    finally:
        pool.close()


def test_under_the_cuda_malloc_async_allocator_a_session_runs_eagerly() -> None:
    """ComfyUI's default allocator (cudaMallocAsync, set before torch starts) replays captured
    passes at half the eager speed (bench/RESULTS.md, 2026-12-06): a Fast cache made for graphs
    there gets none and the session runs eagerly. Run in a process of its own, as the
    allocator is chosen when CUDA starts."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from _standalone import import_pack; import_pack()\n"
            "import torch\n"
            "from comfyui_lingbot_world.wan.runtime.cuda_graphs import allocator_backend, graphs_off_reason\n"
            "from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy\n"
            "sys.path.insert(0, sys.argv[2]); from fast_helpers import tiny_fast_model\n"
            "model = tiny_fast_model().to('cuda', torch.bfloat16)\n"
            "cache = model.new_kv_cache(CachePolicy(window=9, sink=3), 4, 6, graphs=True)\n"
            "print(allocator_backend(), graphs_off_reason('cuda') is not None, cache.graphs is None)\n")
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    done = subprocess.run([sys.executable, "-c", code, str(root), str(root / "tests")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-3:] == ["cudaMallocAsync", "True", "True"], done.stdout
