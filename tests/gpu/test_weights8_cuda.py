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

from comfyui_lingbot_world.pipeline.experts import load_expert, weight_kind_for
from comfyui_lingbot_world.wan.runtime import attention as attn
from comfyui_lingbot_world.wan.runtime.block_swap import BlockSwapper
from comfyui_lingbot_world.wan.runtime.dense import GEMM_KINDS, dense, gemm_kind, runs_on
from comfyui_lingbot_world.wan.runtime import fused, switches, weights8
from comfyui_lingbot_world.wan.runtime.weights8 import Linear8bit, quantize_activation, quantize_rows
from fast_helpers import SHAPED, shaped_bf16_and_fp8

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


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
    got = GEMM_KINDS[kind].product(x, values, scales, bias)
    xq, xs = quantize_rows(x, kind)
    exact = (xq.float() * xs[:, None]) @ (values.float() * scales[:, None]).t() + bias.float()
    # Same 8-bit operands: only the float32 summation order and the bf16 output rounding
    # (2^-9 relative, |y| < ~8 here) separate the kernel from the float32 product.
    torch.testing.assert_close(got.float(), exact, rtol=2e-2, atol=2e-2)
    bf16 = F.linear(x.bfloat16(), w.bfloat16(), bias).float()
    deviation = float((got.float() - bf16).norm() / bf16.norm())
    # The deviation the kind costs. e4m3 keeps 3 mantissa bits: round to nearest errs by at
    # most 2^-4 relative, RMS ≈ 2^-3 / sqrt(12) / 1.44 ≈ 0.025 for a value anywhere in its
    # binade (per-row absmax scaling keeps the Gaussian bulk far above the subnormals).
    # Both operands are rounded independently: each term x_k w_k errs by ≈ 0.025·√2 ≈ 0.036
    # RMS, and over K terms the errors add incoherently as the terms do, so the product's
    # relative error is ≈ 0.036 (measured 0.0375 on an H200 at K = 5120). int8 (step 1/127 of
    # the row's absmax): ≈ 0.0126. The bounds leave 1.6× headroom and still catch a wrong or
    # misplaced scale, which costs ≥ 0.5.
    assert deviation < (0.06 if kind == "fp8" else 0.02), f"{kind} x{tokens}: {deviation:.4f} from the bf16 product"
    # The CPU computes the same product from the same operands (the kernel is the only
    # difference; PyTorch's CPU _scaled_mm took only per-tensor scales up to at least 2.10,
    # where fp8_linear applies the row and column scales after a unit-scale product).
    cpu = GEMM_KINDS[kind].product(x.cpu(), values.cpu(), scales.cpu(), bias.cpu())
    torch.testing.assert_close(got.cpu().float(), cpu.float(), rtol=2e-2, atol=2e-2)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return shaped_bf16_and_fp8(tmp_path_factory.mktemp("weights8_cuda"), seed=2)


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
    # Every linear of the 4-layer model (attention, cross-attention, FFN, camera) adds its
    # product's deviation (fp8 ≈ 0.0375, int8 ≈ 0.0126 relative, see the test above) and the
    # residual stream carries them on: the output's deviation is that per-product deviation
    # times an amplification set by the synthetic weights, measured ≈ 3.1 on an H200 (fp8:
    # 0.1167). The bounds are about 1.7× (fp8) and 2.5× (int8) that; a wrong scale costs ≥ 0.5
    # at its first linear and compounds from there.
    deviation = float((got - reference).norm() / reference.norm())
    assert deviation < (0.2 if kind == "fp8" else 0.1), f"{kind}: the model deviates {deviation:.4f} from bf16"
    torch.testing.assert_close(got_swapped, got, rtol=0, atol=0)  # block swap moves bytes, not values


def test_auto_on_this_card(folders) -> None:
    capability = _capability()
    kind = weight_kind_for(folders["bf16"], CUDA, "auto", None)
    expected = "fp8" if capability >= (8, 9) else "int8" if capability >= (8, 0) else None
    assert kind == expected


@pytest.mark.parametrize("name", [n for n, b in attn.ATTENTION_BACKENDS.items() if not b.runs_on("cpu")])
def test_cuda_attention_rows(name: str) -> None:
    capability = _capability()
    backend = attn.ATTENTION_BACKENDS[name]
    if not backend.runs_on("cuda", capability):
        pytest.skip(f"{name} does not run on compute capability {capability}")
    kernel = backend.load()
    if kernel is None:
        pytest.skip(f"{backend.package} is not installed")
    q, k, v = (torch.randn(1, 64, 2, 128, device=CUDA, dtype=torch.bfloat16) for _ in range(3))
    expected = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    got = kernel(q, k, v).float()
    if name == "flash_fp8":  # q, k, v rounded to 3 mantissa bits: the whole output within 8 %, not each value
        assert float((got - expected.float()).norm() / expected.float().norm()) < 0.08
        return
    torch.testing.assert_close(got, expected.float(), rtol=5e-2, atol=5e-2)


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


