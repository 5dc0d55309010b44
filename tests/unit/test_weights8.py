"""8-bit weights (fp8 e4m3, int8): the per-channel quantization, the 8-bit × 8-bit products
against the bf16 product (``torch._scaled_mm`` and ``torch._int_mm`` run on the CPU in this
PyTorch), LoRA beside the 8-bit weight, the conversions on load from every layout, the sizes,
and auto's choice of kind. The CUDA kernels: tests/gpu/test_weights8_cuda.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comfyui_lingbot_world.loaders.expert_size import expert_host_bytes, expert_size_bytes
from comfyui_lingbot_world.loaders.fp8 import SCALE_KEY, convert_to_fp8, load_fp8_expert
from comfyui_lingbot_world.loaders.layout import FP8_WEIGHTS_FILE, LAYOUTS
from comfyui_lingbot_world.pipeline.experts import choose_weight_kind, load_expert
from comfyui_lingbot_world.tools.synthetic.dit import write_synthetic_bf16_expert, write_synthetic_nf4_expert
from comfyui_lingbot_world.wan.config import TINY
from comfyui_lingbot_world.wan.runtime.dense import Dense8, dense, gemm_kind
from comfyui_lingbot_world.wan.runtime.lora import LoraFactors, attach_lora, detach_lora, merge_lora
from comfyui_lingbot_world.wan.runtime.weights8 import (
    FP8,
    Linear8bit,
    dequantize_rows,
    fp8_linear,
    int8_linear,
    quantize_activation,
    quantize_rows,
)
from safetensors import safe_open
from triton_interpreter import run_interpreted

KINDS = ("fp8", "int8")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("kind", KINDS)
def test_rows_round_trip_within_the_format_step(kind: str) -> None:
    torch.manual_seed(0)
    w = torch.randn(40, 96) * torch.linspace(0.01, 10, 40)[:, None]  # rows of very different size
    values, scales = quantize_rows(w, kind)
    assert values.dtype == (FP8 if kind == "fp8" else torch.int8) and scales.dtype == torch.float32
    assert values.shape == w.shape and scales.shape == (40,)
    back = dequantize_rows(values, scales, torch.float32)
    # Per row: the largest value is exact-ish, the error bounded by the format's step.
    step = (2 ** -3) if kind == "fp8" else 1 / 127  # e4m3 has 3 mantissa bits
    row_max = w.abs().amax(1, keepdim=True)
    assert ((back - w).abs() <= row_max * step).all()
    assert _rel(back, w) < (0.03 if kind == "fp8" else 0.01)
    zero_values, zero_scales = quantize_rows(torch.zeros(3, 8), kind)  # no division by zero
    assert torch.isfinite(zero_scales).all() and (dequantize_rows(zero_values, zero_scales) == 0).all()
    with pytest.raises(ValueError, match="fp8, int8"):
        quantize_rows(w, "int4")


@pytest.mark.parametrize("kind", KINDS)
def test_8bit_product_against_the_bf16_product(kind: str) -> None:
    """The kernel against its reference: the same 8-bit operands multiplied in float32 (tight),
    and against the bf16 product of the unquantized weight (the deviation the kind costs)."""
    torch.manual_seed(1)
    x = torch.randn(37, 64)
    w = torch.randn(48, 64) / 8
    bias = torch.randn(48).to(torch.bfloat16)
    values, scales = quantize_rows(w, kind)
    product = fp8_linear if kind == "fp8" else int8_linear
    got = product(x, values, scales, bias)
    assert got.dtype == torch.bfloat16 and got.shape == (37, 48)
    xq, xs = quantize_rows(x, kind)
    reference = (xq.float() * xs[:, None]) @ (values.float() * scales[:, None]).t() + bias.float()
    torch.testing.assert_close(got.float(), reference, rtol=2e-2, atol=2e-2)  # bf16 output rounding
    bf16 = F.linear(x.to(torch.bfloat16), w.to(torch.bfloat16), bias)
    deviation = _rel(got, bf16)
    assert deviation < (0.06 if kind == "fp8" else 0.02), f"{kind}: {deviation:.4f} from the bf16 product"


@pytest.mark.parametrize("kind", KINDS)
def test_half_precision_activation_quantization_matches_the_float32_one(kind: str) -> None:
    torch.manual_seed(5)
    x = (torch.randn(50, 256) * torch.linspace(0.1, 30, 50)[:, None]).to(torch.bfloat16)
    values, scales = quantize_activation(x, kind)
    exact_values, exact_scales = quantize_rows(x.float(), kind)
    torch.testing.assert_close(scales, exact_scales)
    back, exact = dequantize_rows(values, scales, torch.float32), dequantize_rows(exact_values, exact_scales,
                                                                                  torch.float32)
    step = 2 ** -3 if kind == "fp8" else 1 / 127
    assert ((back - exact).abs() <= x.float().abs().amax(1, keepdim=True) * step * 1.05).all()  # one step apart at most
    assert _rel(back, x) < (0.03 if kind == "fp8" else 0.01)


@pytest.mark.parametrize("kind", KINDS)
def test_linear8bit_layer_and_dense_agree(kind: str) -> None:
    torch.manual_seed(2)
    linear = nn.Linear(64, 80)
    layer = Linear8bit.from_weight(linear.weight, linear.bias, kind)
    assert isinstance(layer, nn.Linear) and layer.weight.dtype.itemsize == 1  # the bytes stay 8-bit
    assert layer.weight_scale.shape == (80,) and layer.bias.dtype == torch.bfloat16
    x = torch.randn(2, 11, 64)
    d = dense(layer)
    assert isinstance(d, Dense8) and gemm_kind(layer).name == kind and d.dtype == torch.bfloat16
    torch.testing.assert_close(d(x), layer(x))
    out = torch.empty(2, 11, 80, dtype=torch.bfloat16)
    d(x, out=out)
    torch.testing.assert_close(out, layer(x))
    torch.testing.assert_close(d(x, gelu=True), F.gelu(layer(x), approximate="tanh"))
    assert _rel(layer(x), linear(x).detach()) < 0.06
    with pytest.raises(ValueError, match="gelu and out"):
        d(x, out=out, gelu=True)


@pytest.mark.parametrize("kind", KINDS)
def test_lora_is_added_beside_the_8bit_weight(kind: str) -> None:
    torch.manual_seed(3)
    linear = nn.Linear(64, 48)
    layer = Linear8bit.from_weight(linear.weight, linear.bias, kind)
    model = nn.Sequential(layer)
    factors = LoraFactors(down=torch.randn(4, 64) / 8, up=torch.randn(48, 4) / 8, scale=0.5)
    x = torch.randn(20, 64)
    before = dense(layer)(x)
    stored = layer.weight.clone()
    attach_lora(model, {"0": [factors]}, "cpu")
    with_lora = dense(layer)(x)
    expected = before.float() + 0.5 * (x @ factors.down.t() @ factors.up.t())
    torch.testing.assert_close(with_lora.float(), expected, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(layer(x).float(), expected, rtol=2e-2, atol=2e-2)  # the layer's own call too
    assert torch.equal(layer.weight.view(torch.uint8), stored.view(torch.uint8))  # never written
    detach_lora(model)
    torch.testing.assert_close(dense(layer)(x), before)
    with pytest.raises(TypeError, match="8-bit"):
        merge_lora(model, {"0": [factors]})


# --------------------------------------------------------------------------- on load

@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("weights8")
    bf16 = write_synthetic_bf16_expert(root / "lingbot_world_fast", TINY, seed=4)
    return {
        "bf16": bf16,
        "nf4": write_synthetic_nf4_expert(root / "lingbot_world_fast_bnb_nf4", TINY, seed=4),
        "fp8": convert_to_fp8(bf16, root / "lingbot_world_fast_fp8"),
    }


def _inputs(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(1, 16, 2, 8, 8, generator=g), "t": torch.tensor([730.0]),
            "context": torch.randn(1, 7, TINY.text_dim, generator=g), "y": torch.randn(1, 20, 2, 8, 8, generator=g),
            "camera": torch.randn(1, 384, 2, 8, 8, generator=g)}


def _kinds(model: nn.Module) -> set[str]:
    return {gemm_kind(m).name for m in model.modules() if isinstance(m, nn.Linear)}


def test_fp8_package_file(folders) -> None:
    with safe_open(str(folders["fp8"] / FP8_WEIGHTS_FILE), framework="pt") as f:
        assert f.metadata()["quantization"] == "fp8_e4m3fn_rowwise"
        assert f.get_slice("blocks.0.ffn.0.weight").get_dtype() == "F8_E4M3"
        assert f.get_slice(f"blocks.0.ffn.0.{SCALE_KEY}").get_shape() == [TINY.ffn_dim]
        assert f.get_slice("blocks.0.ffn.0.bias").get_dtype() == "BF16"
    # The package is the quantize-on-load result, bit for bit.
    packaged = load_fp8_expert(folders["fp8"], "cpu")
    on_load = load_expert(folders["bf16"], "cpu", quantize="fp8")
    for (name, a), (_, b) in zip(packaged.named_modules(), on_load.named_modules()):
        if isinstance(a, Linear8bit):
            assert torch.equal(a.weight.view(torch.uint8), b.weight.view(torch.uint8)), name
            assert torch.equal(a.weight_scale, b.weight_scale), name


@pytest.mark.parametrize("source", ["bf16", "nf4", "fp8"])
@pytest.mark.parametrize("kind", ["fp8", "int8", "bf16", "nf4"])
def test_every_layout_loads_as_every_kind(folders, source: str, kind: str) -> None:
    model = load_expert(folders[source], "cpu", quantize=kind)
    assert _kinds(model) == {kind}
    reference = LAYOUTS["bf16"].load(folders["bf16"], "cpu")  # the weights before any quantization
    with torch.no_grad():
        got, expected = model(**_inputs()), reference(**_inputs())
    assert torch.isfinite(got).all()
    # What the stored layout cost, plus what the kind costs (measured on these weights:
    # fp8 ~0.09, int8 ~0.02, nf4 ~0.24 relative to bf16).
    bound = {"bf16": 0.0, "nf4": 0.3, "fp8": 0.1}[source] + {"fp8": 0.1, "int8": 0.04, "bf16": 0.01,
                                                                "nf4": 0.3}[kind]
    assert _rel(got, expected) < bound, f"{source} as {kind}"


def test_bf16_kind_of_a_bf16_folder_is_the_stored_model_bit_for_bit(folders) -> None:
    with torch.no_grad():
        a = load_expert(folders["bf16"], "cpu", quantize="bf16")(**_inputs())
        b = load_expert(folders["bf16"], "cpu")(**_inputs())
    assert torch.equal(a, b)


def test_sizes_follow_the_kind(folders) -> None:
    with torch.device("meta"):
        from comfyui_lingbot_world.wan.model import LingBotDiT
        meta = LingBotDiT(TINY)
    linears = [(m.out_features, m.in_features) for m in meta.modules() if isinstance(m, nn.Linear)]
    numel = sum(o * i for o, i in linears)
    rows = sum(o for o, _ in linears)
    bf16 = expert_size_bytes(folders["bf16"])
    assert expert_size_bytes(folders["bf16"], "fp8") == bf16 - 2 * numel + numel + 4 * rows
    assert expert_size_bytes(folders["bf16"], "int8") == expert_size_bytes(folders["bf16"], "fp8")
    fp8 = expert_size_bytes(folders["fp8"])
    assert expert_size_bytes(folders["fp8"], "bf16") == fp8 - numel + 2 * numel
    assert expert_size_bytes(folders["fp8"], "fp8") == fp8
    assert expert_host_bytes(folders["nf4"], "fp8", 1) == expert_host_bytes(folders["bf16"], "fp8", 1) \
        == expert_host_bytes(folders["fp8"], None, 1) > 0
    assert expert_host_bytes(folders["bf16"], None, 1) == 2 * expert_host_bytes(folders["fp8"], None, 1)


# --------------------------------------------------------------------------- auto

GB = 10**9
A14B = {"bf16": 37 * GB, "nf4": int(9.6 * GB), "fp8": int(18.5 * GB), "int8": int(18.5 * GB)}


def _sizes(swapped_share: float = 0.0):
    return lambda kind: int(A14B[kind] * (1 - swapped_share))


@pytest.mark.parametrize("capability, total, share, expected", [
    ((9, 0), 80 * 2**30, 0.0, "fp8"),  # H100: fp8 fits
    ((8, 9), 24 * 2**30, 0.0, None),  # RTX 4090, every block on the GPU: fp8 does not fit, the NF4 folder stays
    ((8, 9), 24 * 2**30, 0.5, "fp8"),  # ... with half the blocks in RAM it does
    ((8, 6), 24 * 2**30, 0.5, "int8"),  # RTX 3090: no fp8 tensor cores
    ((8, 6), 12 * 2**30, 0.0, None),  # 12 GB: only NF4 fits
    ((7, 5), 80 * 2**30, 0.0, "bf16"),  # no 8-bit tensor cores: bf16 where it fits
])
def test_auto_picks_the_fastest_kind_that_runs_and_fits(capability, total, share, expected) -> None:
    assert choose_weight_kind("auto", "nf4", None, capability, _sizes(share), total) == expected


def test_choices_other_than_auto() -> None:
    # as stored: today's behaviour (bf16 folders follow bf16_quantize; others as they are)
    assert choose_weight_kind("as stored", "bf16", "nf4", (9, 0), _sizes(), None) == "nf4"
    assert choose_weight_kind("as stored", "nf4", "nf4", (9, 0), _sizes(), None) is None
    assert choose_weight_kind("as stored", "fp8", "nf4", (9, 0), _sizes(), None) is None
    assert choose_weight_kind("auto", "bf16", None, None, _sizes(), None) is None  # off CUDA: as stored
    assert choose_weight_kind("int8", "bf16", None, (8, 6), _sizes(), 24 * 2**30) == "int8"
    assert choose_weight_kind("fp8", "fp8", None, (9, 0), _sizes(), 80 * 2**30) is None  # already fp8
    with pytest.raises(ValueError, match=r"fp8 does not run on a card of compute capability 8\.6.*8\.9"):
        choose_weight_kind("fp8", "nf4", None, (8, 6), _sizes(), 24 * 2**30)
    with pytest.raises(ValueError, match="weights: 'fp16'"):
        choose_weight_kind("fp16", "nf4", None, (9, 0), _sizes(), None)


def test_fp8_bias_added_after_the_product_where_the_kernel_takes_none(monkeypatch) -> None:
    from comfyui_lingbot_world.wan.runtime import weights8

    torch.manual_seed(6)
    x, w, bias = torch.randn(20, 32), torch.randn(16, 32), torch.randn(16).to(torch.bfloat16)
    values, scales = quantize_rows(w, "fp8")
    in_kernel = fp8_linear(x, values, scales, bias)
    monkeypatch.setitem(weights8._BIAS_IN_KERNEL, "cpu", False)
    torch.testing.assert_close(fp8_linear(x, values, scales, bias), in_kernel, rtol=1e-2, atol=1e-2)


# ------------------------------------------------ the activation quantizer's definition and kernel

def _reference_activation_quant(x: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The PyTorch path as it stood before the Triton kernel (bf16: scaled in bf16)."""
    limit = 448.0 if kind == "fp8" else 127.0
    amax = x.abs().amax(dim=1).float().clamp_(min=1e-12)
    scaled = x * (limit / amax).to(x.dtype)[:, None]
    if kind == "int8":
        return scaled.round_().clamp_(-127, 127).to(torch.int8), amax / limit
    return scaled.clamp_(-448, 448).to(FP8), amax / limit


