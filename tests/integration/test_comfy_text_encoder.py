"""ComfyUI's own umT5 files and text encoder, side by side with the pack's, in a real server.

The server's models/text_encoders/ holds tiny synthetic files in ComfyUI's layout
(tools/synthetic/t5.py: HF key names, a real SentencePiece model inside as
``spiece_model``), bf16 and fp8_e4m3fn scaled. Core ``CLIPLoader`` (type ``wan``) +
``CLIPTextEncode`` and the pack's ``LingBotWorldTextEncode`` (tokenizer "(from the encoder
file)") encode the same prompt from the same file; a test-only output node writes both
results to output/ and they are compared here.

Core builds the Wan text encoder at umT5-XXL's fixed size (4096 wide, 24 blocks), which a
2-core CI runner cannot hold. The test-only plugin tests/integration/umt5_plugin (loaded
only by this module's server through ``--extra-model-paths-config``) makes core build it
from a tiny config JSON written here (the host's umt5_config_xxl.json with the tiny
geometry) and recognise the tiny file as umT5-XXL; the host's files are not edited.

Tolerances: core computes in float32 from the file's weights; the pack's encoder loaded in
float32 in this process matches it to 1e-5 absolute (values up to ~3; seen: 1e-6). The
pack's node computes in bf16 (its default): within 2% relative Frobenius error of core's
(seen: 0.6-0.7%). Core pads to 512 tokens and zeroes the padded rows; the pack trims them.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import tiny_package
from comfy_host import ROOT
from comfy_server import ComfyServer, combo_options, require_host, video_info

from comfyui_lingbot_world.tools.synthetic.t5 import COMFY_T5_FILES, train_sentencepiece, write_comfy_t5
from comfyui_lingbot_world.loaders.t5_loader import load_t5
from comfyui_lingbot_world.tools.synthetic.vae import write_vae_checkpoint
from comfyui_lingbot_world.pipeline.text import load_tokenizer
from comfyui_lingbot_world.wan.t5 import T5_TINY, encode_prompts
from comfyui_lingbot_world.wan.vae import WAN21

PLUGIN = ROOT / "tests" / "integration" / "umt5_plugin"
FORMATS = ("bf16", "fp8_scaled")
FROM_FILE = "(from the encoder file)"
PROMPT = "a red car drives along the river at sunset"
NEGATIVE = "blurry static"
SEED = 11
FP32_ATOL = 1e-5
BF16_REL_TOL = 0.02
FRAMES, WIDTH, HEIGHT = 5, 48, 32
CORE_VAE = "wan_2.1_vae.safetensors"
# Core VAE Decode and the pack's decoder on the same weights, both float32 on the CPU.
DECODE_ATOL = 1e-4  # seen: 9.5e-7 (float32 round-off)


def tiny_config(host: Path) -> dict:
    """The host's umT5-XXL config with the tiny geometry of wan.t5.T5_TINY."""
    config = json.loads((host / "comfy" / "text_encoders" / "umt5_config_xxl.json").read_text())
    g = T5_TINY
    config.update(d_model=g.dim, d_kv=g.head_dim, d_ff=g.dim_ffn, num_heads=g.num_heads, num_layers=g.num_layers,
                  num_decoder_layers=g.num_layers, vocab_size=g.vocab_size,
                  relative_attention_num_buckets=g.num_buckets)
    return config


