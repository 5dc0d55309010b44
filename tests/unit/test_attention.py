"""Per-run attention backend choice: scoped to the run, auto's rule by GPU generation."""
from __future__ import annotations

import threading

import pytest
import torch

from comfyui_lingbot_world.wan.runtime import attention as attn, switches
from triton_interpreter import run_interpreted


@pytest.mark.parametrize("capability,installed,expected", [
    ((9, 0), {"sage"}, "sdpa"),  # Hopper: SDPA measured faster than sageattention 1.0.6
    ((10, 0), {"sage"}, "sdpa"),
    ((8, 9), {"sage"}, "sage"),  # RTX 40
    ((8, 6), {"sage"}, "sage"),  # RTX 30
    ((8, 6), set(), "sdpa"),
    ((8, 0), {"sage"}, "sdpa"),  # A100: not known faster
    (None, {"sage", "fa3", "fa2"}, "sdpa"),  # CPU
    ((9, 0), {"fa3", "sage"}, "flash"),  # FlashAttention 3 in bf16 on Hopper
    ((8, 9), {"fa3", "sage"}, "sage"),  # FA3's kernels are built for sm90 only
    ((10, 0), {"fa3"}, "sdpa"),
    ((8, 0), {"fa2"}, "flash"),  # flash-attn 2 below Hopper
    ((8, 6), {"fa2", "sage"}, "sage"),
    ((9, 0), {"fa2"}, "sdpa"),
    ((7, 5), {"fa2"}, "sdpa"),  # flash-attn 2 needs Ampere
])
def test_auto_rule(capability, installed, expected):
    assert attn.auto_backend(capability, installed) == expected


def test_auto_serves_a_sequence_parallel_run_only_with_a_backend_that_can(monkeypatch):
    row = attn.ATTENTION_BACKENDS["sage"]
    monkeypatch.setitem(attn.ATTENTION_BACKENDS, "sage",
                        attn.AttentionBackend(**{**row.__dict__, "supports_sequence_parallel": False}))
    assert attn.auto_backend((8, 9), {"sage"}) == "sage"
    assert attn.auto_backend((8, 9), {"sage"}, sequence_parallel=True) == "sdpa"
    assert attn.auto_backend((8, 9), {"sage", "fa2"}, sequence_parallel=True) == "flash"
    monkeypatch.setattr(attn, "installed_kernels", lambda: frozenset({"sage"}))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (8, 9))
    cuda = torch.device("cuda", 0)
    assert attn.decide("sage", cuda) == "sage"
    with pytest.raises(ValueError, match="attention 'sage' cannot run here: sage cannot run a sequence-parallel model; "
                                         "what runs here: sdpa; choose sdpa or auto"):
        attn.decide("sage", cuda, sequence_parallel=True)


def test_the_environment_decides_auto_and_an_explicit_choice_wins(monkeypatch):
    monkeypatch.setattr(attn, "installed_kernels", lambda: frozenset({"sage"}))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (8, 9))
    cuda = torch.device("cuda", 0)
    monkeypatch.delenv(switches.ATTENTION.name, raising=False)
    assert attn.decide("auto", cuda) == attn.decide(None, cuda) == "sage"
    monkeypatch.setenv(switches.ATTENTION.name, " SDPA ")
    assert attn.decide("auto", cuda) == "sdpa" and attn.decide("sage", cuda) == "sage"
    monkeypatch.setenv(switches.ATTENTION.name, "flash")  # not installed: refused naming the variable and what runs
    with pytest.raises(ValueError, match=r"^LINGBOT_ATTENTION=flash cannot run here: flash-attn .* cannot be "
                                         r"imported; what runs here: sdpa, sage; unset LINGBOT_ATTENTION"):
        attn.decide("auto", cuda)
    monkeypatch.setenv(switches.ATTENTION.name, "xformers")
    with pytest.raises(ValueError, match="LINGBOT_ATTENTION='xformers' is not a value it takes: one of sdpa, flash"):
        attn.decide("auto", cuda)
    assert attn.decide("sdpa", cuda) == "sdpa"  # an explicit choice does not read it


def test_choice_is_scoped_to_the_block_and_thread(monkeypatch):
    monkeypatch.delenv(switches.ATTENTION.name, raising=False)
    attn.reset_backend_choice()
    seen = {}
    with attn.attention_backend("auto"):
        assert attn.backend_name("cpu") == "sdpa"
        other = threading.Thread(target=lambda: seen.setdefault("thread", attn.run_choice()))
        other.start()
        other.join()
        assert attn.run_choice() == "auto"
    assert attn.run_choice() is None
    assert seen["thread"] is None  # another thread (another run) does not see this run's choice


def test_bad_or_impossible_choices_are_refused():
    with pytest.raises(ValueError, match="xformers"):
        with attn.attention_backend("xformers"):
            pass
    q = torch.randn(1, 4, 2, 8)
    with attn.attention_backend("sage"), pytest.raises(ValueError, match="sage needs a CUDA GPU.*what runs here: sdpa"):
        attn.attention(q, q, q)


