"""pipeline/memory.py: one function chooses the Fast run's memory settings from the card's
size (kv dtype, blocks on the GPU, the VAE's device, the decode overlap), with the
real model's sizes (the NF4 A14B Fast transformer, 8.9 GiB; window 9 + sink 3 at 480x832)
on fake cards of 12, 16, 24 and 80 GiB; and the budget of the VAE streams that the two Fast
stream nodes hand it."""
from __future__ import annotations

import pytest

from comfyui_lingbot_world.pipeline import memory
from comfyui_lingbot_world.pipeline.memory import GIB, plan_fast_memory
from comfyui_lingbot_world.wan.config import A14B
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy

TRANSFORMER = int(8.9 * GIB)  # measured: the NF4 A14B transformer on the GPU
RUN = {d: memory.fast_run_bytes(A14B, CachePolicy(window=9, sink=3, dtype=d), 60, 104, None) for d in ("bf16", "int8")}
VAE = memory.vae_stream_budget(int(0.24 * GIB), 480, 832, "bf16")  # bf16 VAE weights and its streams
DECODE = memory.decode_chunk_bytes(480, 832, "bf16")
RESERVE = 1 * GIB


def plan(card_gib: float, vae: int = VAE, **kw):
    return plan_fast_memory(int(card_gib * GIB), TRANSFORMER, 40, RUN, vae, DECODE, RESERVE, **kw)


def test_an_80_gib_card_keeps_everything_on_the_gpu_and_overlaps_the_decode():
    for vae in (0, VAE):
        chosen = plan(80, vae)
        assert (chosen.kv_dtype, chosen.blocks_on_gpu, chosen.vae_on_gpu, chosen.overlap, chosen.fits) == (
            "bf16", None, True, True, True)


def test_a_24_gib_card_takes_the_int8_cache_for_a_stream_but_not_for_a_clip():
    clip, stream = plan(24, 0), plan(24)
    assert clip.kv_dtype == "bf16" and clip.blocks_on_gpu is None  # measured: 20.8 GiB under a 24 GiB cap
    assert stream.kv_dtype == "int8" and stream.blocks_on_gpu is None and stream.vae_on_gpu


@pytest.mark.parametrize("card", [16, 12])
def test_16_and_12_gib_cards_fit_by_the_int8_cache_and_block_swap(card):
    chosen = plan(card)
    assert chosen.fits and chosen.kv_dtype == "int8"
    assert chosen.blocks_on_gpu is not None and 1 <= chosen.blocks_on_gpu < 40
    assert chosen.need + memory.ALLOCATOR_SLACK <= memory.AUTO_FIT_SHARE * card * GIB


def test_the_plan_keeps_the_allocators_slack_free():
    """The NF4 clip that ran out of memory under a 16 GiB cap: its plan (int8 cache, every
    block on the GPU, ~14.8 GiB) left no room for the 1.5 GiB the allocator held reserved and
    unallocated; now the plan keeps ``ALLOCATOR_SLACK`` and moves blocks off the GPU."""
    clip = plan(16, 0)
    assert clip.blocks_on_gpu is not None and clip.kv_dtype == "int8"
    assert clip.need + memory.ALLOCATOR_SLACK <= memory.AUTO_FIT_SHARE * 16 * GIB


def test_a_smaller_card_keeps_fewer_blocks_and_each_choice_is_the_cheapest_that_fits():
    on_gpu = [plan(c).blocks_on_gpu or 40 for c in (24, 16, 12)]
    assert on_gpu[0] > on_gpu[1] > on_gpu[2]
    chosen = plan(16)
    one_more = plan_fast_memory(16 * GIB, TRANSFORMER, 40, RUN, VAE, 0, RESERVE)  # the same without the overlap
    assert one_more.blocks_on_gpu == chosen.blocks_on_gpu
    # one block more on the GPU would not fit
    per_block = TRANSFORMER / 40
    bigger = chosen.need - (DECODE if chosen.overlap else 0) + per_block
    assert bigger + memory.ALLOCATOR_SLACK > memory.AUTO_FIT_SHARE * 16 * GIB