@pytest.fixture(scope="module")
def comfy_server_options(tmp_path_factory: pytest.TempPathFactory) -> dict:
    plugins = tmp_path_factory.mktemp("umt5_custom_nodes")
    (plugins / "lingbot_tiny_umt5_plugin").symlink_to(PLUGIN, target_is_directory=True)
    config = plugins.parent / f"{plugins.name}.yaml"
    config.write_text(f"lingbot_tiny_umt5_plugin:\n  custom_nodes: {plugins}\n")
    umt5_json = plugins.parent / f"{plugins.name}_umt5_config_tiny.json"
    umt5_json.write_text(json.dumps(tiny_config(require_host()), indent=1))
    return {"extra_args": ["--extra-model-paths-config", str(config)],
            "env": {"LINGBOT_TINY_UMT5_CONFIG": str(umt5_json)}}


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory: pytest.TempPathFactory):
    def extra(models: Path, package: Path) -> None:
        spiece = train_sentencepiece(T5_TINY.vocab_size)
        for fmt in FORMATS:
            write_comfy_t5(models / "text_encoders" / COMFY_T5_FILES[fmt], T5_TINY, seed=SEED, fmt=fmt,
                           tokenizer=spiece)
        # ComfyUI's wan_2.1_vae.safetensors layout at the real geometry (core's VAELoader builds
        # its Wan VAE at that size only): 0.25 GB in bf16, as Comfy-Org ships it.
        write_vae_checkpoint(models / "vae" / CORE_VAE, WAN21, seed=SEED, dtype=torch.bfloat16)

    return tiny_package.comfy_models_builder(tmp_path_factory, extra)


def saved(server: ComfyServer, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(server.output_dir / f"{name}.safetensors"))


