"""LoRA on the experts: every key format, NF4 and bf16, block swap, malformed files."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from bitsandbytes.nn import Linear4bit
from safetensors.torch import save_file
from torch import nn

from comfyui_lingbot_world.loaders.errors import CheckpointError
from comfyui_lingbot_world.loaders.lora import read_lora
from comfyui_lingbot_world.loaders.nf4 import load_nf4_expert
from comfyui_lingbot_world.tools.synthetic.dit import make_synthetic_expert, write_synthetic_nf4_expert
from comfyui_lingbot_world.pipeline.lora import LoraExperts, LoraSpec
from comfyui_lingbot_world.wan.runtime.block_swap import BlockSwapper, SyncTransfer
from comfyui_lingbot_world.wan.config import DiTConfig
from comfyui_lingbot_world.wan.runtime.dense import dense
from comfyui_lingbot_world.wan.runtime.lora import attach_lora, detach_lora, has_lora, linear_layers, merge_lora

SMALL = DiTConfig(dim=64, ffn_dim=128, freq_dim=32, text_dim=32, num_heads=2, num_layers=3)
RANK, ALPHA = 4, 2.0
# Block layers (the dense() path) and layers outside the blocks (called as layers: the hook).
TARGETS = [f"blocks.{i}.{n}" for i in range(SMALL.num_layers)
           for n in ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q", "cross_attn.o",
                     "ffn.0", "ffn.2", "cam_injector_layer1", "cam_scale_layer")] + ["text_embedding.0", "head.head"]
FORMATS = ("kohya", "peft_prefixed", "peft_bare", "dotted_down_up")


def inputs(batch: int = 2, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    grid = (2, 8, 8)
    return {"x": torch.randn(batch, 16, *grid, generator=g), "t": torch.tensor([730.0, 310.0][:batch]),
            "context": torch.randn(batch, 7, SMALL.text_dim, generator=g),
            "y": torch.randn(batch, 20, *grid, generator=g), "camera": torch.randn(batch, 384, *grid, generator=g)}


def factors(layers: dict[str, tuple[int, int]], seed: int = 9) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return {name: (torch.randn(RANK, layers[name][1], generator=g) * 0.3,
                   torch.randn(layers[name][0], RANK, generator=g) * 0.3) for name in TARGETS}


def write_lora(path: Path, fac: dict, fmt: str, with_alpha: bool = True) -> Path:
    state = {}
    for name, (down, up) in fac.items():
        if fmt == "kohya":
            base, d, u = "lora_unet_" + name.replace(".", "_"), ".lora_down.weight", ".lora_up.weight"
        elif fmt == "peft_prefixed":
            base, d, u = "diffusion_model." + name, ".lora_A.weight", ".lora_B.weight"
        elif fmt == "peft_bare":
            base, d, u = name, ".lora_A.weight", ".lora_B.weight"
        else:
            base, d, u = "diffusion_model." + name, ".lora_down.weight", ".lora_up.weight"
        state[base + d], state[base + u] = down.contiguous(), up.contiguous()
        if with_alpha:
            state[base + ".alpha"] = torch.tensor(ALPHA)
    save_file(state, str(path))
    return path


def scale_of(with_alpha: bool, strength: float) -> float:
    return (ALPHA / RANK if with_alpha else 1.0) * strength


def no_repack(model: nn.Module) -> nn.Module:
    for layer in model.modules():
        if isinstance(layer, Linear4bit):
            layer.support_avx512bf16_for_cpu = False
    return model


def merged_reference(model: nn.Module, fac: dict, scale: float) -> nn.Module:
    """``model`` with every linear a plain layer whose weight is its dense weight + scale * B A."""
    for name, layer in list(model.named_modules()):
        if not isinstance(layer, nn.Linear):
            continue
        d = dense(layer)
        weight = d.weight.clone()
        if name in fac:
            down, up = fac[name]
            weight += (up @ down * scale).to(weight.dtype)
        plain = nn.Linear(layer.in_features, layer.out_features, bias=d.bias is not None, dtype=weight.dtype)
        plain.weight.data, plain.bias.data = weight, d.bias.clone()
        model.set_submodule(name, plain)
    return model


@pytest.fixture(scope="module")
def nf4_folder(tmp_path_factory) -> Path:
    return write_synthetic_nf4_expert(tmp_path_factory.mktemp("lora") / "nf4", SMALL, seed=3)


def build(kind: str, nf4_folder: Path) -> nn.Module:
    if kind == "nf4":
        return no_repack(load_nf4_expert(nf4_folder, "cpu"))
    return make_synthetic_expert(SMALL, seed=1, dtype=torch.bfloat16 if kind == "bf16" else torch.float32)


def close(a: torch.Tensor, b: torch.Tensor, base: torch.Tensor) -> None:
    """a == b to a tolerance far below the LoRA's own effect (b - base)."""
    effect = (b.float() - base.float()).abs().max().item()
    err = (a.float() - b.float()).abs().max().item()
    assert effect > 0.05, f"the LoRA barely changes the output ({effect})"
    assert err < 0.05 * effect, f"LoRA output differs from the merged reference by {err} (effect {effect})"