@pytest.mark.parametrize("kind", KINDS)
def test_cpu_activation_quantization_is_the_pytorch_definition(kind: str) -> None:
    torch.manual_seed(6)
    x = (torch.randn(9, 320) * torch.logspace(-4, 2, 9)[:, None]).to(torch.bfloat16)
    x[3] = 0  # an all-zero row
    values, scales = quantize_activation(x, kind)
    expected_values, expected_scales = _reference_activation_quant(x, kind)
    assert torch.equal(values.view(torch.int8), expected_values.view(torch.int8))
    assert torch.equal(scales, expected_scales)
    values32, scales32 = quantize_activation(x.float(), kind)
    rows32 = quantize_rows(x.float(), kind)
    assert torch.equal(values32.view(torch.int8), rows32[0].view(torch.int8)) and torch.equal(scales32, rows32[1])


@pytest.mark.parametrize("kind", KINDS)
def test_fp16_activation_with_small_rows_is_not_saturated(kind: str) -> None:
    """limit / absmax overflows fp16 for rows below ~0.007: such rows are scaled in float32."""
    torch.manual_seed(7)
    x = (torch.randn(4, 64) * 1e-3).to(torch.float16)
    values, scales = quantize_activation(x, kind)
    assert torch.isfinite(scales).all()
    assert _rel(dequantize_rows(values, scales, torch.float32), x.float()) < (0.03 if kind == "fp8" else 0.01)


