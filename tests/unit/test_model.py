"""LingBotDiT: official key names, meta construction, and numerical agreement with
independent implementations (ComfyUI's own Wan model and a functional restatement of the
camera path written here from docs/conventions.md#dit-forward). Tiny geometry, CPU, float32 unless noted."""
from __future__ import annotations

import copy
import math
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from comfy_host import comfy_root
from comfyui_lingbot_world.wan.runtime import attention as attention_mod, switches
from comfyui_lingbot_world.wan.config import A14B, TINY, DiTConfig
from comfyui_lingbot_world.wan.model import LingBotDiT

GRID = (3, 4, 6)  # latent F, H, W -> 3 x 2 x 3 = 18 tokens


# ----------------------------------------------------------------------------- helpers
def official_shapes(cfg: DiTConfig) -> dict[str, tuple[int, ...]]:
    """State-dict keys and shapes of an official expert, written from
    docs/conventions.md#checkpoint-layouts and config.json."""
    d, pt, ph, pw = cfg.dim, *cfg.patch_size

    def linear(name: str, n_in: int, n_out: int) -> dict[str, tuple[int, ...]]:
        return {f"{name}.weight": (n_out, n_in), f"{name}.bias": (n_out,)}

    shapes = {"patch_embedding.weight": (d, cfg.in_dim, pt, ph, pw), "patch_embedding.bias": (d,)}
    shapes |= linear("patch_embedding_wancamctrl", 6 * 64 * pt * ph * pw, d)
    shapes |= linear("c2ws_hidden_states_layer1", d, d) | linear("c2ws_hidden_states_layer2", d, d)
    shapes |= linear("text_embedding.0", cfg.text_dim, d) | linear("text_embedding.2", d, d)
    shapes |= linear("time_embedding.0", cfg.freq_dim, d) | linear("time_embedding.2", d, d)
    shapes |= linear("time_projection.1", d, 6 * d)
    for i in range(cfg.num_layers):
        b = f"blocks.{i}."
        for attn in ("self_attn", "cross_attn"):
            for proj in "qkvo":
                shapes |= linear(f"{b}{attn}.{proj}", d, d)
            shapes[f"{b}{attn}.norm_q.weight"] = (d,)
            shapes[f"{b}{attn}.norm_k.weight"] = (d,)
        shapes[f"{b}norm3.weight"] = (d,)
        shapes[f"{b}norm3.bias"] = (d,)
        shapes |= linear(f"{b}ffn.0", d, cfg.ffn_dim) | linear(f"{b}ffn.2", cfg.ffn_dim, d)
        shapes[f"{b}modulation"] = (1, 6, d)
        for cam in ("cam_injector_layer1", "cam_injector_layer2", "cam_scale_layer", "cam_shift_layer"):
            shapes |= linear(f"{b}{cam}", d, d)
    shapes |= linear("head.head", d, pt * ph * pw * cfg.out_dim)
    shapes["head.modulation"] = (1, 2, d)
    return shapes


CAMERA_PREFIXES = ("patch_embedding_wancamctrl.", "c2ws_hidden_states_layer")
CAMERA_BLOCK_PARTS = (".cam_injector_layer", ".cam_scale_layer", ".cam_shift_layer")


def is_camera_key(key: str) -> bool:
    return key.startswith(CAMERA_PREFIXES) or any(p in key for p in CAMERA_BLOCK_PARTS)


def random_model(cfg: DiTConfig = TINY, seed: int = 0) -> LingBotDiT:
    """Random weights with non-trivial biases and norm gains (init_weights zeroes/ones them)."""
    g = torch.Generator().manual_seed(seed)
    model = LingBotDiT(cfg)
    model.init_weights(generator=g)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1 + 0.2 * noise)
            else:
                p.add_(0.05 * noise)
    return model.eval()