def encode_graph(fmt: str) -> dict:
    name = COMFY_T5_FILES[fmt]
    return {
        "1": {"class_type": "CLIPLoader", "inputs": {"clip_name": name, "type": "wan"}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": PROMPT, "clip": ["1", 0]}},
        "3": {"class_type": "LingBotTestSaveTensors", "inputs": {"value": ["2", 0], "name": f"core_{fmt}"}},
        "4": {"class_type": "LingBotWorldTextEncode", "inputs": {
            "t5_file": f"text_encoders/{name}", "tokenizer": FROM_FILE, "prompt": PROMPT,
            "negative_prompt": NEGATIVE, "device": "cpu"}},
        "5": {"class_type": "LingBotTestSaveTensors", "inputs": {"value": ["4", 0], "name": f"pack_{fmt}"}},
    }


def test_text_encode_offers_the_tokenizer_in_the_file(comfy_server: ComfyServer) -> None:
    inputs = comfy_server.object_info("LingBotWorldTextEncode")["input"]["required"]
    assert FROM_FILE in combo_options(inputs["tokenizer"])
    for fmt in FORMATS:
        assert f"text_encoders/{COMFY_T5_FILES[fmt]}" in combo_options(inputs["t5_file"])
    assert COMFY_T5_FILES["bf16"] in comfy_server.object_info("CLIPLoader")["input"]["required"]["clip_name"][0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_core_clip_text_encode_equals_pack_text_encode(comfy_server: ComfyServer, fmt: str) -> None:
    comfy_server.run(encode_graph(fmt), timeout=180)
    core = saved(comfy_server, f"core_{fmt}")["cond"]
    pack = saved(comfy_server, f"pack_{fmt}")["positive"]
    n = pack.shape[0]
    assert core.shape == (1, 512, T5_TINY.dim) and pack.shape[1] == T5_TINY.dim and 2 < n < 512
    assert torch.count_nonzero(core[0, n:]) == 0  # core zeroes the padding the pack trims
    assert torch.count_nonzero(core[0, n - 1]) > 0  # ...and keeps the end token: same length

    # The pack's encoder in float32, same file and tokenizer: core's numbers.
    path = comfy_server.models_dir / "text_encoders" / COMFY_T5_FILES[fmt]
    encoder = load_t5(path, "cpu", torch.float32)
    (exact,) = encode_prompts(encoder, load_tokenizer(path, None), [PROMPT], "cpu")
    assert exact.shape == pack.shape
    torch.testing.assert_close(core[0, :n], exact, atol=FP32_ATOL, rtol=0)

    # The node (bf16 compute) within bf16 rounding.
    rel = float((core[0, :n] - pack).norm() / core[0, :n].norm())
    assert rel < BF16_REL_TOL, rel


def sampler_graph_with_conditioning() -> dict:
    """A shipped workflow with its text node replaced by core CLIPLoader + CLIPTextEncode."""
    graph = tiny_package.small_workflow(
        json.loads((ROOT / "workflows" / "api" / "lingbot_camera_preset.json").read_text()),
        frames=FRAMES, width=WIDTH, height=HEIGHT, steps=2)
    graph = copy.deepcopy(graph)
    text_ids = [i for i, node in graph.items() if node["class_type"] == "LingBotWorldTextEncode"]
    for node_id in text_ids:
        del graph[node_id]
    graph["20"] = {"class_type": "CLIPLoader", "inputs": {"clip_name": COMFY_T5_FILES["fp8_scaled"], "type": "wan"}}
    graph["21"] = {"class_type": "CLIPTextEncode", "inputs": {"text": PROMPT, "clip": ["20", 0]}}
    graph["22"] = {"class_type": "CLIPTextEncode", "inputs": {"text": NEGATIVE, "clip": ["20", 0]}}
    for node in graph.values():
        if node["class_type"] == "LingBotWorldSampler":
            node["inputs"].pop("text", None)
            node["inputs"].update(positive=["21", 0], negative=["22", 0])
    return graph


def test_core_conditioning_drives_the_lingbot_sampler(comfy_server: ComfyServer) -> None:
    """CLIPLoader -> CLIPTextEncode (positive, negative) -> LingBotWorldSampler -> VAE decode -> video."""
    result = comfy_server.run(sampler_graph_with_conditioning(), timeout=300)
    videos = [f for f in comfy_server.output_files(result) if f.suffix in (".mp4", ".webm", ".mov")]
    assert len(videos) == 1, comfy_server.output_files(result)
    video = video_info(videos[0])
    assert (video.frames, video.width, video.height) == (FRAMES, WIDTH, HEIGHT), video


def core_vae_graph() -> dict:
    """Load VAE (core) feeds the pack's VAE Encode; the sampler's LATENT goes to core VAE
    Decode and to the pack's VAE Decode (that same core VAE on vae_model)."""
    graph = tiny_package.small_workflow(
        json.loads((ROOT / "workflows" / "api" / "lingbot_no_camera.json").read_text()),
        frames=FRAMES, width=WIDTH, height=HEIGHT, steps=2)
    graph = copy.deepcopy(graph)
    by_type = {node["class_type"]: node_id for node_id, node in graph.items()}
    graph["30"] = {"class_type": "VAELoader", "inputs": {"vae_name": CORE_VAE}}
    graph[by_type["LingBotWorldVAEEncode"]]["inputs"].update(vae="(none)", vae_model=["30", 0])
    decode = graph[by_type["LingBotWorldVAEDecode"]]["inputs"]
    decode.update(vae="(none)", vae_model=["30", 0])
    sampler = by_type["LingBotWorldSampler"]
    graph["31"] = {"class_type": "VAEDecode", "inputs": {"samples": [sampler, 0], "vae": ["30", 0]}}
    graph["32"] = {"class_type": "LingBotTestSaveTensors", "inputs": {"value": ["31", 0], "name": "core_decode"}}
    graph["33"] = {"class_type": "LingBotTestSaveTensors",
                   "inputs": {"value": [by_type["LingBotWorldVAEDecode"], 0], "name": "pack_decode"}}
    return graph


def test_core_vae_loader_feeds_the_pack_and_core_decode_equals_the_packs(comfy_server: ComfyServer) -> None:
    """VAELoader -> LingBot-World VAE Encode / Decode works, and core VAE Decode of the
    sampler's LATENT (ComfyUI's Wan 2.1 convention) gives the pack decoder's frames."""
    result = comfy_server.run(core_vae_graph(), timeout=600)
    videos = [f for f in comfy_server.output_files(result) if f.suffix in (".mp4", ".webm", ".mov")]
    assert len(videos) == 1 and video_info(videos[0]).frames == FRAMES
    core, pack = saved(comfy_server, "core_decode")["image"], saved(comfy_server, "pack_decode")["image"]
    assert pack.shape == (FRAMES, HEIGHT, WIDTH, 3), pack.shape
    assert core.reshape(pack.shape).shape == pack.shape, core.shape
    core = core.reshape(pack.shape)
    diff = (core - pack).abs()
    print(f"core VAE Decode vs the pack's decoder: max {float(diff.max()):.2e}, mean {float(diff.mean()):.2e}")
    assert float(diff.max()) < DECODE_ATOL, f"max |core - pack| = {float(diff.max()):.2e}"


def fast_core_graph() -> dict:
    """The Fast clip template with core nodes around the Fast Sampler: CLIPLoader + CLIP Text
    Encode on its positive input (no negative: Fast has no CFG), Load VAE feeding the pack's
    VAE Encode, and its LATENT decoded by core VAE Decode and by the pack's VAE Decode."""
    graph = tiny_package.small_workflow(
        json.loads((ROOT / "workflows" / "api" / "lingbot_fast_clip.json").read_text()),
        frames=FAST_FRAMES, width=WIDTH, height=HEIGHT)
    by_type = {node["class_type"]: node_id for node_id, node in graph.items()}
    del graph[by_type["LingBotWorldTextEncode"]]
    graph["20"] = {"class_type": "CLIPLoader", "inputs": {"clip_name": COMFY_T5_FILES["bf16"], "type": "wan"}}
    graph["21"] = {"class_type": "CLIPTextEncode", "inputs": {"text": PROMPT, "clip": ["20", 0]}}
    sampler = by_type["LingBotWorldFastSampler"]
    graph[sampler]["inputs"].pop("text")
    graph[sampler]["inputs"]["positive"] = ["21", 0]
    graph["30"] = {"class_type": "VAELoader", "inputs": {"vae_name": CORE_VAE}}
    graph[by_type["LingBotWorldVAEEncode"]]["inputs"].update(vae="(none)", vae_model=["30", 0])
    graph[by_type["LingBotWorldVAEDecode"]]["inputs"].update(vae="(none)", vae_model=["30", 0])
    graph["31"] = {"class_type": "VAEDecode", "inputs": {"samples": [sampler, 0], "vae": ["30", 0]}}
    graph["32"] = {"class_type": "LingBotTestSaveTensors", "inputs": {"value": ["31", 0], "name": "fast_core_decode"}}
    graph["33"] = {"class_type": "LingBotTestSaveTensors",
                   "inputs": {"value": [by_type["LingBotWorldVAEDecode"], 0], "name": "fast_pack_decode"}}
    return graph


FAST_FRAMES = 9  # one chunk of LingBot-World Fast


def test_the_fast_samplers_latent_decodes_with_core_vae_decode_and_the_packs(comfy_server: ComfyServer) -> None:
    """Core CLIP Text Encode drives the Fast Sampler, and its LATENT (ComfyUI's Wan 2.1
    convention) decodes with core VAE Decode to the pack decoder's frames."""
    result = comfy_server.run(fast_core_graph(), timeout=600)
    videos = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    assert len(videos) == 1 and video_info(videos[0]).frames == FAST_FRAMES
    core, pack = saved(comfy_server, "fast_core_decode")["image"], saved(comfy_server, "fast_pack_decode")["image"]
    assert pack.shape == (FAST_FRAMES, HEIGHT, WIDTH, 3), pack.shape
    diff = (core.reshape(pack.shape) - pack).abs()
    print(f"Fast: core VAE Decode vs the pack's decoder: max {float(diff.max()):.2e}, mean {float(diff.mean()):.2e}")
    assert float(diff.max()) < DECODE_ATOL, f"max |core - pack| = {float(diff.max()):.2e}"
