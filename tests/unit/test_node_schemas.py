"""nodes/__init__.py and nodes/inputs.py: every node registered with its id, display name,
inputs in the order saved workflows store them, tooltips, shared defaults, and the pack's
own check of its combo values (inside the ComfyUI host, on the CPU)."""
from __future__ import annotations

import re

import pytest

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
from comfy_api.latest import ComfyExtension, io  # noqa: E402

from comfy_host import run_async  # noqa: E402
from node_runs import PKG, options  # noqa: E402
from comfyui_lingbot_world import nodes as pack_nodes  # noqa: E402
from comfyui_lingbot_world.nodes.camera import LingBotWorldCamera  # noqa: E402
from comfyui_lingbot_world.nodes.dit_loader import LingBotWorldDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.host import model_files  # noqa: E402
from comfyui_lingbot_world.nodes.sampler import LingBotWorldSampler  # noqa: E402
from comfyui_lingbot_world.nodes.text_encode import LingBotWorldTextEncode  # noqa: E402
from comfyui_lingbot_world.nodes.vae import LingBotWorldVAEDecode, LingBotWorldVAEEncode  # noqa: E402
from comfyui_lingbot_world.wan.camera_presets import CAMERA_PRESETS  # noqa: E402
from comfyui_lingbot_world.wan.negative_prompt import DEFAULT_NEGATIVE_PROMPT  # noqa: E402


clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


# The input order of every node: the UI format stores widget values in this order.
EXPECTED_INPUTS = {
    "LingBotWorldTextEncode": (["t5_file", "tokenizer", "prompt", "negative_prompt", "device"], []),
    "LingBotWorldDiTLoader": (["high_noise", "low_noise", "bf16_quantize", "block_swap"], ["devices", "weights"]),
    # New inputs appended after the original eight, optional: older workflows keep their
    # widget values and older API prompts (without them) still validate.
    "LingBotWorldCamera": (["source", "preset", "speed", "poses_file", "intrinsics_file", "width", "height", "frames"],
                           ["actions", "pose_export", "normalize_scale", "window", "overlap", "camera_axes", "keyframes"]),
    "LingBotWorldVAEEncode": (["image", "vae", "width", "height", "frames", "device"], ["vae_model", "precision"]),
    "LingBotWorldSampler": (["dit", "i2v", "steps", "shift", "cfg_high", "cfg_low", "boundary", "seed", "sampler"],
                            ["text", "camera", "positive", "negative", "cache_threshold", "cfg_truncate",
                             "attention", "preset"]),
    "LingBotWorldVAEDecode": (["samples", "vae", "tile", "device"], ["vae_model", "precision"]),
    "LingBotWorldLoraLoader": (["dit", "lora_high_noise", "strength_high", "lora_low_noise", "strength_low"], []),
    "LingBotWorldLongVideo": (["dit", "image", "vae", "width", "height", "frames", "window", "overlap",
                               "scale_quantile", "steps", "shift", "cfg_high", "cfg_low", "boundary", "seed",
                               "sampler", "decode_tile", "keep_experts", "fps", "filename_prefix"],
                              ["text", "camera_path", "vae_model", "positive", "negative"]),
    "LingBotWorldFastDiTLoader": (["fast_model", "bf16_quantize", "block_swap"], ["weights", "devices", "attention"]),  # issues 25, 26
    "LingBotWorldFastSampler": (["fast_dit", "i2v", "kv_cache", "kv_window", "kv_sink", "kv_dtype", "shift", "seed"],
                                ["text", "positive", "camera"]),
    "LingBotWorldFastLongVideo": (["fast_dit", "image", "vae", "width", "height", "frames", "kv_cache", "kv_window",
                                   "kv_sink", "kv_dtype", "shift", "seed", "decode_tile", "fps", "filename_prefix"],
                                  ["text", "positive", "camera_path", "vae_model", "precision"]),
    "LingBotWorldPlay": (["fast_dit", "image", "vae", "width", "height", "chunk_budget", "mode", "idle_timeout",
                          "kv_window", "kv_sink", "kv_dtype", "shift", "seed", "fps", "filename_prefix"],
                         ["text", "positive", "vae_model", "precision", "live_decoder"]),
    "LingBotWorldPlayLog": (["log"], ["image"]),  # issue 27: replay a session from its log
}

