"""Block swap (wan/runtime/block_swap.py and the loaders' blocks_on_gpu argument).

CPU tests drive the swapper with ``SyncTransfer`` (same bookkeeping, no streams) and run
the loaders' host-memory path with the CUDA-only parts swapped for CPU stand-ins. Tests
marked ``gpu`` run the real thing (pinned memory, side stream, events):

    python -m pytest -m gpu tests/unit/test_block_swap.py
"""
from __future__ import annotations

import functools
import gc
import itertools
import logging
import math
import random
import weakref
from pathlib import Path

import pytest
import torch
from bitsandbytes.nn import Linear4bit
from safetensors import safe_open
from torch import nn

from comfyui_lingbot_world.loaders import bf16 as bf16_mod
from comfyui_lingbot_world.loaders import nf4 as nf4_mod
from comfyui_lingbot_world.loaders.bf16 import load_bf16_expert
from comfyui_lingbot_world.loaders.nf4 import load_nf4_expert
from comfyui_lingbot_world.tools.synthetic.dit import (
    make_synthetic_expert,
    write_synthetic_bf16_expert,
    write_synthetic_nf4_expert,
)
from comfyui_lingbot_world.loaders.expert_size import expert_host_bytes, expert_size_bytes
from comfyui_lingbot_world.pipeline.experts import load_expert
from comfyui_lingbot_world.pipeline.memory import release_module
from comfyui_lingbot_world.wan.runtime import block_swap as bs
from comfyui_lingbot_world.wan.runtime.switches import SWAP_SPREAD
from comfyui_lingbot_world.wan.runtime.weights4 import packed_shape as nf4_packed_shape, quantize_linear
from comfyui_lingbot_world.wan.runtime.block_swap import (
    HOST_ALIGNMENT,
    BlockSwapper,
    SyncTransfer,
    allocate_host_tensors,
    plan_slabs,
    resident_blocks,
    swappable_weights,
    swapped_blocks,
    swapped_weight_keys,
)
from comfyui_lingbot_world.wan.config import DiTConfig
from comfyui_lingbot_world.wan.model import LingBotDiT

# Every layer kind of the real expert, 5 blocks so that "K resident, the rest swapped"
# has room for a prefetch chain.
SMALL = DiTConfig(dim=64, ffn_dim=128, freq_dim=32, text_dim=32, num_heads=2, num_layers=5)
# Big enough that weights dominate the GPU memory of a forward (about 2.4 MB per NF4 block).
MEDIUM = DiTConfig(dim=512, ffn_dim=1536, freq_dim=256, text_dim=128, num_heads=8, num_layers=8)