def _activation(rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator(device=CUDA).manual_seed(rows + dim)
    x = torch.randn(rows, dim, device=CUDA, generator=gen)
    x *= torch.logspace(-4, 3, rows, device=CUDA)[:, None]  # rows of very different size
    x[rows // 2] = 0  # an all-zero row: the tiny scale, no division by zero
    x[-1, : dim // 2] = 1.5  # bf16 int8: 1.5 times bf16(127 / 3) = 63.375, a tie rounded to 63.5,
    x[-1, dim // 2:] = -3.0  # then a tie for torch.round (half to even: 64)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("kind", ["fp8", "int8"])
@pytest.mark.parametrize("rows, dim, column_offset", [(4680, 5120, 0), (37, 13824, 0), (5, 300, 0), (64, 5120, 16)])
def test_triton_activation_quantizer_equals_pytorch_bit_for_bit(dtype, kind, rows, dim, column_offset) -> None:
    """One Triton pass per row against quantize_activation's PyTorch ops on the same GPU:
    the same bytes and the same float32 scales (column_offset: rows with a stride wider
    than the row, as a column slice gives)."""
    _capability()
    from comfyui_lingbot_world.wan.runtime import triton_kernels

    wide = _activation(rows, dim + column_offset, dtype)
    x = wide[:, column_offset:]
    values, scales = triton_kernels.quantize_rows_8bit(x, kind, weights8._RANGE[kind], weights8._TINY)
    expected_values, expected_scales = weights8.quantize_activation_pytorch(x, kind)
    assert values.dtype == expected_values.dtype and values.shape == (rows, dim)
    assert torch.equal(scales, expected_scales), (
        f"scales differ in {int((scales != expected_scales).sum())} rows, most by "
        f"{float(((scales - expected_scales).abs() / expected_scales).max()):.3g} relative")
    mismatch = values.view(torch.uint8) != expected_values.view(torch.uint8)
    assert not mismatch.any(), (
        f"{int(mismatch.sum())} of {values.numel()} values differ; largest difference "
        f"{float((values.float() - expected_values.float()).abs().max())} (in units of the row's scale)")


def test_quantize_activation_takes_the_kernel_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    _capability()
    from comfyui_lingbot_world.wan.runtime import triton_kernels

    calls = []
    kernel = triton_kernels.quantize_rows_8bit
    monkeypatch.setattr(triton_kernels, "quantize_rows_8bit", lambda *a: calls.append(a) or kernel(*a))
    x = _activation(40, 512, torch.bfloat16)
    values, scales = quantize_activation(x, "fp8")
    assert len(calls) == 1 and "quantize_activation_pytorch" not in fused._broken
    monkeypatch.setenv(switches.FUSED.name, "0")  # the switch back to the PyTorch ops
    eager_values, eager_scales = quantize_activation(x, "fp8")
    assert len(calls) == 1
    assert torch.equal(values.view(torch.uint8), eager_values.view(torch.uint8)) and torch.equal(scales, eager_scales)


@pytest.mark.parametrize("kind", ["fp8", "bf16"])
def test_kept_camera_terms_on_cuda_give_the_same_chunks_bit_for_bit(folders, kind: str) -> None:
    """CameraTerms (wan/runtime/camera_terms.py) on CUDA with the fused kernels: a Fast chunk's
    five forwards with every block's camera terms kept equal the forwards that compute them,
    bit for bit, with block swap too (the CPU twin: tests/unit/test_camera_terms.py)."""
    from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy

    if kind == "fp8":
        _need(kind)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 16, 3, 8, 8, generator=g).cuda()
    y = torch.randn(1, 20, 3, 8, 8, generator=g).cuda()
    plucker = torch.randn(1, 384, 3, 8, 8, generator=g).cuda()
    text = [torch.randn(7, SHAPED.text_dim, generator=g).cuda()]
    results = []
    with torch.no_grad():
        for blocks_on_gpu in (None, 1):
            model = load_expert(folders["fp8"] if kind == "fp8" else folders["bf16"], CUDA,
                                quantize=None if kind == "bf16" else kind, blocks_on_gpu=blocks_on_gpu)
            for keep in (0, SHAPED.num_layers):
                cache = model.new_kv_cache(CachePolicy(window=6, sink=3), 8, 8)
                outs = []
                for chunk in range(2):
                    tokens = model.prepare_camera(plucker, keep_terms=keep)
                    xt = x
                    for t in (999.0, 978.0, 947.0, 825.0):
                        out = model(xt, torch.tensor([t], device=CUDA), text if not outs else None, y=y,
                                    camera_tokens=tokens, kv_cache=cache)
                        outs.append(out)
                        xt = (xt - 0.1 * out).contiguous()
                    model(xt, torch.tensor([0.0], device=CUDA), None, y=y, camera_tokens=tokens, kv_cache=cache,
                          commit=True)
                cache.close()
                results.append(torch.stack(outs))
    for got in results[1:]:
        torch.testing.assert_close(got, results[0], rtol=0, atol=0)