EXPECTED_OUTPUTS = {
    "LingBotWorldTextEncode": ("LINGBOT_TEXT",),
    "LingBotWorldDiTLoader": ("LINGBOT_DIT",),
    "LingBotWorldCamera": ("LINGBOT_CAMERA", "IMAGE", "LINGBOT_CAMERA_PATH"),
    "LingBotWorldVAEEncode": ("LINGBOT_I2V",),
    "LingBotWorldSampler": ("LATENT",),
    "LingBotWorldVAEDecode": ("IMAGE",),
    "LingBotWorldLoraLoader": ("LINGBOT_DIT",),
    "LingBotWorldLongVideo": ("VIDEO",),
    "LingBotWorldFastDiTLoader": ("LINGBOT_FAST_DIT", "STRING"),
    "LingBotWorldFastSampler": ("LATENT",),
    "LingBotWorldFastLongVideo": ("VIDEO",),
    "LingBotWorldPlay": ("VIDEO", "STRING", "LATENT"),
    # what the Fast clip nodes take: kv_dtype and precision link into their combo widgets
    "LingBotWorldPlayLog": ("IMAGE", "STRING", "STRING", "STRING", "INT", "INT", "INT", "INT", "FLOAT", "INT", "INT",
                            "COMBO", "COMBO"),
}


NODE_CATEGORIES = {
    "LingBotWorldDiTLoader": "LingBot-World/Base", "LingBotWorldSampler": "LingBot-World/Base",
    "LingBotWorldLongVideo": "LingBot-World/Base", "LingBotWorldLoraLoader": "LingBot-World/Base",
    "LingBotWorldFastDiTLoader": "LingBot-World/Fast", "LingBotWorldFastSampler": "LingBot-World/Fast",
    "LingBotWorldFastLongVideo": "LingBot-World/Fast", "LingBotWorldPlay": "LingBot-World/Play",
    "LingBotWorldPlayLog": "LingBot-World/Play",
    "LingBotWorldCamera": "LingBot-World/Camera and Act", "LingBotWorldTextEncode": "LingBot-World/Text and VAE",
    "LingBotWorldVAEEncode": "LingBot-World/Text and VAE", "LingBotWorldVAEDecode": "LingBot-World/Text and VAE",
}


def test_search_aliases_only_where_the_host_has_them(monkeypatch):
    """"lingbot act" / "lingbot play" / "lingbot fast" find their nodes: by a V3 search alias on
    hosts whose io.Schema has search_aliases (0.28), by the display name on older ones (0.3.75),
    where passing the keyword would raise TypeError."""
    from comfyui_lingbot_world.nodes import inputs

    has_field = "search_aliases" in io.Schema.__dataclass_fields__
    schemas = {name: cls.GET_SCHEMA() for name, cls in pack_nodes.NODE_CLASS_MAPPINGS.items()}
    for query, nodes in {"lingbot act": ("LingBotWorldCamera", "LingBotWorldDiTLoader", "LingBotWorldSampler"),
                         "lingbot play": ("LingBotWorldPlay", "LingBotWorldPlayLog"),
                         "lingbot fast": ("LingBotWorldFastDiTLoader", "LingBotWorldFastSampler",
                                          "LingBotWorldFastLongVideo")}.items():
        word = query.split()[1]
        for name in nodes:
            aliases = getattr(schemas[name], "search_aliases", None) or []
            assert (query in aliases) == has_field, (name, aliases)
        # Within the frontend's fuzzy reach of a display name's start (Fuse.js, location 0,
        # distance 100, threshold 0.3: an exact word within 30 characters) on every host.
        assert any(word in schemas[name].display_name.lower()[:30] for name in nodes), query
    monkeypatch.delattr(io.Schema, "__dataclass_fields__")
    assert inputs.search_aliases("lingbot x") == {}


def test_mappings_register_every_node_with_display_names():
    assert set(pack_nodes.NODE_CLASS_MAPPINGS) == set(EXPECTED_INPUTS)
    assert set(pack_nodes.NODE_DISPLAY_NAME_MAPPINGS) == set(EXPECTED_INPUTS)
    for name, cls in pack_nodes.NODE_CLASS_MAPPINGS.items():
        assert issubclass(cls, io.ComfyNode)
        schema = cls.GET_SCHEMA()
        assert schema.node_id == name and name.startswith("LingBotWorld")
        assert schema.display_name == pack_nodes.NODE_DISPLAY_NAME_MAPPINGS[name]
        assert schema.display_name.startswith("LingBot-World ")
        # Issue 27: one folder per kind of node, under LingBot-World (it was one flat category).
        assert schema.category == NODE_CATEGORIES[name]
        assert schema.description.strip()


def test_comfy_entrypoint_lists_the_same_nodes():
    extension = run_async(pack_nodes.comfy_entrypoint())
    assert isinstance(extension, ComfyExtension)
    assert run_async(extension.get_node_list()) == list(pack_nodes.NODE_CLASS_MAPPINGS.values())