def inputs(config: DiTConfig, batch: int, device: torch.device | str = "cpu", size: int = 8, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    grid = (2, size, size)
    values = {
        "x": torch.randn(batch, 16, *grid, generator=g),
        "t": torch.tensor([730.0, 310.0][:batch]),
        "context": torch.randn(batch, 7, config.text_dim, generator=g),
        "y": torch.randn(batch, 20, *grid, generator=g),
        "camera": torch.randn(batch, 384, *grid, generator=g),
    }
    return {k: v.to(device) for k, v in values.items()}


def disable_cpu_repack(model: nn.Module) -> nn.Module:
    # bitsandbytes repacks a 4-bit weight in place on its first CPU forward (AVX512-BF16);
    # the swapper's host copy would then disagree with the quant state. CPU only.
    for layer in model.modules():
        if isinstance(layer, Linear4bit):
            layer.support_avx512bf16_for_cpu = False
    return model


def swapped_params(model: nn.Module, resident: int) -> list[nn.Parameter]:
    return [layer.weight for index in swapped_blocks(resident, len(model.blocks))
            for _, layer in swappable_weights(model.blocks[index])]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("block_swap")
    return {
        "nf4": write_synthetic_nf4_expert(root / "small_nf4", SMALL, seed=3),
        "bf16": write_synthetic_bf16_expert(root / "small_bf16", SMALL, seed=4, max_shard_bytes=400_000),
    }


# --------------------------------------------------------------------------- host memory

def _brute_force_cost(sizes: list[int], max_group: int) -> int:
    best = None
    n = len(sizes)
    for cuts in itertools.product((False, True), repeat=n - 1):
        groups, start = [], 0
        for i, cut in enumerate(cuts, start=1):
            if cut:
                groups.append(sizes[start:i])
                start = i
        groups.append(sizes[start:])
        if any(len(g) > max_group for g in groups):
            continue
        cost = sum(bs._pow2_ceil(sum(g)) for g in groups)
        best = cost if best is None else min(best, cost)
    return best


def test_plan_slabs_finds_the_least_rounded_total() -> None:
    rng = random.Random(0)
    for _ in range(60):
        sizes = [rng.randint(1, 5000) for _ in range(rng.randint(1, 9))]
        max_group = rng.randint(1, 4)
        groups = plan_slabs(sizes, max_group)
        assert [i for g in groups for i in g] == list(range(len(sizes)))  # consecutive, all, once
        assert all(1 <= len(g) <= max_group for g in groups)
        cost = sum(bs._pow2_ceil(sum(sizes[i] for i in g)) for g in groups)
        assert cost == _brute_force_cost(sizes, max_group), (sizes, max_group, groups)


def test_plan_slabs_wastes_little_on_a14b_blocks() -> None:
    block = sum(math.prod(nf4_packed_shape(o, i)) for o, i in [(5120, 5120)] * 12 + [(13824, 5120), (5120, 13824)])
    for swapped in (1, 10, 20, 30, 39):
        sizes = [block] * swapped
        rounded = sum(bs._pow2_ceil(sum(sizes[i] for i in g)) for g in plan_slabs(sizes))
        one_each = swapped * bs._pow2_ceil(block)
        assert rounded <= one_each
        if swapped >= 10:
            assert rounded < 1.07 * block * swapped, (swapped, rounded / (block * swapped))


def test_allocate_host_tensors_gives_aligned_disjoint_views() -> None:
    specs = [[((3, 5), torch.bfloat16), ((7,), torch.uint8), ((2, 2), torch.float32)],
             [((11, 1), torch.uint8)],
             [((4, 3), torch.bfloat16), ((1,), torch.float32)]]
    blocks = allocate_host_tensors(specs, pin=False)
    spans = []
    for block_specs, tensors in zip(specs, blocks):
        assert [(tuple(t.shape), t.dtype) for t in tensors] == [(tuple(s), d) for s, d in block_specs]
        for t in tensors:
            offset = t.storage_offset() * t.element_size()
            assert offset % HOST_ALIGNMENT == 0 and t.is_contiguous() and t.device.type == "cpu"
            spans.append((t.untyped_storage().data_ptr(), offset, offset + t.numel() * t.element_size()))
    for (sa, a0, a1), (sb, b0, b1) in itertools.combinations(spans, 2):
        assert sa != sb or a1 <= b0 or b1 <= a0, "two host tensors overlap"
    for i, t in enumerate(t for block in blocks for t in block):
        t.fill_(i + 1)
    for i, t in enumerate(t for block in blocks for t in block):
        assert bool((t == i + 1).all())


def test_swapped_weight_keys_name_every_linear_weight_of_the_swapped_blocks() -> None:
    with torch.device("meta"):
        model = nn.Module()
        model.blocks = nn.ModuleList(make_synthetic_block() for _ in range(3))
    keys = swapped_weight_keys(model, 1)
    assert len(keys) == 2  # blocks 0 and 2 (spread), block 1 stays
    assert keys[0] == ["blocks.0.attn.weight", "blocks.0.mlp.0.weight", "blocks.0.mlp.2.weight"]
    assert keys[1][0].startswith("blocks.2.")
    assert swapped_weight_keys(model, 3) == [] and swapped_weight_keys(model, 7) == []


def test_swapped_blocks_are_spread_evenly_and_the_env_puts_them_last(monkeypatch) -> None:
    monkeypatch.delenv(SWAP_SPREAD.name, raising=False)
    assert swapped_blocks(31, 40) == [3, 7, 12, 16, 21, 25, 30, 34, 39]
    assert swapped_blocks(20, 40) == list(range(1, 40, 2))
    assert swapped_blocks(0, 5) == [0, 1, 2, 3, 4] and swapped_blocks(5, 5) == [] and swapped_blocks(9, 5) == []
    for resident in range(41):  # always the right count, distinct, the last block among them
        got = swapped_blocks(resident, 40)
        assert len(got) == len(set(got)) == 40 - resident and got == sorted(got)
        assert not got or got[-1] == 39
        gaps = [b - a for a, b in zip(got, got[1:])]
        assert not gaps or max(gaps) - min(gaps) <= 1  # even spacing
    monkeypatch.setenv(SWAP_SPREAD.name, "0")
    assert swapped_blocks(31, 40) == list(range(31, 40))


def make_synthetic_block() -> nn.Module:
    block = nn.Module()
    block.attn = nn.Linear(4, 4)
    block.norm = nn.LayerNorm(4)
    block.mlp = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4, bias=False))
    return block


