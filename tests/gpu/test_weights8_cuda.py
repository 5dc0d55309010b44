"""The 8-bit GEMMs on CUDA (fp8 ``torch._scaled_mm`` with row-wise scales on sm89+, int8
``torch._int_mm`` on sm80+) against the same operands in float32 and against the bf16
product; a Fast-shaped model in fp8 with block swap; the table rows that need CUDA.
The CPU twins: tests/unit/test_weights8.py and tests/unit/test_registries.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comfyui_lingbot_world.loaders.fp8 import convert_to_fp8
from comfyui_lingbot_world.pipeline.experts import load_expert, weight_kind_for
from comfyui_lingbot_world.tools.synthetic.dit import write_synthetic_bf16_expert
from comfyui_lingbot_world.wan.config import DiTConfig
from comfyui_lingbot_world.wan.runtime import attention as attn
from comfyui_lingbot_world.wan.runtime.block_swap import BlockSwapper
from comfyui_lingbot_world.wan.runtime.dense import GEMM_KINDS, dense, gemm_kind, runs_on
from comfyui_lingbot_world.wan.runtime.weights8 import Linear8bit, PRODUCTS, quantize_rows

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
# Small, but with every dimension a multiple of 16, so the 8-bit kernels run (no fallback).
SHAPED = DiTConfig(dim=256, ffn_dim=512, freq_dim=256, text_dim=64, num_heads=2, num_layers=4)


def _capability() -> tuple[int, int]:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return torch.cuda.get_device_capability()


def _need(kind: str) -> None:
    capability = _capability()
    if not runs_on(kind, capability):
        pytest.skip(f"{kind} needs compute capability {GEMM_KINDS[kind].min_capability}, this card is {capability}")


@pytest.mark.parametrize("kind", ["fp8", "int8"])
@pytest.mark.parametrize("tokens", [4680, 37])
def test_cuda_8bit_product_against_float_and_bf16(kind: str, tokens: int) -> None:
    _need(kind)
    gen = torch.Generator(device=CUDA).manual_seed(0)
    x = torch.randn(tokens, 512, device=CUDA, generator=gen)
    w = torch.randn(256, 512, device=CUDA, generator=gen) / 16
    bias = torch.randn(256, device=CUDA, generator=gen).to(torch.bfloat16)
    values, scales = quantize_rows(w, kind)
    got = PRODUCTS[kind](x, values, scales, bias)
    xq, xs = quantize_rows(x, kind)
    exact = (xq.float() * xs[:, None]) @ (values.float() * scales[:, None]).t() + bias.float()
    torch.testing.assert_close(got.float(), exact, rtol=2e-2, atol=2e-2)
    bf16 = F.linear(x.bfloat16(), w.bfloat16(), bias).float()
    assert float((got.float() - bf16).norm() / bf16.norm()) < (0.06 if kind == "fp8" else 0.02)
    # The CPU computes the same product from the same operands (the kernel is the only difference).
    cpu = PRODUCTS[kind](x.cpu(), values.cpu(), scales.cpu(), bias.cpu())
    torch.testing.assert_close(got.cpu().float(), cpu.float(), rtol=2e-2, atol=2e-2)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    root = tmp_path_factory.mktemp("weights8_cuda")
    bf16 = write_synthetic_bf16_expert(root / "lingbot_world_fast", SHAPED, seed=2)
    return {"bf16": bf16, "fp8": convert_to_fp8(bf16, root / "lingbot_world_fast_fp8", "cuda")}


def _inputs() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(1, 16, 2, 8, 8, generator=g), "t": torch.tensor([730.0]),
            "context": torch.randn(1, 7, SHAPED.text_dim, generator=g),
            "y": torch.randn(1, 20, 2, 8, 8, generator=g), "camera": torch.randn(1, 384, 2, 8, 8, generator=g)}


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_model_in_8bit_on_cuda_with_and_without_block_swap(folders, kind: str) -> None:
    _need(kind)
    inputs = {k: v.cuda() for k, v in _inputs().items()}
    with torch.no_grad():
        reference = load_expert(folders["bf16"], CUDA)(**inputs).float()
        whole = load_expert(folders["bf16"], CUDA, quantize=kind)
        assert {gemm_kind(m).name for m in whole.modules() if isinstance(m, nn.Linear)} == {kind}
        got = whole(**inputs).float()
        swapped = load_expert(folders["fp8"] if kind == "fp8" else folders["bf16"], CUDA, quantize=kind,
                              blocks_on_gpu=1)
        assert BlockSwapper.of(swapped) is not None and BlockSwapper.of(swapped).host_bytes() > 0
        got_swapped = swapped(**inputs).float()
    assert float((got - reference).norm() / reference.norm()) < 0.1
    torch.testing.assert_close(got_swapped, got, rtol=0, atol=0)  # block swap moves bytes, not values


def test_auto_on_this_card(folders) -> None:
    capability = _capability()
    kind = weight_kind_for(folders["bf16"], CUDA, "auto", None)
    expected = "fp8" if capability >= (8, 9) else "int8" if capability >= (8, 0) else None
    assert kind == expected


@pytest.mark.parametrize("name", [n for n, b in attn.ATTENTION_BACKENDS.items() if not b.runs_on("cpu")])
def test_cuda_attention_rows(name: str) -> None:
    _capability()
    backend = attn.ATTENTION_BACKENDS[name]
    kernel = backend.load()
    if kernel is None:
        pytest.skip(f"{backend.package} is not installed")
    q, k, v = (torch.randn(1, 64, 2, 128, device=CUDA, dtype=torch.bfloat16) for _ in range(3))
    expected = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(kernel(q, k, v).float(), expected.float(), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("kind", list(GEMM_KINDS))
def test_cuda_gemm_rows(kind: str) -> None:
    _need(kind)
    linear = nn.Linear(512, 256).to(CUDA)
    if GEMM_KINDS[kind].make is not None:
        layer = GEMM_KINDS[kind].make(linear, torch.bfloat16)
    else:
        from comfyui_lingbot_world.loaders.nf4 import quantize_linear
        layer = quantize_linear(linear)
    x = torch.randn(4680, 512, device=CUDA)
    expected = linear(x).float().detach()
    got = dense(layer)(x.bfloat16()).float()
    assert float((got - expected).norm() / expected.norm()) < (0.12 if kind == "nf4" else 0.06)
    assert isinstance(layer, Linear8bit) == (kind in ("fp8", "int8"))