@pytest.mark.parametrize("name", sorted(EXPECTED_INPUTS))
def test_input_and_return_types(name, comfy_dirs):
    cls = pack_nodes.NODE_CLASS_MAPPINGS[name]
    schema = cls.INPUT_TYPES()
    required, optional = EXPECTED_INPUTS[name]
    assert list(schema["required"]) == required
    assert list(schema.get("optional", {})) == optional
    for spec in [*schema["required"].values(), *schema.get("optional", {}).values()]:
        assert spec[1]["tooltip"].strip()
    outputs = cls.GET_SCHEMA().outputs
    assert tuple(o.get_io_type() for o in outputs) == EXPECTED_OUTPUTS[name]
    assert all(o.display_name and o.tooltip.strip() for o in outputs)


def test_widget_defaults():
    text = LingBotWorldTextEncode.INPUT_TYPES()["required"]
    assert text["negative_prompt"][1]["default"] == DEFAULT_NEGATIVE_PROMPT
    assert options(text["device"]) == ["auto", "gpu", "cpu"]
    sampler = LingBotWorldSampler.INPUT_TYPES()["required"]
    defaults = {k: sampler[k][1]["default"] for k in ("steps", "shift", "cfg_high", "cfg_low", "boundary", "sampler")}
    assert defaults == {"steps": 40, "shift": 10.0, "cfg_high": 5.0, "cfg_low": 5.0, "boundary": 0.947, "sampler": "unipc"}
    assert sampler["seed"][1]["control_after_generate"] is True
    assert options(sampler["sampler"]) == ["unipc", "euler"]
    optional = LingBotWorldSampler.INPUT_TYPES()["optional"]
    assert [optional[k][0] for k in ("text", "camera", "positive", "negative")] == [
        "LINGBOT_TEXT", "LINGBOT_CAMERA", "CONDITIONING", "CONDITIONING"]
    for node in (LingBotWorldVAEEncode, LingBotWorldVAEDecode):
        assert node.INPUT_TYPES()["optional"]["vae_model"][0] == "VAE"
    camera = LingBotWorldCamera.INPUT_TYPES()["required"]
    assert options(camera["preset"]) == list(CAMERA_PRESETS)
    for node in (camera, LingBotWorldVAEEncode.INPUT_TYPES()["required"]):
        assert (node["width"][1]["default"], node["height"][1]["default"], node["frames"][1]["default"]) == (832, 480, 81)
        assert node["width"][1]["step"] == node["height"][1]["step"] == 16
        assert node["frames"][1]["step"] == 4


def test_the_fast_nodes_share_their_inputs_with_the_base_nodes(comfy_dirs):
    """One declaration: the loaders' quantize and block swap, and the Fast nodes' cache
    policy, prompt, shift and seed are the same widgets everywhere (defaults: DEFAULT_POLICY)."""
    from comfyui_lingbot_world.nodes.fast_dit_loader import LingBotWorldFastDiTLoader
    from comfyui_lingbot_world.nodes.fast_long_video import LingBotWorldFastLongVideo
    from comfyui_lingbot_world.nodes.fast_sampler import LingBotWorldFastSampler
    from comfyui_lingbot_world.pipeline.fast import DEFAULT_POLICY

    base, fast = LingBotWorldDiTLoader.INPUT_TYPES()["required"], LingBotWorldFastDiTLoader.INPUT_TYPES()["required"]
    assert fast["block_swap"] == base["block_swap"]
    assert options(fast["bf16_quantize"]) == options(base["bf16_quantize"]) == ["none", "nf4"]
    assert (base["bf16_quantize"][1]["default"], fast["bf16_quantize"][1]["default"]) == ("none", "nf4")
    sampler, stream = LingBotWorldFastSampler.INPUT_TYPES(), LingBotWorldFastLongVideo.INPUT_TYPES()
    for name in ("kv_cache", "kv_window", "kv_sink", "kv_dtype", "shift", "seed"):
        assert sampler["required"][name] == stream["required"][name], name
    for name in ("text", "positive"):
        assert sampler["optional"][name] == stream["optional"][name], name
    assert (sampler["required"]["kv_window"][1]["default"], sampler["required"]["kv_sink"][1]["default"],
            sampler["required"]["kv_dtype"][1]["default"]) == (DEFAULT_POLICY.window, DEFAULT_POLICY.sink,
                                                               "auto")  # the memory plan's: plan_fast_memory
    frames = stream["required"]["frames"][1]
    # 81 as a fresh Camera node (issue 17: fresh nodes agree); the tooltip tells 961 -> 957.
    assert (frames["default"], frames["max"]) == (81, 961) and "957" in frames["tooltip"]