def test_resident_blocks_validates_and_ignores_cpu(caplog) -> None:
    assert resident_blocks(None, 40, "cuda") is None
    assert resident_blocks(40, 40, "cuda") is None and resident_blocks(99, 40, "cuda") is None
    assert resident_blocks(0, 40, "cuda") == 0 and resident_blocks(12, 40, "cuda:1") == 12
    for bad in (-1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="block_swap"):
            resident_blocks(bad, 40, "cuda")
    with caplog.at_level(logging.WARNING):
        assert resident_blocks(3, 40, "cpu") is None
    assert "block_swap=3 ignored" in caplog.text and "CUDA" in caplog.text


def test_nf4_packed_shape_matches_bitsandbytes() -> None:
    for out_features, in_features in ((64, 64), (96, 128), (3, 65)):
        linear = nn.Linear(in_features, out_features)
        packed = quantize_linear(linear).weight
        assert tuple(packed.shape) == nf4_packed_shape(out_features, in_features) and packed.dtype == torch.uint8


# --------------------------------------------------------------------------- the swapper (CPU)

@pytest.fixture(scope="module")
def float_model() -> nn.Module:
    return make_synthetic_expert(SMALL, seed=1, dtype=torch.float32)


@pytest.mark.parametrize("resident", [0, 2, 4, 5])
def test_swapper_schedule_and_outputs(resident: int) -> None:
    model = make_synthetic_expert(SMALL, seed=1, dtype=torch.float32)
    want = {b: model(**inputs(SMALL, b)) for b in (1, 2)}
    swapper = BlockSwapper(model, resident, transfer=SyncTransfer("cpu"))
    order = swapped_blocks(resident, SMALL.num_layers)
    assert BlockSwapper.of(model) is swapper and list(swapper.swapped) == order
    params = swapped_params(model, resident)
    host_ptrs = [p.data_ptr() for p in params]
    assert swapper.host_bytes() == sum(p.numel() * p.element_size() for p in params)
    assert all(p.device.type == "cpu" for p in params)
    host_of = {i: [layer.weight.data_ptr() for _, layer in swappable_weights(model.blocks[i])]
               for i in swapper.swapped}

    seen = []

    def check(index: int) -> None:
        seen.append((index, swapper.blocks_on_device()))
        for block_index, hosts in host_of.items():
            ptrs = [layer.weight.data_ptr() for _, layer in swappable_weights(model.blocks[block_index])]
            if block_index == index:
                assert not set(ptrs) & set(host_ptrs), f"block {index} runs on its host weights"
            else:
                assert ptrs == hosts, f"block {block_index} holds device weights while block {index} runs"

    hooks = [block.register_forward_pre_hook(lambda _m, _a, i=i: check(i)) for i, block in enumerate(model.blocks)]
    try:
        for _ in range(2):  # twice: the weights must be back in place after each forward
            for batch in (1, 2):
                seen.clear()
                assert torch.equal(model(**inputs(SMALL, batch)), want[batch])
                # a swapped block runs beside the next swapped one's copy; a resident block
                # waits beside the next swapped block's copy (none after the last)
                expected = []
                for i in range(SMALL.num_layers):
                    later = [j for j in order if j > i]
                    expected.append((i, [i] + later[:1] if i in order else later[:1]))
                assert seen == expected
                assert swapper.blocks_on_device() == []
                assert [p.data_ptr() for p in params] == host_ptrs
    finally:
        for hook in hooks:
            hook.remove()
    swapper.remove()
    assert "run_blocks" not in vars(model) and BlockSwapper.of(model) is None
    assert torch.equal(model(**inputs(SMALL, 2)), want[2])


