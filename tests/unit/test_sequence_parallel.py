"""Ulysses sequence parallel (wan/runtime/parallel.py) on 2 and 4 ``gloo`` ranks against the
one-process forward of the same tiny model (float32, 45 tokens: padded on both sizes).

One spawn per group size runs every check (tests/parallel_ranks.py); each test asserts on
the figures the ranks wrote."""
from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp

import parallel_ranks
from comfyui_lingbot_world.wan.runtime.parallel import SequenceParallel, current

FLOAT32 = 1e-5  # relative: float32 rounding of a different token chunking / attention split


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def ranks(request, tmp_path_factory) -> list[dict]:
    world = request.param
    out = tmp_path_factory.mktemp(f"sp{world}")
    mp.spawn(parallel_ranks.run, args=(world, str(out / "init"), str(out)), nprocs=world, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def test_sharded_exact_forward_equals_one_process(ranks):
    for r in ranks:
        assert r["exact_shape_equal"]
        assert r["exact_rel"] < FLOAT32, r
        assert r["exact_chunked_rel"] < FLOAT32, r


def test_fast_chunks_with_their_cache_equal_one_process(ranks):
    for r in ranks:
        assert r["committed_bf16"] == 6 and r["slots_equal_bf16"] and r["frame_start_equal_bf16"]
        assert r["fast_bf16_rel"] < FLOAT32, r
        # int8: the same quantization per token and head on either side; a float32 rounding
        # difference may flip one rounding step of a stored value
        assert r["fast_int8_rel"] < 1e-3, r
        # kept camera terms (CameraTerms, each rank its shard's): bit for bit the same run
        assert r["fast_bf16_terms_equal"] and r["fast_int8_terms_equal"], r


def test_an_even_split_receives_into_the_cache_and_the_overlap_changes_nothing(ranks):
    world = ranks[0]["world"]
    for r in ranks:
        assert r["fast_even_local_tokens"] * world == 36  # no padding: received straight into the slots
        assert r["fast_even_rel"] < FLOAT32, r
        assert r["fast_even_overlap_off_equal"], r


def test_shard_and_gather_restore_token_order(ranks):
    world = ranks[0]["world"]
    for r in ranks:
        assert r["gather_equal"] and r["slice_is_mine"] and r["pad_is_zero"], r
        assert r["rope_slice_matches"] and r["rope_pad_is_identity"], r
        assert r["local_tokens"] == -(-parallel_ranks.TOKENS // world)


def test_head_sharded_cache_equals_the_whole_caches_heads(ranks):
    world = ranks[0]["world"]
    for r in ranks:
        assert r["shard_heads_bf16"] == parallel_ranks.CONFIG.num_heads // world
        assert r["cache_bf16_k"] < FLOAT32 and r["cache_bf16_v"] < FLOAT32, r
        assert r["cache_int8_k"] <= 1 and r["cache_int8_v"] <= 1, r  # int8 units


def test_geometry_and_errors_without_processes():
    sp = SequenceParallel(rank=1, size=4)
    assert sp.padded(45) == 48 and sp.local_length(45) == 12 and sp.span(45) == (12, 24)
    with pytest.raises(ValueError, match="needs a head count divisible by 4; the model has 6 heads"):
        sp.check_heads(6)
    assert current() is None  # nothing sharded outside a forward
