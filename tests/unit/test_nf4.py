"""NF4 experts (layout A): bitsandbytes quantization written and read back bit for bit."""
from __future__ import annotations

import gc
import json
import shutil
import weakref
from pathlib import Path

import pytest
import torch
from bitsandbytes.functional import dequantize_4bit
from bitsandbytes.nn import Linear4bit
from safetensors import safe_open
from safetensors.torch import load_file

from comfyui_lingbot_world.loaders.layout import read_config
from comfyui_lingbot_world.loaders.nf4 import load_nf4_expert
from comfyui_lingbot_world.tools.synthetic.experts import quantize_linears_, save_nf4_expert
from comfyui_lingbot_world.tools.synthetic.dit import make_synthetic_expert, write_synthetic_nf4_expert
from comfyui_lingbot_world.wan.config import TINY
from comfyui_lingbot_world.wan.model import LingBotDiT

LAYER_SUFFIXES = {
    "weight", "weight.absmax", "weight.quant_map", "weight.nested_absmax", "weight.nested_quant_map",
    "weight.quant_state.bitsandbytes__nf4", "bias",
}


def linear_names(config=TINY) -> list[str]:
    with torch.device("meta"):
        model = LingBotDiT(config)
    return [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def inputs(config=TINY, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(1, 16, 2, 8, 8, generator=g),
        "t": torch.tensor([730.0]),
        "context": torch.randn(1, 7, config.text_dim, generator=g),
        "y": torch.randn(1, 20, 2, 8, 8, generator=g),
        "camera": torch.randn(1, 384, 2, 8, 8, generator=g),
    }


@pytest.fixture(scope="module")
def quantized_and_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[LingBotDiT, Path]:
    model = quantize_linears_(make_synthetic_expert(TINY, seed=1))
    folder = tmp_path_factory.mktemp("nf4") / "high_noise_model_bnb_nf4"
    save_nf4_expert(model, folder, provenance={"source": "unit test"})
    return model, folder


def assert_same_4bit(a: Linear4bit, b: Linear4bit, name: str) -> None:
    qa, qb = a.weight.quant_state, b.weight.quant_state
    assert a.weight.dtype == b.weight.dtype == torch.uint8, name
    assert torch.equal(a.weight.data, b.weight.data), f"{name}: packed bytes differ"
    assert torch.equal(qa.absmax, qb.absmax), name
    assert torch.equal(qa.code, qb.code), name
    assert torch.equal(qa.state2.absmax, qb.state2.absmax), name
    assert torch.equal(qa.state2.code, qb.state2.code), name
    assert float(qa.offset) == float(qb.offset), name
    assert (qa.shape, qa.blocksize, qa.dtype, qa.quant_type) == (qb.shape, qb.blocksize, qb.dtype, qb.quant_type)
    assert torch.equal(a.bias, b.bias), name


def test_round_trip_is_bit_exact_and_computes_the_same(quantized_and_folder) -> None:
    model, folder = quantized_and_folder
    loaded = load_nf4_expert(folder, "cpu")

    names = linear_names()
    for name in names:
        layer = loaded.get_submodule(name)
        assert isinstance(layer, Linear4bit), name
        assert layer.weight.quant_state.quant_type == "nf4" and layer.compute_dtype == torch.bfloat16
        assert_same_4bit(model.get_submodule(name), layer, name)
    plain_model = {k: v for k, v in model.named_parameters() if v.dtype != torch.uint8}
    plain_loaded = dict(loaded.named_parameters())
    for key, value in plain_model.items():
        assert plain_loaded[key].dtype == torch.bfloat16, key
        assert torch.equal(plain_loaded[key], value), key
    assert all(p.device.type == "cpu" and not p.requires_grad for p in loaded.parameters())
    assert not loaded.training

    model.eval()
    with torch.no_grad():
        expected = model(**inputs())
        got = loaded(**inputs())
    assert expected.std() > 0.01  # a real signal, not zeros
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_written_file_follows_layout_a(quantized_and_folder) -> None:
    _, folder = quantized_and_folder
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "quantization_meta.json"]
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        dtypes = {k: f.get_slice(k).get_dtype() for k in keys}
    names = linear_names()
    layer_keys = set()
    for name in names:
        own = {k[len(name) + 1:] for k in keys if k.startswith(name + ".")}
        assert own == LAYER_SUFFIXES, name
        assert dtypes[f"{name}.weight"] == "U8" and dtypes[f"{name}.bias"] == "BF16"
        assert dtypes[f"{name}.weight.quant_state.bitsandbytes__nf4"] == "U8"
        layer_keys |= {f"{name}.{s}" for s in LAYER_SUFFIXES}
    rest = keys - layer_keys
    with torch.device("meta"):
        plain = set(LingBotDiT(TINY).state_dict()) - {f"{n}.weight" for n in names} - {f"{n}.bias" for n in names}
    assert rest == plain
    assert {dtypes[k] for k in rest} == {"BF16"}

    meta = json.loads((folder / "quantization_meta.json").read_text())
    assert {k: meta[k] for k in ("format", "double_quant", "compute_dtype", "blocksize")} == {
        "format": "bnb_nf4", "double_quant": True, "compute_dtype": "bfloat16", "blocksize": 64}
    assert meta["source"] == "unit test" and meta["quantizer"].startswith("bitsandbytes")
    assert read_config(folder) == TINY