def test_swapper_on_nf4_layers(folders) -> None:
    plain = disable_cpu_repack(load_nf4_expert(folders["nf4"], "cpu"))
    model = disable_cpu_repack(load_nf4_expert(folders["nf4"], "cpu"))
    swapper = BlockSwapper(model, 2, transfer=SyncTransfer("cpu"))
    for param in swapped_params(model, 2):
        assert type(param).__name__ == "Params4bit" and param.dtype == torch.uint8
        assert param.quant_state is not None
    for batch in (1, 2, 1):
        assert torch.equal(model(**inputs(SMALL, batch)), plain(**inputs(SMALL, batch)))
    swapper.remove()
    assert torch.equal(model(**inputs(SMALL, 1)), plain(**inputs(SMALL, 1)))


def test_an_error_inside_a_block_leaves_the_model_consistent() -> None:
    model = make_synthetic_expert(SMALL, seed=1, dtype=torch.float32)
    want = model(**inputs(SMALL, 1))
    swapper = BlockSwapper(model, 1, transfer=SyncTransfer("cpu"))
    host_ptrs = [p.data_ptr() for p in swapped_params(model, 1)]

    def fail(_module, _args):
        raise RuntimeError("simulated out of memory")

    hook = model.blocks[2].register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="simulated"):
        model(**inputs(SMALL, 1))
    assert swapper.blocks_on_device() == []
    assert [p.data_ptr() for p in swapped_params(model, 1)] == host_ptrs
    hook.remove()
    assert torch.equal(model(**inputs(SMALL, 1)), want)


def test_swapper_needs_cuda_or_a_transfer_and_installs_once(float_model) -> None:
    with pytest.raises(ValueError, match="block swap needs a CUDA device; the model is on cpu"):
        BlockSwapper(float_model, 2)
    with pytest.raises(ValueError, match="resident"):
        BlockSwapper(float_model, -1, transfer=SyncTransfer("cpu"))
    model = make_synthetic_expert(SMALL, seed=1, dtype=torch.float32)
    swapper = BlockSwapper(model, 2, transfer=SyncTransfer("cpu"))
    with pytest.raises(RuntimeError, match="already has a block runner"):
        BlockSwapper(model, 3, transfer=SyncTransfer("cpu"))
    swapper.remove()
    BlockSwapper(model, 3, transfer=SyncTransfer("cpu")).remove()


def test_released_model_frees_its_host_weights() -> None:
    model = make_synthetic_expert(SMALL, seed=1, dtype=torch.float32)
    swapper = BlockSwapper(model, 1, transfer=SyncTransfer("cpu"))
    model(**inputs(SMALL, 1))
    refs = [weakref.ref(p) for p in swapped_params(model, 1)]
    release_module(model)  # what an expert's release does; model and swapper stay referenced
    gc.collect()
    assert all(ref() is None for ref in refs)
    with pytest.raises(RuntimeError, match="released"):
        swapper.run_blocks(torch.zeros(1, 4, SMALL.dim), None, None, None, None)