def inputs(batch: int, cfg: DiTConfig = TINY, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    f, h, w = GRID
    x = torch.randn(batch, 16, f, h, w, generator=g)
    y = torch.randn(batch, 20, f, h, w, generator=g)
    t = torch.tensor([937.25, 412.5, 3.0])[:batch]
    context = [torch.randn(n, cfg.text_dim, generator=g) for n in (7, 12, 3)[:batch]]
    plucker = torch.randn(1, 384, f, h, w, generator=g)
    return x, t, context, y, plucker


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# ------------------------------------------------------------- functional restatement
def functional_forward(sd: dict[str, torch.Tensor], cfg: DiTConfig, x, t, context, y, plucker=None):
    """The DiT forward of docs/conventions.md#dit-forward in plain torch ops, float32, from the state dict alone.
    RoPE via complex numbers, camera patchify via einops, attention as explicit softmax."""
    dim, heads, eps = cfg.dim, cfg.num_heads, cfg.eps
    hd = dim // heads
    p1, p2, p3 = cfg.patch_size

    def lin(v, name):
        return v @ sd[f"{name}.weight"].T + sd[f"{name}.bias"]

    def rms(v, name):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * sd[name]

    def attend(q, k, v):  # [B, L, heads, hd]
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
        return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).flatten(2)

    lat = F.conv3d(torch.cat([x, y], 1), sd["patch_embedding.weight"], sd["patch_embedding.bias"],
                   stride=cfg.patch_size)
    b, _, f, h, w = lat.shape
    hs = rearrange(lat, "b c f h w -> b (f h w) c")

    half = cfg.freq_dim // 2
    phase = t.double()[:, None] * torch.pow(10000.0, -torch.arange(half, dtype=torch.float64) / half)
    sinus = torch.cat([phase.cos(), phase.sin()], 1).float()
    e = lin(F.silu(lin(sinus, "time_embedding.0")), "time_embedding.2")
    e0 = lin(F.silu(e), "time_projection.1").view(b, 6, dim)

    ctx = torch.stack([F.pad(c, (0, 0, 0, cfg.text_len - c.shape[0])) for c in context])
    ctx = lin(F.gelu(lin(ctx, "text_embedding.0"), approximate="tanh"), "text_embedding.2")

    # 3-D RoPE: head dim split d - 4(d//6), 2(d//6), 2(d//6) for frame, height, width.
    axis_dims = (hd - 4 * (hd // 6), 2 * (hd // 6), 2 * (hd // 6))
    per_axis = []
    for n, length in zip(axis_dims, (f, h, w)):
        ang = torch.outer(torch.arange(length, dtype=torch.float64),
                          1.0 / 10000.0 ** (torch.arange(0, n, 2, dtype=torch.float64) / n))
        per_axis.append(torch.polar(torch.ones_like(ang), ang))
    cis = torch.cat([per_axis[0][:, None, None].expand(f, h, w, -1),
                     per_axis[1][None, :, None].expand(f, h, w, -1),
                     per_axis[2][None, None, :].expand(f, h, w, -1)], -1).reshape(f * h * w, 1, -1)

    def rope(v):
        c = torch.view_as_complex(v.double().reshape(*v.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(c * cis).flatten(-2).float()

    cam = None
    if plucker is not None:
        cam = rearrange(plucker, "b c (f p1) (h p2) (w p3) -> b (f h w) (c p1 p2 p3)", p1=p1, p2=p2, p3=p3)
        cam = lin(cam, "patch_embedding_wancamctrl")
        cam = cam + lin(F.silu(lin(cam, "c2ws_hidden_states_layer1")), "c2ws_hidden_states_layer2")

    for i in range(cfg.num_layers):
        p = f"blocks.{i}."
        m = sd[p + "modulation"] + e0  # [B, 6, dim]: shift, scale, gate (attn); shift, scale, gate (ffn)
        a = F.layer_norm(hs, (dim,), eps=eps) * (1 + m[:, 1:2]) + m[:, 0:1]
        q = rope(rms(lin(a, p + "self_attn.q"), p + "self_attn.norm_q.weight").unflatten(-1, (heads, hd)))
        k = rope(rms(lin(a, p + "self_attn.k"), p + "self_attn.norm_k.weight").unflatten(-1, (heads, hd)))
        v = lin(a, p + "self_attn.v").unflatten(-1, (heads, hd))
        hs = hs + lin(attend(q, k, v), p + "self_attn.o") * m[:, 2:3]
        if cam is not None:
            hid = lin(F.silu(lin(cam, p + "cam_injector_layer1")), p + "cam_injector_layer2") + cam
            hs = (1 + lin(hid, p + "cam_scale_layer")) * hs + lin(hid, p + "cam_shift_layer")
        a = F.layer_norm(hs, (dim,), sd[p + "norm3.weight"], sd[p + "norm3.bias"], eps)
        q = rms(lin(a, p + "cross_attn.q"), p + "cross_attn.norm_q.weight").unflatten(-1, (heads, hd))
        k = rms(lin(ctx, p + "cross_attn.k"), p + "cross_attn.norm_k.weight").unflatten(-1, (heads, hd))
        v = lin(ctx, p + "cross_attn.v").unflatten(-1, (heads, hd))
        hs = hs + lin(attend(q, k, v), p + "cross_attn.o")
        a = F.layer_norm(hs, (dim,), eps=eps) * (1 + m[:, 4:5]) + m[:, 3:4]
        hs = hs + lin(F.gelu(lin(a, p + "ffn.0"), approximate="tanh"), p + "ffn.2") * m[:, 5:6]

    hm = sd["head.modulation"] + e[:, None]
    out = lin(F.layer_norm(hs, (dim,), eps=eps) * (1 + hm[:, 1:2]) + hm[:, 0:1], "head.head")
    return rearrange(out, "b (f h w) (p1 p2 p3 c) -> b c (f p1) (h p2) (w p3)",
                     f=f, h=h, w=w, p1=p1, p2=p2, p3=p3)


# --------------------------------------------------------------------------- tests
def test_meta_construction_is_free_and_keys_are_official():
    with torch.device("meta"):
        model = LingBotDiT(A14B)
    params = dict(model.named_parameters())
    assert all(p.is_meta for p in params.values())
    assert list(model.buffers()) == []
    expected = official_shapes(A14B)
    sd = model.state_dict()
    assert sorted(sd) == sorted(expected)
    assert {k: tuple(v.shape) for k, v in sd.items()} == expected
    # docs/conventions.md#the-model: ~18.5 B parameters per expert.
    assert 18.0e9 < sum(p.numel() for p in params.values()) < 19.0e9
    # Loaders swap linears by name: each official linear must be exactly nn.Linear.
    for key in expected:
        if key.endswith(".bias") and "norm" not in key and key != "patch_embedding.bias":
            assert type(model.get_submodule(key[: -len(".bias")])) is nn.Linear, key


def test_tiny_keys_and_no_rope_state():
    model = random_model()
    x, t, context, y, _ = inputs(1)
    with torch.no_grad():
        model(x, t, context, y)
    assert sorted(model.state_dict()) == sorted(official_shapes(TINY))
    assert list(model.buffers()) == []


def _comfy_wan():
    root = comfy_root()
    if root is None:
        pytest.skip("ComfyUI host not available")
    if str(root) not in sys.path:
        sys.path.append(str(root))
    import comfy.cli_args

    if not torch.cuda.is_available():
        comfy.cli_args.args.cpu = True  # ComfyUI probes CUDA at import otherwise
    import comfy.ldm.wan.model
    import comfy.ops

    assert str(root) in comfy.ldm.wan.model.__file__
    return comfy.ldm.wan.model.WanModel, comfy.ops.disable_weight_init


def test_matches_comfyui_wan_model_without_camera():
    WanModel, ops = _comfy_wan()
    cfg = TINY
    ours = random_model(cfg)
    # ComfyUI calls Wan2.2 I2V-A14B "t2v" with 36 input channels (no CLIP image branch).
    theirs = WanModel(model_type="t2v", patch_size=cfg.patch_size, text_len=cfg.text_len, in_dim=cfg.in_dim,
                      dim=cfg.dim, ffn_dim=cfg.ffn_dim, freq_dim=cfg.freq_dim, text_dim=cfg.text_dim,
                      out_dim=cfg.out_dim, num_heads=cfg.num_heads, num_layers=cfg.num_layers,
                      window_size=cfg.window_size, qk_norm=cfg.qk_norm, cross_attn_norm=cfg.cross_attn_norm,
                      eps=cfg.eps, device="cpu", dtype=torch.float32, operations=ops)
    stock = {k: v for k, v in ours.state_dict().items() if not is_camera_key(k)}
    theirs.load_state_dict(stock, strict=True)
    theirs.eval()

    x, t, context, y, _ = inputs(2)
    padded = torch.stack([F.pad(c, (0, 0, 0, cfg.text_len - c.shape[0])) for c in context])
    with torch.no_grad():
        expected = theirs(torch.cat([x, y], 1), t, padded)
        got = ours(x, t, context, y)
    assert got.shape == expected.shape == (2, 16, *GRID)
    assert got.dtype == torch.float32
    assert rel_err(got, expected) < 1e-4
    assert expected.norm() > 1  # weights are not degenerate


def test_camera_path_matches_functional_restatement():
    model = random_model()
    x, t, context, y, plucker = inputs(2)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    with torch.no_grad():
        tokens = model.prepare_camera(plucker)
        got = model(x, t, context, y, camera_tokens=tokens)
        expected = functional_forward(sd, TINY, x, t, context, y, plucker.expand(2, -1, -1, -1, -1))
        plain = functional_forward(sd, TINY, x, t, context, y)
        via_plucker = model(x, t, context, y, camera=plucker)
    assert tokens.shape == (1, math.prod(s // p for s, p in zip(GRID, TINY.patch_size)), TINY.dim)
    assert rel_err(got, expected) < 1e-5
    assert torch.equal(got, via_plucker)
    assert rel_err(plain, expected) > 1e-2  # the camera really changes the prediction


def test_zero_camera_scale_and_shift_equal_no_camera():
    model = random_model()
    x, t, context, y, plucker = inputs(1)
    with torch.no_grad():
        for block in model.blocks:
            for layer in (block.cam_scale_layer, block.cam_shift_layer):
                layer.weight.zero_()
                layer.bias.zero_()
        no_camera = model(x, t, context, y)
        zero_camera = model(x, t, context, y, camera=plucker)
        # A random (not constant) shift: a constant one would vanish in the next LayerNorm.
        model.blocks[-1].cam_shift_layer.bias.normal_(0, 0.1, generator=torch.Generator().manual_seed(5))
        shifted = model(x, t, context, y, camera=plucker)
    assert torch.allclose(zero_camera, no_camera, rtol=0, atol=1e-6)
    assert not torch.allclose(shifted, no_camera, atol=1e-3)


def test_batch_of_two_equals_two_single_runs():
    model = random_model()
    x, t, context, y, plucker = inputs(2)
    with torch.no_grad():
        tokens = model.prepare_camera(plucker)  # batch 1, broadcast over both samples
        both = model(x, t, context, y, camera_tokens=tokens)
        single = [model(x[i:i + 1], t[i:i + 1], [context[i]], y[i:i + 1], camera_tokens=tokens) for i in range(2)]
        padded = torch.stack([F.pad(c, (0, 0, 0, 12 - c.shape[0])) for c in context])
        from_tensor = model(x, t, padded, y, camera_tokens=tokens)
    assert both.shape == (2, 16, *GRID)
    for i in range(2):
        assert rel_err(both[i], single[i][0]) < 1e-5
    assert rel_err(from_tensor, both) < 1e-6
    assert rel_err(both[0], both[1]) > 1e-2


def test_token_chunking_is_exact():
    model = random_model()
    x, t, context, y, plucker = inputs(2)
    with torch.no_grad():
        whole = model(x, t, context, y, camera=plucker)
        for block in model.blocks:
            block.token_chunk = 2  # chunks of 2 tokens
        chunked = model(x, t, context, y, camera=plucker)
    assert rel_err(chunked, whole) < 1e-6


def test_bf16_weights_run_close_to_float32():
    model = random_model()
    x, t, context, y, plucker = inputs(2)
    half = copy.deepcopy(model).to(torch.bfloat16)
    with torch.no_grad():
        ref = model(x, t, context, y, camera=plucker)
        tokens = half.prepare_camera(plucker.to(torch.bfloat16))
        out = half(x, t, [c.to(torch.bfloat16) for c in context], y.to(torch.bfloat16), camera_tokens=tokens)
    assert tokens.dtype == torch.bfloat16
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 5e-2


def test_bitsandbytes_linear4bit_swap_runs_like_dequantized_weights():
    bnb = pytest.importorskip("bitsandbytes")
    model = random_model()
    quantized = copy.deepcopy(model)
    dequantized = copy.deepcopy(model)
    names = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        source = model.get_submodule(name)
        q = bnb.nn.Linear4bit(source.in_features, source.out_features, bias=True,
                              compute_dtype=torch.float32, quant_type="nf4")
        q.weight = bnb.nn.Params4bit(source.weight.detach().clone(), requires_grad=False, quant_type="nf4")
        q.bias = nn.Parameter(source.bias.detach().clone(), requires_grad=False)
        q = q.to("cpu")
        setattr(quantized.get_submodule(parent_name) if parent_name else quantized, child, q)
        with torch.no_grad():
            dequantized.get_submodule(name).weight.copy_(
                bnb.functional.dequantize_4bit(q.weight.data, q.weight.quant_state))
    assert quantized.get_submodule("blocks.0.self_attn.q").weight.dtype == torch.uint8
    x, t, context, y, plucker = inputs(1)
    with torch.no_grad():
        got = quantized(x, t, context, y, camera=plucker)
        expected = dequantized(x, t, context, y, camera=plucker)
    assert rel_err(got, expected) < 1e-5


def test_init_weights_is_seeded():
    a, b = LingBotDiT(TINY), LingBotDiT(TINY)
    a.init_weights(torch.Generator().manual_seed(3))
    b.init_weights(torch.Generator().manual_seed(3))
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert a.head.head.weight.abs().sum() > 0


def test_input_validation_names_the_field():
    model = random_model()
    x, t, context, y, plucker = inputs(1)
    with torch.no_grad():
        with pytest.raises(ValueError, match="input channels"):
            model(x, t, context)
        with pytest.raises(ValueError, match="text_len"):
            model(x, t, [torch.zeros(TINY.text_len + 1, TINY.text_dim)], y)
        with pytest.raises(ValueError, match="camera_tokens"):
            model(x, t, context, y, camera_tokens=torch.zeros(1, 5, TINY.dim))
        with pytest.raises(ValueError, match="multiple of the patch"):
            model(x[..., :3], t, context, y[..., :3])


# ------------------------------------------------------------------------ attention
@pytest.fixture
def fresh_backend(monkeypatch):
    monkeypatch.delenv(switches.ATTENTION.name, raising=False)
    attention_mod.reset_backend_choice()
    yield monkeypatch
    attention_mod.reset_backend_choice()


def test_attention_default_sdpa_matches_softmax(fresh_backend):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 3, 8, generator=g) for n in (5, 9, 9))
    out = attention_mod.attention(q, k, v)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(8)
    expected = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)
    assert attention_mod.backend_name("cpu") == "sdpa"
    assert out.shape == (2, 5, 3, 8)
    assert torch.allclose(out, expected, atol=1e-6)


def test_attention_env_override_errors_are_clear(fresh_backend):
    q = torch.randn(1, 4, 2, 8)
    fresh_backend.setenv(switches.ATTENTION.name, "flash")
    with pytest.raises(ValueError, match="LINGBOT_ATTENTION=flash cannot run here: flash needs a CUDA GPU"):
        attention_mod.attention(q, q, q)
    attention_mod.reset_backend_choice()
    fresh_backend.setenv(switches.ATTENTION.name, "turbo")
    with pytest.raises(ValueError, match="turbo"):
        attention_mod.attention(q, q, q)
    attention_mod.reset_backend_choice()
    fresh_backend.setenv(switches.ATTENTION.name, "sdpa")
    assert attention_mod.attention(q, q, q).shape == q.shape
