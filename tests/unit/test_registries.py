"""Every row of the tables where the next engineer adds things reaches a working implementation
(docs/architecture.md, "Where to add things"): checkpoint layouts, GEMM kinds, attention
backends, samplers and the ``devices`` modes, each run on tiny inputs on the CPU where it can run
there (rows that need CUDA: tests/gpu/test_weights8_cuda.py; the modes' runs on CPU slots and
gloo ranks: tests/unit/test_placement.py, tests/unit/test_parallel_pool.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comfyui_lingbot_world.loaders.expert_size import expert_host_bytes, expert_size_bytes
from comfyui_lingbot_world.loaders.fp8 import convert_to_fp8
from comfyui_lingbot_world.loaders.layout import LAYOUTS, detect_expert_layout, layout_of
from comfyui_lingbot_world.loaders.weight_kind import convert_linear, host_spec
from comfyui_lingbot_world.pipeline import placement as devices_table
from comfyui_lingbot_world.tools.synthetic.dit import write_synthetic_bf16_expert, write_synthetic_nf4_expert
from comfyui_lingbot_world.wan.config import TINY
from comfyui_lingbot_world.wan.runtime import attention as attn
from comfyui_lingbot_world.wan.runtime.dense import GEMM_KINDS, dense, gemm_kind, runs_on
from comfyui_lingbot_world.wan.scheduler import SAMPLER_CLASSES, SAMPLERS, make_sampler


def inputs(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(1, 16, 2, 8, 8, generator=g),
        "t": torch.tensor([730.0]),
        "context": torch.randn(1, 7, TINY.text_dim, generator=g),
        "y": torch.randn(1, 20, 2, 8, 8, generator=g),
        "camera": torch.randn(1, 384, 2, 8, 8, generator=g),
    }


# --------------------------------------------------------------------------- checkpoint layouts

@pytest.fixture(scope="module")
def layout_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("layouts")
    bf16 = write_synthetic_bf16_expert(root / "high_noise_model", TINY, seed=3)
    folders = {
        "bf16": bf16,
        "nf4": write_synthetic_nf4_expert(root / "high_noise_model_bnb_nf4", TINY, seed=3),
        "fp8": convert_to_fp8(bf16, root / "high_noise_model_fp8"),
    }
    assert set(folders) == set(LAYOUTS), "a new layout row needs a folder in this fixture"
    return folders


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_layout_row_is_recognised_read_sized_and_loaded(layout_folders, name: str) -> None:
    folder = layout_folders[name]
    row = LAYOUTS[name]
    assert detect_expert_layout(folder) == name and layout_of(folder) is row
    config = row.read_config(folder)
    assert config.num_layers == TINY.num_layers and config.control_type == "cam"
    with row.open(folder, "cpu") as source:
        assert "blocks.0.self_attn.q.weight" in source.keys()
        assert row.linear_weight_bytes(source, "blocks.0.self_attn.q.weight") > 0
    files = sum(p.stat().st_size for p in folder.iterdir() if p.suffix == ".safetensors")
    assert expert_size_bytes(folder) == files  # as stored: its files
    assert expert_host_bytes(folder, None, 1) > 0  # block swap sizes come from the row too
    model = row.load(folder, "cpu", quantize=None, blocks_on_gpu=None)
    kinds = {gemm_kind(m).name for m in model.modules() if isinstance(m, nn.Linear)}
    assert kinds == {row.stored_kind}
    with torch.no_grad():
        out = model(**inputs())
    assert out.shape == inputs()["x"].shape and torch.isfinite(out).all()


def test_layouts_agree_with_each_other(layout_folders) -> None:
    """The same synthetic weights in three layouts give nearly the same forward."""
    with torch.no_grad():
        outs = {name: LAYOUTS[name].load(folder, "cpu")(**inputs()) for name, folder in layout_folders.items()}
    reference = outs["bf16"]
    for name, bound in (("nf4", 0.4), ("fp8", 0.1)):
        error = (outs[name] - reference).norm() / reference.norm()
        assert error < bound, f"{name}: relative error {error:.3f} against bf16"
    assert (outs["fp8"] - reference).norm() < (outs["nf4"] - reference).norm()  # 8 bits beat 4


# --------------------------------------------------------------------------- GEMM kinds

@pytest.mark.parametrize("kind", list(GEMM_KINDS))
def test_each_gemm_kind_row_multiplies(kind: str) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 48).requires_grad_(False)
    row = GEMM_KINDS[kind]
    layer = row.make(linear, torch.bfloat16)
    assert gemm_kind(layer).name == kind
    x = torch.randn(3, 10, 64)
    expected = F.linear(x, linear.weight, linear.bias)
    if not runs_on(kind, None):
        pytest.skip(f"{kind} does not run on the CPU")
    got = dense(layer)(x.to(torch.bfloat16)).float()
    error = (got - expected).norm() / expected.norm()
    assert error < (0.12 if kind == "nf4" else 0.05), f"{kind}: relative error {error:.4f}"
    buffer = torch.empty(30, 48, dtype=torch.bfloat16)
    dense(layer)(x.reshape(30, 64), out=buffer)
    torch.testing.assert_close(buffer.float(), dense(layer)(x.reshape(30, 64)).float())
    assert row.weight_bytes(48, 64) > 0
    # What the loaders read of the row (loaders/weight_kind.py): the float weight back, the
    # tensor block swap keeps in pinned RAM, a layer of every other kind made from this one.
    back = row.float_weight(layer).float()
    assert back.shape == (48, 64) and (back - linear.weight).norm() / linear.weight.norm() < 0.12
    assert host_spec(kind, 48, 64) == (tuple(layer.weight.shape), layer.weight.dtype)
    for other in GEMM_KINDS:
        converted = convert_linear(layer, other)
        assert gemm_kind(converted).name == other and (converted is layer) is (other == kind)


def test_gemm_capabilities() -> None:
    assert runs_on("fp8", (9, 0)) and runs_on("fp8", (8, 9)) and not runs_on("fp8", (8, 6))
    assert runs_on("int8", (8, 0)) and not runs_on("int8", (7, 5))
    assert runs_on("bf16", (7, 5)) and runs_on("nf4", (7, 5))


def test_unknown_weight_kind_names_the_table() -> None:
    layer = nn.Linear(4, 4)
    layer.weight = nn.Parameter(torch.zeros(4, 4, dtype=torch.int16), requires_grad=False)
    with pytest.raises(TypeError, match="GEMM_KINDS"):
        dense(layer)


# --------------------------------------------------------------------------- attention backends

@pytest.mark.parametrize("name", list(attn.ATTENTION_BACKENDS))
def test_each_attention_backend_row(name: str) -> None:
    backend = attn.ATTENTION_BACKENDS[name]
    assert name in attn.CHOICES and backend.name == name
    assert backend.supports_sequence_parallel  # all three attend whole heads
    assert attn.require_sequence_parallel(name) is backend
    if not backend.runs_on("cpu"):
        assert backend.devices == ("cuda",)
        pytest.skip(f"{name} needs CUDA (tests/gpu/test_weights8_cuda.py)")
    kernel = backend.load()
    assert kernel is not None
    q, k, v = (torch.randn(1, 6, 2, 8) for _ in range(3))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / 8 ** 0.5
    expected = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)
    torch.testing.assert_close(kernel(q, k, v), expected, rtol=1e-5, atol=1e-5)


def test_sequence_parallel_refuses_a_backend_without_the_flag(monkeypatch) -> None:
    row = attn.ATTENTION_BACKENDS["sage"]
    monkeypatch.setitem(attn.ATTENTION_BACKENDS, "sage",
                        attn.AttentionBackend(**{**row.__dict__, "supports_sequence_parallel": False}))
    with pytest.raises(ValueError, match="sequence-parallel.*sdpa"):
        attn.require_sequence_parallel("sage")
    with pytest.raises(ValueError, match="one of"):
        attn.require_sequence_parallel("nope")


# --------------------------------------------------------------------------- samplers

@pytest.mark.parametrize("name", list(SAMPLER_CLASSES))
def test_each_sampler_row_steps(name: str) -> None:
    assert SAMPLERS == tuple(SAMPLER_CLASSES)
    sampler = make_sampler(name, steps=4, shift=5.0)
    assert isinstance(sampler, SAMPLER_CLASSES[name])
    g = torch.Generator().manual_seed(0)
    target = torch.randn(2, 3, generator=g)
    noise = torch.randn(2, 3, generator=g)
    sigma = float(sampler.sigmas[0])
    sample = (1 - sigma) * target + sigma * noise  # on the straight path at the first sigma
    for i in range(len(sampler)):  # the exact flow of a model that knows the answer
        sample = sampler.step(noise - target, i, sample)
    torch.testing.assert_close(sample, target, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- devices modes (several GPUs)

@pytest.mark.parametrize("name", list(devices_table.DEVICES_MODES))
def test_each_devices_row_is_offered_decided_and_built(name: str) -> None:
    row = devices_table.DEVICES_MODES[name]
    assert row.name == name and row.strategy in devices_table.STRATEGIES
    assert row.models and set(row.models) <= set(devices_table.MODELS)
    cpus = [torch.device("cpu")] * 8  # eight "GPUs"
    for model in devices_table.MODELS:
        offered = name in devices_table.devices_choices(model)
        assert offered == (model in row.models)
        if not offered:
            continue
        decision = devices_table.decide_devices(name, model, cpus, 40, "8 CPU devices", float)
        assert decision.mode is row and row.gpus <= len(decision.devices) <= (row.max_gpus or len(cpus))
        if row.auto_when is not None:
            assert devices_table.auto_mode(model, row.auto_when) is row
    if row.experts is not None:  # a split of the experts in this process: a placement with its switch
        plan = devices_table.placement_on(name, decision.devices)
        assert all(slot < len(plan.devices) for expert in ("high", "low") for slot in plan.slots(expert))
        assert plan.switch("high", "low").load == tuple(("low", slot) for slot in plan.slots("low"))
    if row.strategy == "ulysses":  # one forward over the group: its degrees divide the heads
        degrees = devices_table.split_degrees(len(decision.devices))
        degrees.check_heads(40)
        assert degrees.world == len(decision.devices)


def test_every_strategy_has_a_row_and_each_loader_one_auto_row_per_situation() -> None:
    used = {row.strategy for row in devices_table.DEVICES_MODES.values()}
    assert used == set(devices_table.STRATEGIES)
    for model in devices_table.MODELS:
        for situation in devices_table.AUTO_SITUATIONS:
            assert model in devices_table.auto_mode(model, situation).models