def test_fp8_product_where_row_wise_scales_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """PyTorch's CPU _scaled_mm took only per-tensor scales up to at least 2.10 (an internal
    assert): the product then runs with unit scales and applies the row and column scales."""
    from comfyui_lingbot_world.wan.runtime import weights8

    torch.manual_seed(8)
    x, w, bias = torch.randn(37, 64), torch.randn(48, 64) / 8, torch.randn(48).to(torch.bfloat16)
    values, scales = quantize_rows(w, "fp8")
    expected = fp8_linear(x, values, scales, bias)
    scaled_mm = torch._scaled_mm

    def per_tensor_only(a, b, scale_a, scale_b, **kwargs):
        if scale_a.numel() != 1 or scale_b.numel() != 1:
            raise RuntimeError("Now _scaled_mm only supports per-tensor scaling for CPU backend.")
        return scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", per_tensor_only)
    monkeypatch.setattr(weights8, "_ROWWISE", {})
    monkeypatch.setattr(weights8, "_BIAS_IN_KERNEL", {})
    got = fp8_linear(x, values, scales, bias)
    assert weights8._ROWWISE == {"cpu": False}
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-2, atol=1e-2)  # bf16 output rounding
    torch.testing.assert_close(fp8_linear(x, values, scales, None).float(), (expected - bias).float(),
                               rtol=2e-2, atol=2e-2)