def test_sdpa_choice_matches_the_default_on_cpu(monkeypatch):
    monkeypatch.delenv(switches.ATTENTION.name, raising=False)
    attn.reset_backend_choice()
    q, k, v = (torch.randn(1, 6, 2, 8) for _ in range(3))
    with attn.attention_backend("sdpa"):
        chosen = attn.attention(q, k, v)
    assert torch.equal(chosen, attn.attention(q, k, v))


def test_per_head_fp8_operands_are_scaled_by_each_heads_absmax():
    from comfyui_lingbot_world.wan.runtime import weights8
    g = torch.Generator().manual_seed(0)
    size = torch.tensor([0.01, 1.0, 300.0])[None, None, :, None]
    x = torch.randn(2, 50, 3, 16, generator=g) * size
    x[1, :, 0] = 0  # an all-zero head: the tiny scale, zeros back
    values, scales = weights8.quantize_heads(x.bfloat16())
    assert values.dtype == torch.float8_e4m3fn and values.shape == x.shape and scales.shape == (2, 3)
    amax = x.bfloat16().float().abs().amax(dim=(1, 3))
    torch.testing.assert_close(scales, amax.clamp(min=1e-12) / 448, rtol=0, atol=0)
    restored = values.float() * scales[:, None, :, None]
    # e4m3 keeps 3 mantissa bits: each value within half a step (1/16 relative) of its input,
    # near zero within the head's smallest step
    error = (restored - x.bfloat16().float()).abs()
    assert bool((error <= x.bfloat16().float().abs() / 16 + scales[:, None, :, None] * 2.0 ** -9).all())
    assert float(values.float().abs().amax()) == 448  # every non-zero head reaches the top of the range
    assert not restored[1, :, 0].any()
    with pytest.raises(ValueError, match="heads"):
        weights8.quantize_heads(torch.randn(50, 48))


@pytest.mark.parametrize("capability,runs", [((9, 0), True), ((8, 9), False), ((10, 0), False), (None, True)])
def test_fp8_attention_is_hopper_only(capability, runs, monkeypatch):
    assert attn.ATTENTION_BACKENDS["flash_fp8"].runs_on("cuda", capability) is runs
    assert not attn.ATTENTION_BACKENDS["flash_fp8"].runs_on("cpu")
    if capability is not None and not runs:
        monkeypatch.setattr(attn, "installed_kernels", lambda: frozenset({"fa3"}))
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: capability)
        with pytest.raises(ValueError, match=rf"compute capability 9\.0 .* is {capability[0]}\.{capability[1]}"):
            attn.decide("flash_fp8", torch.device("cuda", 0))


def test_fp8_attention_is_never_auto_and_refused_on_the_cpu(monkeypatch):
    assert attn.auto_backend((9, 0), {"fa3", "fa2", "sage"}) == "flash"
    q = torch.randn(1, 4, 2, 128)
    with attn.attention_backend("flash_fp8"), pytest.raises(ValueError, match="flash_fp8 needs a CUDA GPU"):
        attn.attention(q, q, q)
    monkeypatch.setenv(switches.ATTENTION.name, "flash_fp8")
    try:
        with pytest.raises(ValueError, match="LINGBOT_ATTENTION=flash_fp8 cannot run here: flash_fp8 needs a CUDA"):
            attn.attention(q, q, q)
    finally:
        monkeypatch.delenv(switches.ATTENTION.name)
        attn.reset_backend_choice()


_INTERPRETED_AMAX = """
import torch
from comfyui_lingbot_world.wan.runtime import triton_kernels as k
g = torch.Generator().manual_seed(0)
for shape in ((1, 130, 3, 16), (2, 64, 5, 24), (1, 1, 2, 8)):
    x = torch.randn(*shape, generator=g) * torch.arange(1, shape[2] + 1)[None, None, :, None]
    for dtype in (torch.float32, torch.bfloat16):
        t = x.to(dtype)
        assert torch.equal(k.head_amax(t), t.abs().amax(dim=(1, 3)).float()), (shape, dtype)
        wider = torch.zeros(*shape[:2], shape[2] + 2, shape[3], dtype=dtype)[:, :, 1:-1]
        wider.copy_(t)
        assert torch.equal(k.head_amax(wider), t.abs().amax(dim=(1, 3)).float()), (shape, dtype, "view")
        values = k.scale_heads_fp8(t, k.head_amax(t).clamp(min=1e-12) / 448, 448.0)
        assert values.dtype == torch.float8_e4m3fn and values.shape == t.shape
try:
    k.head_amax(torch.randn(1, 5, 3, 8).transpose(1, 2).contiguous().transpose(1, 2))
except ValueError as exc:
    assert "contiguous" in str(exc)
else:
    raise AssertionError("a token-strided tensor was taken")
print("ok")
"""


def test_per_head_absmax_kernel_under_the_cpu_interpreter():
    """The Triton absmax of ``quantize_heads`` equals the definition's (a maximum is exact, so
    Triton's CPU interpreter checks it bit for bit; the fp8 cast is checked on the GPU:
    tests/gpu/test_attention_fp8_cuda.py)."""
    run_interpreted(_INTERPRETED_AMAX)