def test_the_users_kv_dtype_is_kept_and_a_card_too_small_gets_the_smallest_plan():
    assert plan(16, kv_dtype="bf16").kv_dtype == "bf16"
    assert plan(80, kv_dtype="int8").kv_dtype == "int8"
    tiny = plan(4)
    assert not tiny.fits and tiny.blocks_on_gpu == memory.MIN_BLOCKS_ON_GPU and not tiny.vae_on_gpu
    on_cpu = plan(8)  # even one block on the GPU leaves no room for the VAE: it decodes on the CPU
    assert on_cpu.fits and not on_cpu.vae_on_gpu and on_cpu.overlap  # the CPU's decode beside the GPU's chunk
    assert plan(12).vae_on_gpu  # the VAE on the CPU is the last resort: any block count comes first


def test_the_vae_budget_of_a_fast_stream_is_its_weights_streams_and_one_chunks_decode():
    """One budget for both stream nodes (each hands it to its memory plan:
    test_node_fast_long_video.py, test_node_play.py)."""
    assert memory.vae_budgets(100, 480, 832, "fp32") == (100 + memory.vae_stream_bytes(480, 832, "fp32"),
                                                         memory.decode_chunk_bytes(480, 832, "fp32"))
    assert memory.vae_stream_bytes(480, 832, "bf16") * 2 == pytest.approx(memory.vae_stream_bytes(480, 832), abs=2)


def test_cuda_graphs_where_their_pool_fits_beside_everything_and_never_with_block_swap():
    graph = memory.graph_pool_bytes(A14B, 60, 104, 3)
    # The measured share of a chunk forward's working memory, per rank's token shard.
    assert graph == int(memory.GRAPH_POOL_SHARE * memory.activation_bytes(3 * 30 * 52, A14B.dim))
    assert memory.graph_pool_bytes(A14B, 60, 104, 3, ranks=2) == int(
        memory.GRAPH_POOL_SHARE * memory.activation_bytes(3 * 30 * 52 // 2, A14B.dim))
    terms = memory.camera_terms_bytes(A14B, 60, 104, 3)
    roomy = plan(80, graph_bytes=graph, terms_bytes=terms)
    without = plan(80, terms_bytes=terms)
    assert roomy.cuda_graphs and not without.cuda_graphs
    assert roomy.camera_terms == without.camera_terms == 40 and roomy.need - without.need == graph  # counted
    assert "CUDA graphs" in roomy.describe()
    small = plan(16, graph_bytes=graph, terms_bytes=terms)
    assert small.blocks_on_gpu is not None and not small.cuda_graphs  # block swap runs eagerly
    # Where only the graphs or nothing fits beside the rest, the graphs go first.
    edge = plan(24, 0, graph_bytes=graph)
    assert edge.cuda_graphs == memory.fits(plan(24, 0).need + graph, 24 * GIB, memory.ALLOCATOR_SLACK)


def test_plays_live_decoder_budgets_the_wan_encoder_and_the_tiny_decoder_only():
    """With the tiny video VAE decoding Play's chunks, the Wan VAE only encodes the start
    image: its decoder's stream state and chunk decode are not counted, the tiny decoder's are."""
    wan, wan_decode = memory.vae_budgets(int(0.24 * GIB), 480, 832, "bf16")
    tiny, tiny_decode = memory.vae_budgets(int(0.24 * GIB), 480, 832, "bf16", live_decoder=True)
    assert tiny < wan and tiny_decode < wan_decode
    encoder = memory.vae_stream_bytes(480, 832, "bf16", decoder=False)
    assert 0 < encoder < memory.vae_stream_bytes(480, 832, "bf16") and tiny > int(0.24 * GIB) + encoder
    # the fp8 Fast transformer (17.3 GiB) under a 24 GiB cap: the tiny decoder leaves room for more
    fp8 = int(17.3 * GIB)
    terms = memory.camera_terms_bytes(A14B, 60, 104, 3)
    with_wan = plan_fast_memory(24 * GIB, fp8, 40, RUN, wan, wan_decode, RESERVE, terms_bytes=terms)
    with_tiny = plan_fast_memory(24 * GIB, fp8, 40, RUN, tiny, tiny_decode, RESERVE, terms_bytes=terms)
    assert with_wan.camera_terms < with_tiny.camera_terms == 40 and with_tiny.overlap
    assert with_tiny.need < with_wan.need  # the node asks for it: test_node_play.py
