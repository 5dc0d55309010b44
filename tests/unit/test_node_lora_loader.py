"""nodes/lora_loader.py: LingBot-World LoRA Loader inside the ComfyUI host (CPU), and the
sampler applying its LoRAs (unmerged) and leaving the experts clean."""
from __future__ import annotations

import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
from node_runs import HIGH, LOW, encode_prompt, encode_start, load_dit, not_resident, run_sampler  # noqa: E402
from synthetic_lora import write_kohya_lora  # noqa: E402
from comfyui_lingbot_world import nodes as pack_nodes  # noqa: E402
from comfyui_lingbot_world.loaders.errors import CheckpointError  # noqa: E402
from comfyui_lingbot_world.nodes.dit_loader import LingBotWorldDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.lora_loader import LingBotWorldLoraLoader  # noqa: E402
from comfyui_lingbot_world.pipeline.lora import LoraSpec  # noqa: E402


clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def _inputs():
    return encode_prompt(), encode_start(), load_dit()


def _latent(dit, text, i2v, steps=3, seed=1, **fast) -> torch.Tensor:
    return run_sampler(dit, text, i2v, steps=steps, seed=seed, **fast)["samples"]


def test_lora_loader_schema_and_registration(installed):
    assert pack_nodes.NODE_CLASS_MAPPINGS["LingBotWorldLoraLoader"] is LingBotWorldLoraLoader
    assert pack_nodes.NODE_DISPLAY_NAME_MAPPINGS["LingBotWorldLoraLoader"] == "LingBot-World LoRA Loader"
    write_kohya_lora(installed["loras"] / "wan" / "style_high.safetensors", installed["package"] / "high_noise_model_bnb_nf4")
    schema = LingBotWorldLoraLoader.INPUT_TYPES()  # its inputs and outputs: tests/node_contract.py
    for key in ("lora_high_noise", "lora_low_noise"):
        assert schema["required"][key][1]["options"] == ["none", "wan/style_high.safetensors"]
        assert schema["required"][key][1]["default"] == "none"
    for key in ("strength_high", "strength_low"):
        spec = schema["required"][key][1]
        assert (spec["default"], spec["min"], spec["max"], spec["step"]) == (1.0, -4.0, 4.0, 0.05)
    assert LingBotWorldLoraLoader.validate_inputs("none", "wan/style_high.safetensors") is True
    assert "lora_low_noise: 'gone.safetensors' is not offered" in \
        LingBotWorldLoraLoader.validate_inputs("none", "gone.safetensors")


def test_lora_loader_chains_and_keeps_the_experts(installed):
    high = write_kohya_lora(installed["loras"] / "a_high.safetensors", installed["package"] / "high_noise_model_bnb_nf4")
    low = write_kohya_lora(installed["loras"] / "a_low.safetensors", installed["package"] / "low_noise_model_bnb_nf4",
                           seed=1)
    dit = LingBotWorldDiTLoader.execute(HIGH, LOW, "none")[0]
    once = LingBotWorldLoraLoader.execute(dit, "a_high.safetensors", 0.5, "a_low.safetensors", 1.5)[0]
    assert once.loras == (LoraSpec(high, 0.5, 0.0), LoraSpec(low, 0.0, 1.5))
    assert once.high is dit.high and once.low is dit.low and once.config == dit.config
    assert dit.loras == ()  # the input is left as it was (ComfyUI may reuse it)
    twice = LingBotWorldLoraLoader.execute(once, "none", 1.0, "a_high.safetensors", -1.0)[0]
    assert twice.loras == once.loras + (LoraSpec(high, 0.0, -1.0),)
    assert LingBotWorldLoraLoader.execute(dit, "none", 1.0, "none", 1.0)[0].loras == ()
    with pytest.raises(ValueError, match="^lora_high_noise: LoRA file 'missing.safetensors' not found in models/loras"):
        LingBotWorldLoraLoader.execute(dit, "missing.safetensors", 1.0, "none", 1.0)
    with pytest.raises(ValueError, match="^strength_low: "):
        LingBotWorldLoraLoader.execute(dit, "none", 1.0, "none", 9.0)
    with pytest.raises(ValueError, match="^dit: "):
        LingBotWorldLoraLoader.execute("not a dit", "none", 1.0, "none", 1.0)


def test_sampler_applies_the_loras_and_leaves_the_experts_clean(installed):
    text, i2v, dit = _inputs()
    write_kohya_lora(installed["loras"] / "h.safetensors", installed["package"] / "high_noise_model_bnb_nf4")
    write_kohya_lora(installed["loras"] / "l.safetensors", installed["package"] / "low_noise_model_bnb_nf4", seed=3)
    plain = _latent(dit, text, i2v)
    zero = LingBotWorldLoraLoader.execute(dit, "h.safetensors", 0.0, "l.safetensors", 0.0)[0]
    assert torch.equal(_latent(zero, text, i2v), plain)  # strength 0: the expert as it was
    only_low = LingBotWorldLoraLoader.execute(dit, "none", 1.0, "l.safetensors", 1.0)[0]
    both = LingBotWorldLoraLoader.execute(dit, "h.safetensors", 1.0, "l.safetensors", 1.0)[0]
    with_low, with_both = _latent(only_low, text, i2v), _latent(both, text, i2v)
    assert torch.isfinite(with_both).all()
    assert not torch.equal(with_low, plain) and not torch.equal(with_both, with_low)
    assert not_resident(dit)
    # Adapters are detached on release: the same experts sample the plain latent again.
    assert torch.equal(_latent(dit, text, i2v), plain)


def test_malformed_lora_fails_naming_file_and_key_and_releases_the_expert(installed):
    text, i2v, dit = _inputs()
    key = "lora_unet_blocks_0_ffn_0.lora_up.weight"
    bad = write_kohya_lora(installed["loras"] / "bad.safetensors", installed["package"] / "high_noise_model_bnb_nf4",
                           wrong_shape_key=key)
    broken = LingBotWorldLoraLoader.execute(dit, "bad.safetensors", 1.0, "none", 1.0)[0]
    with pytest.raises(CheckpointError) as error:
        _latent(broken, text, i2v)
    message = str(error.value)
    # Named relative to the loras folder, not by the server's absolute path.
    assert message.startswith(f"loras/{bad.name}:") and "lora_unet_blocks_0_ffn_0" in message
    assert not_resident(dit)
    assert torch.isfinite(_latent(dit, text, i2v)).all()  # the next run is clean


def test_a_lora_file_gone_since_the_loader_ran_is_refused_before_any_expert_loads(installed, monkeypatch):
    """The LoRA Loader only names the file; if it is deleted before the sampler runs, the
    sampler says so (naming the file) before ComfyUI loads an expert for nothing."""
    import comfy.model_management as mm

    text, i2v, dit = _inputs()
    lora = write_kohya_lora(installed["loras"] / "gone.safetensors", installed["package"] / "high_noise_model_bnb_nf4")
    with_lora = LingBotWorldLoraLoader.execute(dit, "gone.safetensors", 1.0, "none", 1.0)[0]
    lora.unlink()
    loads = []
    monkeypatch.setattr(mm, "load_models_gpu", lambda models, *a, **k: loads.append(models))
    # Named relative to the loras folder, as every node error names files.
    refusal = rf"LoRA file loras/{lora.name} no longer exists; pick another in the LoRA Loader"
    with pytest.raises(FileNotFoundError, match=refusal):
        _latent(with_lora, text, i2v)
    assert loads == [] and not_resident(dit)
