"""nodes/__init__.py and nodes/inputs.py: every node registered with its id and display name,
keeping what tests/node_contract.py promises (folder, inputs in the order saved workflows
store them, types, defaults, outputs), tooltips, shared defaults, and the pack's own check of
its combo values (inside the ComfyUI host, on the CPU)."""
from __future__ import annotations

import re

import pytest

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
from comfy_api.latest import ComfyExtension, io  # noqa: E402

from comfy_host import run_async  # noqa: E402
from node_contract import CONTRACT, Input, NodeContract, Output, differences  # noqa: E402
from node_runs import PKG, options  # noqa: E402
from comfyui_lingbot_world import nodes as pack_nodes  # noqa: E402
from comfyui_lingbot_world.nodes.camera import LingBotWorldCamera  # noqa: E402
from comfyui_lingbot_world.nodes.dit_loader import LingBotWorldDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.host import model_files  # noqa: E402
from comfyui_lingbot_world.nodes.sampler import LingBotWorldSampler  # noqa: E402
from comfyui_lingbot_world.nodes.text_encode import LingBotWorldTextEncode  # noqa: E402
from comfyui_lingbot_world.nodes.vae import LingBotWorldVAEDecode, LingBotWorldVAEEncode  # noqa: E402
from comfyui_lingbot_world.wan.camera_presets import CAMERA_PRESETS  # noqa: E402


clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


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
    assert set(pack_nodes.NODE_CLASS_MAPPINGS) == set(CONTRACT)
    assert set(pack_nodes.NODE_DISPLAY_NAME_MAPPINGS) == set(CONTRACT)
    for name, cls in pack_nodes.NODE_CLASS_MAPPINGS.items():
        assert issubclass(cls, io.ComfyNode)
        schema = cls.GET_SCHEMA()
        assert schema.node_id == name and name.startswith("LingBotWorld")
        assert schema.display_name == pack_nodes.NODE_DISPLAY_NAME_MAPPINGS[name]
        assert schema.display_name.startswith("LingBot-World ")
        assert schema.description.strip()


def test_comfy_entrypoint_lists_the_same_nodes():
    extension = run_async(pack_nodes.comfy_entrypoint())
    assert isinstance(extension, ComfyExtension)
    assert run_async(extension.get_node_list()) == list(pack_nodes.NODE_CLASS_MAPPINGS.values())


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_each_node_keeps_its_contract(name, comfy_dirs):
    cls = pack_nodes.NODE_CLASS_MAPPINGS[name]
    inputs, schema = cls.INPUT_TYPES(), cls.GET_SCHEMA()
    outputs = [(o.display_name, o.get_io_type()) for o in schema.outputs]
    assert differences(name, schema.category, inputs["required"], inputs.get("optional", {}), outputs) == []
    for spec in [*inputs["required"].values(), *inputs.get("optional", {}).values()]:
        assert spec[1]["tooltip"].strip()
    assert all(o.tooltip.strip() for o in schema.outputs)


def test_the_contract_check_names_what_a_node_breaks():
    """``differences`` on a schema with a default and a type changed, optional inputs
    reordered, the category and an output renamed."""
    contract = NodeContract("LingBot-World/Fast", required=(Input("fast_dit", "LINGBOT_FAST_DIT"),
                                                            Input("kv_window", "INT", 9), Input("seed", "INT", 0)),
                            optional=(Input("text", "LINGBOT_TEXT"), Input("camera", "LINGBOT_CAMERA")),
                            outputs=(Output("samples", "LATENT"),))
    required = {"fast_dit": ["LINGBOT_FAST_DIT", {}], "kv_window": ["INT", {"default": 9}], "seed": ["INT", {"default": 0}]}
    optional = {"text": ["LINGBOT_TEXT", {}], "camera": ["LINGBOT_CAMERA", {}]}
    assert differences("X", contract.category, required, optional, [("samples", "LATENT")], contract) == []
    required["kv_window"][1]["default"], required["seed"][0] = 12, "FLOAT"
    found = differences("X", "LingBot-World", required, dict(reversed(optional.items())), [("latent", "LATENT")],
                        contract)
    assert found == ["X category 'LingBot-World', promised 'LingBot-World/Fast'",
                     "X required kv_window: default 12, promised 9", "X required seed: type FLOAT, promised INT",
                     "X optional inputs are ['camera', 'text'], promised ['text', 'camera']",
                     "X outputs are [('latent', 'LATENT')], promised [('samples', 'LATENT')]"]


def test_widget_defaults():
    """What the contract (tests/node_contract.py) leaves out: combo choices, widget steps."""
    assert options(LingBotWorldTextEncode.INPUT_TYPES()["required"]["device"]) == ["auto", "gpu", "cpu"]
    sampler = LingBotWorldSampler.INPUT_TYPES()["required"]
    assert sampler["seed"][1]["control_after_generate"] is True
    assert options(sampler["sampler"]) == ["unipc", "euler"]
    camera = LingBotWorldCamera.INPUT_TYPES()["required"]
    assert options(camera["preset"]) == list(CAMERA_PRESETS)
    for node in (camera, LingBotWorldVAEEncode.INPUT_TYPES()["required"]):
        assert node["width"][1]["step"] == node["height"][1]["step"] == 16
        assert node["frames"][1]["step"] == 4


def test_the_fast_nodes_share_their_inputs_with_the_base_nodes(comfy_dirs):
    """One declaration: the loaders' quantize and block swap, and the Fast nodes' cache
    policy, prompt, shift, seed and steps are the same widgets everywhere (defaults: DEFAULT_POLICY)."""
    from comfyui_lingbot_world.nodes.fast_dit_loader import LingBotWorldFastDiTLoader
    from comfyui_lingbot_world.nodes.fast_long_video import LingBotWorldFastLongVideo
    from comfyui_lingbot_world.nodes.fast_sampler import LingBotWorldFastSampler
    from comfyui_lingbot_world.nodes.play import LingBotWorldPlay
    from comfyui_lingbot_world.pipeline.fast import DEFAULT_POLICY

    base, fast = LingBotWorldDiTLoader.INPUT_TYPES()["required"], LingBotWorldFastDiTLoader.INPUT_TYPES()["required"]
    assert fast["block_swap"] == base["block_swap"]
    assert options(fast["bf16_quantize"]) == options(base["bf16_quantize"]) == ["none", "nf4"]
    sampler, stream = LingBotWorldFastSampler.INPUT_TYPES(), LingBotWorldFastLongVideo.INPUT_TYPES()
    for name in ("kv_cache", "kv_window", "kv_sink", "kv_dtype", "shift", "seed"):
        assert sampler["required"][name] == stream["required"][name], name
    for name in ("text", "positive"):
        assert sampler["optional"][name] == stream["optional"][name], name
    play = LingBotWorldPlay.INPUT_TYPES()["optional"]
    # steps: optional and the last widget of each (graphs saved before it load with 4, the official schedule)
    assert sampler["optional"]["steps"] == stream["optional"]["steps"] == play["steps"]
    assert {k: sampler["optional"]["steps"][1][k] for k in ("default", "min", "max")} == {"default": 4, "min": 1,
                                                                                           "max": 4}
    for node in (sampler, stream, {"optional": play}):
        assert list(node["optional"])[-1] == "steps"
    assert (sampler["required"]["kv_window"][1]["default"], sampler["required"]["kv_sink"][1]["default"]) == (
        DEFAULT_POLICY.window, DEFAULT_POLICY.sink)
    assert options(sampler["required"]["kv_dtype"]) == ["auto", "bf16", "int8"]  # auto: the memory plan's
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