def test_quantization_is_faithful_to_the_bf16_weights(tmp_path: Path) -> None:
    model = make_synthetic_expert(TINY, seed=2)
    save_nf4_expert(model, tmp_path / "direct")  # quantizes the plain nn.Linear layers itself
    loaded = load_nf4_expert(tmp_path / "direct", "cpu")
    for name in linear_names():
        original = model.get_submodule(name).weight.float()
        layer = loaded.get_submodule(name)
        restored = dequantize_4bit(layer.weight.data, layer.weight.quant_state).float()
        # NF4 keeps 16 levels per 64-value block: a few per cent of the weight scale.
        assert restored.shape == original.shape
        assert (restored - original).norm() / original.norm() < 0.12, name

    # Writing the plain model or its in-memory quantized copy gives the same file content.
    save_nf4_expert(quantize_linears_(make_synthetic_expert(TINY, seed=2)), tmp_path / "prequantized")
    a, b = load_file(tmp_path / "direct" / "model.safetensors"), load_file(tmp_path / "prequantized" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_legacy_model_pt_loads_the_same(quantized_and_folder, tmp_path: Path) -> None:
    _, folder = quantized_and_folder
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    shutil.copy(folder / "config.json", legacy)
    shutil.copy(folder / "quantization_meta.json", legacy)
    torch.save(load_file(folder / "model.safetensors"), legacy / "model.pt")

    from_pt = load_nf4_expert(legacy, "cpu")
    from_st = load_nf4_expert(folder, "cpu")
    a, b = from_pt.state_dict(), from_st.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with torch.no_grad():
        torch.testing.assert_close(from_pt(**inputs()), from_st(**inputs()), rtol=0, atol=0)


def test_compute_dtype_override(quantized_and_folder) -> None:
    _, folder = quantized_and_folder
    loaded = load_nf4_expert(folder, "cpu", compute_dtype="float32")
    assert loaded.get_submodule("blocks.0.ffn.0").compute_dtype == torch.float32
    assert loaded.blocks[0].modulation.dtype == torch.float32
    assert loaded.get_submodule("blocks.0.ffn.0").bias.dtype == torch.float32


def test_streamed_synthetic_writer_matches_in_memory_model(tmp_path: Path) -> None:
    save_nf4_expert(make_synthetic_expert(TINY, seed=5), tmp_path / "memory")
    write_synthetic_nf4_expert(tmp_path / "stream", TINY, seed=5)
    a, b = load_file(tmp_path / "memory" / "model.safetensors"), load_file(tmp_path / "stream" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    write_synthetic_nf4_expert(tmp_path / "repeated", TINY, seed=5, distinct_blocks=1)
    c = load_file(tmp_path / "repeated" / "model.safetensors")
    block0 = {k[len("blocks.0."):]: v for k, v in c.items() if k.startswith("blocks.0.")}
    block1 = {k[len("blocks.1."):]: v for k, v in c.items() if k.startswith("blocks.1.")}
    assert block0.keys() == block1.keys() and all(torch.equal(block0[k], block1[k]) for k in block0)
    assert torch.equal(c["blocks.0.ffn.0.weight"], a["blocks.0.ffn.0.weight"])
    assert not torch.equal(a["blocks.0.ffn.0.weight"], a["blocks.1.ffn.0.weight"])


def test_dropping_a_loaded_model_frees_it_at_once(quantized_and_folder) -> None:
    """No reference cycles: ``del model`` must free an expert's memory without waiting for the
    garbage collector (one expert resident at a time depends on it)."""
    _, folder = quantized_and_folder
    model = load_nf4_expert(folder, "cpu")
    with torch.no_grad():
        model(**inputs())
    alive = [weakref.ref(p) for p in model.parameters()]
    gc.disable()
    try:
        del model
        assert sum(ref() is not None for ref in alive) == 0
    finally:
        gc.enable()


@pytest.mark.gpu
def test_cuda_load_matches_cpu_load(quantized_and_folder) -> None:
    _, folder = quantized_and_folder
    on_gpu = load_nf4_expert(folder, "cuda")
    assert all(p.device.type == "cuda" for p in on_gpu.parameters())
    for layer in on_gpu.modules():
        if isinstance(layer, Linear4bit):
            state = layer.weight.quant_state
            tensors = (state.absmax, state.code, state.offset, state.state2.absmax, state.state2.code)
            assert all(t.device.type == "cuda" for t in tensors)
    on_cpu = load_nf4_expert(folder, "cpu")
    a, b = on_cpu.state_dict(), on_gpu.state_dict()
    assert all(torch.equal(a[k], b[k].cpu()) for k in a)
    with torch.no_grad():
        x = {k: v.cuda() for k, v in inputs().items()}
        got = on_gpu(**x).cpu()
        expected = on_cpu(**inputs())
    torch.testing.assert_close(got, expected, rtol=0.05, atol=0.05)