def test_deleting_a_swapped_model_frees_it_without_the_garbage_collector() -> None:
    model = make_synthetic_expert(SMALL, seed=1, dtype=torch.float32)
    BlockSwapper(model, 2, transfer=SyncTransfer("cpu"))
    model(**inputs(SMALL, 1))
    alive = [weakref.ref(p) for p in model.parameters()]
    gc.disable()
    try:
        del model
        assert sum(ref() is not None for ref in alive) == 0
    finally:
        gc.enable()


# --------------------------------------------------------------------------- loaders

def test_loaders_ignore_block_swap_on_cpu(folders, caplog) -> None:
    x = inputs(SMALL, 2)
    cases = [
        (lambda **k: load_nf4_expert(folders["nf4"], "cpu", **k)),
        (lambda **k: load_bf16_expert(folders["bf16"], "cpu", **k)),
        (lambda **k: load_bf16_expert(folders["bf16"], "cpu", quantize="nf4", **k)),
        (lambda **k: load_expert(folders["nf4"], "cpu", **k)),
    ]
    for load in cases:
        plain = disable_cpu_repack(load())
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            swapped = disable_cpu_repack(load(blocks_on_gpu=2))
        assert "block_swap=2 ignored" in caplog.text
        assert BlockSwapper.of(swapped) is None
        assert all(p.device.type == "cpu" for p in swapped.parameters())
        assert torch.equal(swapped(**x), plain(**x))


class CpuStandIns:
    """Run the loaders' block-swap path on the CPU: no CUDA check, unpinned host memory,
    a SyncTransfer; records the host tensors a loader filled."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.host: dict[str, torch.Tensor] = {}
        self.filled_in_place: bool | None = None
        for module in (nf4_mod, bf16_mod):
            monkeypatch.setattr(module, "resident_blocks", self.resident_blocks)
            monkeypatch.setattr(module, "host_weights_for", self.host_weights_for)
            monkeypatch.setattr(module, "BlockSwapper", self.swapper)

    @staticmethod
    def resident_blocks(blocks_on_gpu, num_layers, device):
        return None if blocks_on_gpu is None or blocks_on_gpu >= num_layers else blocks_on_gpu

    def host_weights_for(self, model, resident, spec, pin=True):
        self.host = bs.host_weights_for(model, resident, spec, pin=False)
        return self.host

    def swapper(self, model, resident, device):
        state = model.state_dict(keep_vars=True)
        self.filled_in_place = bool(self.host) and all(
            state[key].data_ptr() == tensor.data_ptr() and state[key].shape == tensor.shape
            for key, tensor in self.host.items())
        return BlockSwapper(model, resident, device, transfer=SyncTransfer(device))


@pytest.mark.parametrize("kind", ["nf4", "bf16", "bf16->nf4"])
def test_loader_block_swap_path_on_cpu(folders, monkeypatch, kind) -> None:
    load = {
        "nf4": lambda **k: load_nf4_expert(folders["nf4"], "cpu", **k),
        "bf16": lambda **k: load_bf16_expert(folders["bf16"], "cpu", **k),
        "bf16->nf4": lambda **k: load_bf16_expert(folders["bf16"], "cpu", quantize="nf4", **k),
    }[kind]
    plain = disable_cpu_repack(load())
    stand_ins = CpuStandIns(monkeypatch)
    model = disable_cpu_repack(load(blocks_on_gpu=3))
    swapper = BlockSwapper.of(model)
    assert swapper is not None and swapper.resident == 3
    assert stand_ins.filled_in_place, "the loader did not put the swapped weights into the host tensors"
    keys = [k for block in swapped_weight_keys(model, 3) for k in block]
    assert sorted(stand_ins.host) == sorted(keys) and len(keys) == 2 * 14
    for name in {k.rsplit(".", 1)[0] for k in keys}:
        assert isinstance(model.get_submodule(name), Linear4bit) == (kind != "bf16"), name
    for batch in (1, 2):
        assert torch.equal(model(**inputs(SMALL, batch)), plain(**inputs(SMALL, batch)))


def test_expert_sizes_split_between_gpu_and_ram(folders) -> None:
    nf4, bf16 = folders["nf4"], folders["bf16"]
    with safe_open(str(nf4 / "model.safetensors"), framework="pt") as f:
        stored = {k: math.prod(f.get_slice(k).get_shape()) for k in f.keys()}
    with torch.device("meta"):
        meta = LingBotDiT(SMALL)
    for resident in (0, 2, 4):
        keys = [k for block in swapped_weight_keys(meta, resident) for k in block]
        assert expert_host_bytes(nf4, blocks_on_gpu=resident) == sum(stored[k] for k in keys)  # uint8: 1 byte each
        assert expert_size_bytes(nf4, blocks_on_gpu=resident) + expert_host_bytes(nf4, blocks_on_gpu=resident) \
            == expert_size_bytes(nf4)
        numels = [math.prod(meta.state_dict()[k].shape) for k in keys]
        assert expert_host_bytes(bf16, blocks_on_gpu=resident) == 2 * sum(numels)
        assert expert_host_bytes(bf16, "nf4", blocks_on_gpu=resident) == sum((n + 1) // 2 for n in numels)
        packed = sum((n + 1) // 2 for n in numels)
        assert expert_size_bytes(bf16, "nf4", resident) == expert_size_bytes(bf16, "nf4") - packed
    for off in (None, SMALL.num_layers, 99):
        assert expert_host_bytes(nf4, blocks_on_gpu=off) == 0
        assert expert_size_bytes(nf4, blocks_on_gpu=off) == expert_size_bytes(nf4)


# --------------------------------------------------------------------------- CUDA

CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def medium_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return write_synthetic_nf4_expert(tmp_path_factory.mktemp("block_swap_medium") / "nf4", MEDIUM, seed=5,
                                      device="cuda")


def _forward_extra(model: nn.Module, x: dict) -> tuple[torch.Tensor, int]:
    """Output, and the most GPU memory the forward allocated on top of what was there."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = model(**x)
    torch.cuda.synchronize()
    return out, torch.cuda.max_memory_allocated() - before