_INTERPRETED = """
import sys, torch
from comfyui_lingbot_world.wan.runtime import triton_kernels as k
torch.manual_seed(9)
x = (torch.randn(5, 300) * torch.tensor([1e-3, 1.0, 30.0, 0.01, 0.0])[:, None])
bad = []
for dtype in (torch.bfloat16, torch.float32, torch.float16):
    for kind, limit in (("fp8", 448.0), ("int8", 127.0)):
        values, scales = k.quantize_rows_8bit(x.to(dtype), kind, limit, 1e-12)
        # quantize_activation's arithmetic as PyTorch runs it on CUDA (amax / limit there is
        # amax times the float32 reciprocal of limit; the CPU divides).
        amax = x.to(dtype).abs().amax(dim=1).float().clamp(min=1e-12)
        expected_scales = amax * torch.tensor(1 / limit, dtype=torch.float32)
        if not torch.equal(scales, expected_scales):
            bad.append(f"{dtype} {kind} scales")
        expected = (x.to(dtype).float() / expected_scales[:, None]).round().clamp(-127, 127).to(torch.int8)
        if kind == "int8" and dtype != torch.bfloat16 and not torch.equal(values, expected):
            bad.append(f"{dtype} int8 values")
print("BAD", bad)
sys.exit(1 if bad else 0)
"""