def test_file_combos_are_validated_by_the_pack(installed, trajectory):
    assert LingBotWorldVAEEncode.validate_inputs(vae=f"{PKG}/Wan2.1_VAE.pth") is True
    assert LingBotWorldVAEDecode.validate_inputs(vae=model_files.NO_FILE) is True
    problem = LingBotWorldVAEDecode.validate_inputs(vae="vae/missing.pth")
    assert isinstance(problem, str) and problem.startswith("vae: 'vae/missing.pth' is not offered")
    assert LingBotWorldDiTLoader.validate_inputs(high_noise=f"{PKG}/high_noise_model_bnb_nf4",
                                                 low_noise=f"{PKG}/low_noise_model_bnb_nf4") is True
    assert "low_noise" in LingBotWorldDiTLoader.validate_inputs(high_noise=f"{PKG}/high_noise_model_bnb_nf4",
                                                                low_noise=f"{PKG}/tokenizer")
    assert LingBotWorldTextEncode.validate_inputs(t5_file=f"{PKG}/Wan2.1_VAE.pth", tokenizer=f"{PKG}/tokenizer") \
        .startswith("t5_file:")  # the VAE is not offered as a T5 file
    assert LingBotWorldCamera.validate_inputs(poses_file="traj/poses.npy", intrinsics_file=model_files.NO_FILE) is True


# The node a "Must match the X node" sentence may not name on each node: itself.
OWN_NAMES = {"LingBotWorldCamera": "Camera", "LingBotWorldVAEEncode": "VAE Encode", "LingBotWorldLongVideo": "Long Video",
             "LingBotWorldFastLongVideo": "Long Video", "LingBotWorldPlay": "Play"}


def _texts(node) -> dict[str, str]:
    """Every tooltip of a node's inputs, and its description, by where they are."""
    schema = node.define_schema()
    texts = {f"{i.id} tooltip": i.tooltip or "" for i in schema.inputs}
    texts["description"] = schema.description or ""
    return texts


@pytest.mark.parametrize("node_id", sorted(OWN_NAMES))
def test_size_tooltips_name_the_node_to_match_never_the_node_itself(node_id, comfy_dirs):
    texts = _texts(pack_nodes.NODE_CLASS_MAPPINGS[node_id])
    for where, text in texts.items():
        for sentence in text.split(". "):
            if "Must match the" in sentence:
                assert OWN_NAMES[node_id] not in sentence.split("Must match the", 1)[1], (where, text)


@pytest.mark.parametrize("node_id", ["LingBotWorldLongVideo", "LingBotWorldFastLongVideo", "LingBotWorldPlay"])
def test_a_node_without_a_vae_encode_in_its_graph_never_mentions_one(node_id, comfy_dirs):
    for where, text in _texts(pack_nodes.NODE_CLASS_MAPPINGS[node_id]).items():
        assert "VAE Encode" not in text, (where, text)


# What a measured figure looks like: a speed-up, a time or rate on a card, a card's name with
# a memory figure. Those live in bench/RESULTS.md, one copy, with their card and date.
MEASURED = re.compile(r"\d(\.\d+)?x (faster|of|over)|\d(\.\d+)? ?(s|ms|frames/s) (on|against)|-> \d|"
                      r"\d (GiB|GB) on an? |on (an?|one|two|four) H[12]00|\d % (faster|slower)")


@pytest.mark.parametrize("node_id", sorted(pack_nodes.NODE_CLASS_MAPPINGS))
def test_tooltips_hold_no_measured_figures(node_id, comfy_dirs):
    for where, text in _texts(pack_nodes.NODE_CLASS_MAPPINGS[node_id]).items():
        assert not MEASURED.search(text), (where, MEASURED.search(text).group(0), text)


def test_the_measured_figure_pattern_finds_the_old_ones():
    for old in ("~1.35x faster attention at 480p", "a Fast chunk 1.20 -> 1.11 s on an H100",
                "4.4 instead of 8.7 GiB on an H100", "measured on two H100s: a 480x832 chunk 0.72 s", "1.16x of cuDNN",
                "5.5 % faster than"):
        assert MEASURED.search(old), old
    assert not MEASURED.search("81 = 5 s at 16 fps; ~9.6 GB for an NF4 expert; H100/H200 only")


def test_fresh_camera_long_video_and_vae_encode_nodes_agree_on_frames(comfy_dirs):
    """A fresh Camera wired to a fresh Long Video (or VAE Encode) runs without edits: all
    default to 81 frames, the model's trained clip (5 s at 16 fps)."""
    defaults = {}
    for node_id in ("LingBotWorldCamera", "LingBotWorldVAEEncode", "LingBotWorldLongVideo", "LingBotWorldFastLongVideo"):
        spec = pack_nodes.NODE_CLASS_MAPPINGS[node_id].INPUT_TYPES()["required"]
        defaults[node_id] = (spec["width"][1]["default"], spec["height"][1]["default"], spec["frames"][1]["default"])
    assert set(defaults.values()) == {(832, 480, 81)}, defaults