def _allocated_size(t: torch.Tensor) -> int:
    return -(-t.numel() * t.element_size() // 512) * 512  # the CUDA caching allocator's granularity


def _check_against_resident(folder: Path, config: DiTConfig, residents: list[int], size: int,
                            load=load_nf4_expert, load_slack: int | None = None) -> None:
    """Outputs equal to the fully resident model's for B=1 and B=2, repeated; at most two
    swapped blocks on the GPU during a forward, so less GPU memory in all."""
    xs = {b: inputs(config, b, CUDA, size) for b in (1, 2)}
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    full = load(folder, CUDA)
    full_weights = torch.cuda.memory_allocated() - base
    want, extra_full = {}, {}
    for b, x in xs.items():
        want[b], extra_full[b] = _forward_extra(full, x)
        assert torch.equal(full(**x), want[b]), "the resident model itself is not deterministic"
    del full

    for resident in residents:
        # Measured afresh: a forward may leave lasting runtime allocations (library
        # workspaces) that are not the loader's.
        gc.collect()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        model = load(folder, CUDA, blocks_on_gpu=resident)
        load_peak = torch.cuda.max_memory_allocated() - base
        weights = torch.cuda.memory_allocated() - base
        swapper = BlockSwapper.of(model)
        assert swapper is not None and swapper.resident == resident
        assert swapper._transfer.stream != torch.cuda.current_stream()
        params = swapped_params(model, resident)
        assert params and all(p.device.type == "cpu" and p.is_pinned() for p in params)
        for block in model.blocks:
            for _, layer in swappable_weights(block):
                state = getattr(layer.weight, "quant_state", None)
                assert state is None or state.absmax.device.type == "cuda"
                assert layer.bias is None or layer.bias.device.type == "cuda"
        swapped = config.num_layers - resident
        block_alloc = max(sum(_allocated_size(layer.weight) for _, layer in swappable_weights(model.blocks[i]))
                          for i in swapper.swapped)
        assert weights <= full_weights - swapper.host_bytes(), (resident, weights, full_weights)
        if load_slack is not None:  # the swapped weights never went to the GPU, not even while loading
            assert load_peak <= full_weights - swapper.host_bytes() + load_slack, (resident, load_peak)

        for _ in range(2):
            for b, x in xs.items():
                out, extra = _forward_extra(model, x)
                assert torch.equal(out, want[b]), (
                    f"K={resident} B={b}: max |diff| {float((out - want[b]).abs().max())}")
                assert swapper.blocks_on_device() == []
                assert all(p.device.type == "cpu" for p in params)
                # Two swapped blocks at most (the one computing and the one arriving).
                assert extra - extra_full[b] <= min(2, swapped) * block_alloc + 16 * 1024, \
                    (resident, b, extra, extra_full[b], block_alloc)
                if swapped > 2:
                    assert weights + extra < full_weights + extra_full[b]

        with torch.inference_mode():  # as the sampler calls it
            assert torch.equal(model(**xs[1]), want[1])
        assert all(p.device.type == "cpu" and p.is_pinned() for p in params)

        swapper.remove()
        assert BlockSwapper.of(model) is None and all(p.device.type == "cuda" for p in model.parameters())
        assert torch.equal(model(**xs[2]), want[2])
        del model, swapper, params
        gc.collect()
        torch.cuda.empty_cache()


@pytest.mark.gpu
def test_cuda_small_nf4_matches_resident(folders) -> None:
    _check_against_resident(folders["nf4"], SMALL, [0, 1, 3, 4], size=8)


@pytest.mark.gpu
def test_cuda_medium_nf4_matches_resident_and_saves_memory(medium_folder) -> None:
    _check_against_resident(medium_folder, MEDIUM, [0, 2, 5], size=16, load_slack=2 * 1024**2)


@pytest.mark.gpu
@pytest.mark.parametrize("quantize", [None, "nf4"])
def test_cuda_bf16_loader_matches_resident(folders, quantize) -> None:
    _check_against_resident(folders["bf16"], SMALL, [1, 3], size=8,
                            load=functools.partial(load_bf16_expert, quantize=quantize))


@pytest.mark.gpu
def test_cuda_swapper_on_a_resident_model_moves_weights_to_pinned_ram() -> None:
    model = make_synthetic_expert(SMALL, seed=2, device=CUDA)
    x = inputs(SMALL, 2, CUDA)
    want = model(**x)
    before = torch.cuda.memory_allocated()
    swapper = BlockSwapper(model, 2)
    gc.collect()
    freed = before - torch.cuda.memory_allocated()
    assert freed >= swapper.host_bytes()  # the GPU copies are gone
    assert all(p.device.type == "cpu" and p.is_pinned() for p in swapped_params(model, 2))
    assert torch.equal(model(**x), want) and torch.equal(model(**x), want)
    swapper.remove()
    assert torch.equal(model(**x), want)


@pytest.mark.gpu
def test_cuda_error_inside_a_block_frees_the_gpu_copies(folders) -> None:
    model = load_nf4_expert(folders["nf4"], CUDA, blocks_on_gpu=1)
    x = inputs(SMALL, 1, CUDA)
    want = model(**x)
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()

    def fail(_module, _args):
        raise RuntimeError("simulated out of memory")

    hook = model.blocks[3].register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="simulated"):
        model(**x)
    hook.remove()
    gc.collect()
    torch.cuda.synchronize()
    assert BlockSwapper.of(model).blocks_on_device() == []
    assert all(p.device.type == "cpu" for p in swapped_params(model, 1))
    assert torch.cuda.memory_allocated() <= baseline
    assert torch.equal(model(**x), want)