def test_triton_quantizer_under_the_cpu_interpreter() -> None:
    """The kernel's scales (every dtype) and int8 values of float32 and fp16 rows equal the
    definition under Triton's CPU interpreter. The interpreter casts to bf16 and fp8 by
    truncation (the GPU rounds half to even), so bf16 rows and fp8 values are checked bit for
    bit only on the GPU: tests/gpu/test_weights8_cuda.py."""
    run_interpreted(_INTERPRETED)


def test_fp8_dense_writes_its_product_into_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dense8(x, out=buffer slice) hands the slice to _scaled_mm (no product tensor and copy)."""
    torch.manual_seed(10)
    linear = nn.Linear(64, 48)
    d = dense(Linear8bit.from_weight(linear.weight, linear.bias, "fp8"))
    x = torch.randn(20, 64).to(torch.bfloat16)
    expected = d(x)
    buffer = torch.zeros(30, 48, dtype=torch.bfloat16)
    scaled_mm, outs = torch._scaled_mm, []

    def recording(*args, **kwargs):
        outs.append(kwargs.get("out"))
        return scaled_mm(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", recording)
    got = d(x, out=buffer[5:25])
    assert outs and outs[-1] is not None and outs[-1].data_ptr() == buffer[5:25].data_ptr()
    assert torch.equal(got, buffer[5:25]) and torch.equal(buffer[5:25], expected)
    assert (buffer[:5] == 0).all() and (buffer[25:] == 0).all()
    with pytest.raises(ValueError, match="contiguous"):
        fp8_linear(x, d.weight, d.scale, d.bias, out=torch.empty(48, 20, dtype=torch.bfloat16).t())


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_q_k_v_quantize_their_shared_input_once_with_the_same_products(folders, kind: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A block's q, k and v read the same normalized tokens: ``shared_input`` quantizes them
    once (two activation quantizations fewer per block and forward) and the products are the
    same bytes, so the output is bit for bit the one that quantizes per product."""
    from comfyui_lingbot_world.wan import model as model_module
    from comfyui_lingbot_world.wan.runtime import weights8

    model = load_expert(folders["bf16"], "cpu", quantize=kind)
    calls = []
    quantize = weights8.quantize_activation
    monkeypatch.setattr(weights8, "quantize_activation", lambda x, k: calls.append(k) or quantize(x, k))

    def run() -> tuple[torch.Tensor, int]:
        calls.clear()
        with torch.no_grad():
            return model(**_inputs()), len(calls)

    shared, shared_calls = run()
    monkeypatch.setattr(model_module, "shared_input", lambda x, *weights: x)
    separate, separate_calls = run()
    assert separate_calls - shared_calls == 2 * TINY.num_layers
    assert torch.equal(shared, separate)