@pytest.mark.parametrize("kind", ["nf4", "bf16", "float32"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("swap", [False, True])
def test_lora_equals_merged_reference(tmp_path, nf4_folder, kind, fmt, swap):
    model = build(kind, nf4_folder)
    layers = linear_layers(model)
    fac = factors(layers)
    with_alpha = fmt != "peft_bare"
    path = write_lora(tmp_path / f"{fmt}.safetensors", fac, fmt, with_alpha)
    strength = 0.8
    with torch.inference_mode():
        base = model(**inputs())
        reference = merged_reference(build(kind, nf4_folder), fac, scale_of(with_alpha, strength))(**inputs())
    weights_before = {n: p.clone() for n, p in model.named_parameters()}
    attach_lora(model, read_lora(path, model, strength).adapters)
    swapper = BlockSwapper(model, 1, transfer=SyncTransfer("cpu")) if swap else None
    with torch.inference_mode():
        got = model(**inputs())
        again = model(**inputs())
    close(got, reference, base)
    assert torch.equal(got, again)
    if swapper:
        swapper.remove()
    assert all(torch.equal(p, weights_before[n]) for n, p in model.named_parameters())  # 4-bit/bf16 untouched
    assert detach_lora(model) == len(TARGETS) and not has_lora(model)
    with torch.inference_mode():
        assert torch.equal(model(**inputs()), base)


@pytest.mark.parametrize("kind", ["bf16", "float32"])
def test_merged_equals_unmerged(tmp_path, nf4_folder, kind):
    model = build(kind, nf4_folder)
    layers = linear_layers(model)
    fac = factors(layers)
    adapters = read_lora(write_lora(tmp_path / "l.safetensors", fac, "kohya"), model, 1.0).adapters
    with torch.inference_mode():
        base = model(**inputs())
    attach_lora(model, adapters)
    with torch.inference_mode():
        unmerged = model(**inputs())
    detach_lora(model)
    merge_lora(model, adapters)
    with torch.inference_mode():
        merged = model(**inputs())
    close(unmerged, merged, base)


def test_merge_refuses_4bit(tmp_path, nf4_folder):
    model = build("nf4", nf4_folder)
    layers = linear_layers(model)
    adapters = read_lora(write_lora(tmp_path / "l.safetensors", factors(layers), "kohya"), model).adapters
    with pytest.raises(TypeError, match="quantized"):
        merge_lora(model, adapters)


def _malformed(tmp_path: Path, layers: dict, what: str) -> tuple[Path, str]:
    fac = factors(layers)
    path = tmp_path / f"{what}.safetensors"
    write_lora(path, fac, "peft_prefixed")
    from safetensors.torch import load_file
    state = load_file(str(path))
    key = "diffusion_model.blocks.1.self_attn.q.lora_B.weight"
    if what == "shape":
        state[key] = torch.zeros(layers["blocks.1.self_attn.q"][0] + 1, RANK)
        bad = "diffusion_model.blocks.1.self_attn.q"
    elif what == "nan":
        state[key][0, 0] = float("nan")
        bad = key
    elif what == "nomatch":
        bad = "diffusion_model.blocks.7.self_attn.q.lora_A.weight"
        state[bad] = torch.zeros(RANK, 64)
    elif what == "kind":
        bad = "diffusion_model.blocks.0.norm3.dora_scale"
        state[bad] = torch.zeros(64)
    elif what == "diff_shape":
        bad = "diffusion_model.blocks.0.norm3.diff"
        state[bad] = torch.zeros(65)
    elif what == "diff_nomatch":
        bad = "diffusion_model.blocks.0.ffn.diff_m"
        state[bad] = torch.zeros(64)
    else:  # missing up
        del state[key]
        bad = "diffusion_model.blocks.1.self_attn.q"
    save_file(state, str(path))
    return path, bad


@pytest.mark.parametrize("what", ["shape", "nan", "nomatch", "kind", "missing", "diff_shape", "diff_nomatch"])
def test_malformed_lora_is_refused_naming_file_and_key(tmp_path, nf4_folder, what):
    model = build("float32", nf4_folder)
    path, bad = _malformed(tmp_path, linear_layers(model), what)
    with pytest.raises(CheckpointError) as err:
        read_lora(path, model)
    assert str(path) in str(err.value) and bad in str(err.value)


def test_not_a_safetensors_file_is_refused(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="x.safetensors"):
        read_lora(path, nn.Linear(1, 1))


class OneModelSource:
    def __init__(self, models):
        self.models, self.released = models, []

    def acquire(self, name):
        return self.models[name]

    def release(self, name):
        self.released.append(name)


def test_lora_experts_applies_strength_per_expert_and_detaches(tmp_path, nf4_folder):
    models = {"high": build("float32", nf4_folder), "low": build("float32", nf4_folder)}
    path = write_lora(tmp_path / "l.safetensors", factors(linear_layers(models["high"])), "kohya")
    source = LoraExperts(OneModelSource(models), [LoraSpec(path, strength_high=1.0, strength_low=0.0)])
    assert has_lora(source.acquire("high")) and not has_lora(source.acquire("low"))
    source.release("high")
    source.release("low")
    assert not has_lora(models["high"])


DIFFS = {"blocks.0.self_attn.q.diff_b": "blocks.0.self_attn.q.bias", "blocks.1.norm3.diff": "blocks.1.norm3.weight",
         "blocks.2.diff_m": "blocks.2.modulation", "head.head.diff_b": "head.head.bias"}


@pytest.mark.parametrize("kind", ["nf4", "float32"])
@pytest.mark.parametrize("prefix", ["diffusion_model.", "lora_unet_"])
def test_whole_tensor_differences_and_restore(tmp_path, nf4_folder, kind, prefix):
    model = build(kind, nf4_folder)
    layers = linear_layers(model)
    fac = factors(layers)
    path = write_lora(tmp_path / "l.safetensors", fac, "kohya" if prefix == "lora_unet_" else "dotted_down_up")
    from safetensors.torch import load_file
    state = load_file(str(path))
    params = dict(model.named_parameters())
    g = torch.Generator().manual_seed(4)
    deltas = {param: torch.randn(params[param].shape, generator=g) * 0.5 for param in DIFFS.values()}
    for key, param in DIFFS.items():
        base, _, suffix = key.rpartition(".")
        name = prefix + (base.replace(".", "_") if prefix == "lora_unet_" else base)
        state[f"{name}.{suffix}"] = deltas[param]
    save_file(state, str(path))
    strength = 0.7
    with torch.inference_mode():
        base_out = model(**inputs())
    reference = merged_reference(build(kind, nf4_folder), fac, scale_of(True, strength))
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if name in deltas:
                p += (deltas[name] * strength).to(p.dtype)
    with torch.inference_mode():
        want = reference(**inputs())
    source = LoraExperts(OneModelSource({"high": model}), [LoraSpec(path, strength_high=strength)])
    with torch.inference_mode():
        got = source.acquire("high")(**inputs())
    close(got, want, base_out)
    source.release("high")
    with torch.inference_mode():
        assert torch.equal(model(**inputs()), base_out)  # the originals are back


def test_full_weight_difference_on_a_4bit_layer_is_refused(tmp_path, nf4_folder):
    model = build("nf4", nf4_folder)
    path = tmp_path / "w.safetensors"
    save_file({"diffusion_model.blocks.0.ffn.0.diff": torch.zeros(SMALL.ffn_dim, SMALL.dim)}, str(path))
    source = LoraExperts(OneModelSource({"high": model}), [LoraSpec(path)])
    with pytest.raises(CheckpointError, match="w.safetensors.*blocks.0.ffn.0.weight.*4-bit"):
        source.acquire("high")
    assert not has_lora(model)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["nf4", "bf16"])
def test_lora_through_cuda_block_swap(tmp_path, nf4_folder, kind):
    """The real swapper (pinned memory, side stream) with adapters: same output as resident."""
    model = (load_nf4_expert(nf4_folder, "cuda") if kind == "nf4"
             else make_synthetic_expert(SMALL, seed=1, device="cuda", dtype=torch.bfloat16))
    layers = linear_layers(model)
    path = write_lora(tmp_path / "l.safetensors", factors(layers), "kohya")
    attach_lora(model, read_lora(path, model).adapters)
    cuda_inputs = {k: v.cuda() for k, v in inputs().items()}
    with torch.inference_mode():
        resident = model(**cuda_inputs)
    swapper = BlockSwapper(model, 1)
    with torch.inference_mode():
        swapped = model(**cuda_inputs)
    swapper.remove()
    assert torch.equal(resident, swapped)
