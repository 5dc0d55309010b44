"""loaders/weight_kind.py, one linear layer turned into another weight kind as an expert loads
(on the CPU: bf16, NF4 by bitsandbytes, fp8 and int8 by PyTorch's CPU products): each kind's
layer computes the bf16 layer's product within its format's error, a conversion goes
through the float weight, the bias is kept, a layer of the wanted kind is kept as it is; the
pinned sizes block swap reserves per kind; the refusals. Whole experts loaded as every kind:
test_weights8.py."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from comfyui_lingbot_world.loaders.weight_kind import (
    WEIGHT_KINDS,
    check_kind,
    convert_linear,
    float_weight,
    host_bytes,
    host_spec,
    move_weight_to_host,
)
from comfyui_lingbot_world.wan.runtime.dense import gemm_kind

# Relative error of each kind's product against the bf16 layer's (4-bit, then the 8-bit formats).
PRODUCT_ERROR = {"bf16": 0.0, "nf4": 0.15, "fp8": 0.06, "int8": 0.02}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.fixture
def layer() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(64, 32).to(torch.bfloat16).requires_grad_(False)


@pytest.mark.parametrize("kind", WEIGHT_KINDS)
def test_each_kind_computes_the_bf16_product_within_its_formats_error(layer, kind):
    converted = convert_linear(layer, kind)
    assert gemm_kind(converted).name == kind
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    assert _rel(converted(x), layer(x)) <= PRODUCT_ERROR[kind]
    assert torch.equal(converted.bias, layer.bias)


def test_a_layer_of_the_wanted_kind_is_kept_and_another_goes_through_its_float_weight(layer):
    assert convert_linear(layer, "bf16") is layer
    int8 = convert_linear(layer, "int8")
    assert convert_linear(int8, "int8") is int8
    back = convert_linear(int8, "bf16")
    assert type(back) is nn.Linear and torch.equal(back.weight, float_weight(int8).to(torch.bfloat16))
    fp8_of_nf4 = convert_linear(convert_linear(layer, "nf4"), "fp8")  # 4-bit dequantized, then 8-bit
    assert gemm_kind(fp8_of_nf4).name == "fp8"
    assert _rel(float_weight(fp8_of_nf4), layer.weight) < PRODUCT_ERROR["nf4"] + PRODUCT_ERROR["fp8"]


def test_a_layer_without_a_bias_stays_without_one(layer):
    bare = nn.Linear(64, 32, bias=False).to(torch.bfloat16)
    assert all(convert_linear(bare, kind).bias is None for kind in WEIGHT_KINDS)


@pytest.mark.parametrize("kind, shape, dtype, size", [
    ("bf16", (32, 64), torch.bfloat16, 32 * 64 * 2),
    ("fp8", (32, 64), torch.float8_e4m3fn, 32 * 64),
    ("int8", (32, 64), torch.int8, 32 * 64),
    ("nf4", (32 * 64 // 2, 1), torch.uint8, 32 * 64 // 2),  # two 4-bit values per byte
])
def test_the_pinned_weight_of_each_kind_is_what_its_layer_stores(layer, kind, shape, dtype, size):
    assert host_spec(kind, 32, 64) == (shape, dtype) and host_bytes(kind, 32, 64) == size
    stored = convert_linear(layer, kind).weight
    assert (tuple(stored.shape), stored.dtype) == (shape, dtype)


def test_a_weight_moves_into_its_pinned_place_and_a_wrong_place_is_refused(layer):
    int8 = convert_linear(layer, "int8")
    shape, dtype = host_spec("int8", 32, 64)
    host = torch.empty(shape, dtype=dtype)
    values = int8.weight.data.clone()
    move_weight_to_host(int8, host, "blocks.0.ffn.0")
    assert int8.weight.data.data_ptr() == host.data_ptr() and torch.equal(host, values)
    with pytest.raises(RuntimeError, match=r"blocks\.1\.ffn\.0: the weight was built as \(32, 64\) torch.int8, "
                                           r"block swap expected \(64, 32\) torch.int8"):
        move_weight_to_host(convert_linear(layer, "int8"), torch.empty(64, 32, dtype=torch.int8), "blocks.1.ffn.0")


def test_a_kind_outside_the_table_is_refused_naming_the_choices():
    assert check_kind(None) is None and check_kind("fp8") == "fp8"
    with pytest.raises(ValueError, match=r"^weights='fp4': the weight kind must be None \(as stored\) or one of "
                                         r"bf16, nf4, fp8, int8$"):
        check_kind("fp4", "weights")
    with pytest.raises(ValueError, match="quantize='int4'"):
        convert_linear(nn.Linear(4, 4), "int4")
