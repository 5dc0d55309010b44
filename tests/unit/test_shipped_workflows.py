"""The shipped workflows against the node schemas (inside the ComfyUI host, on the CPU): the
API prompts of workflows/api/, the UI templates of example_workflows/ and their thumbnails,
and the same files as they were before (tests/data/legacy_workflows/), which must still load."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from comfy_host import use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
from shipped_workflows import MAX_TITLE, SHIPPED_BEFORE, TEMPLATES  # noqa: E402
from comfyui_lingbot_world import nodes as pack_nodes  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LEGACY = Path(__file__).resolve().parents[1] / "data" / "legacy_workflows"
# Combos that list the user's files (and a Play session's log): what the old graphs name is checked in a real server
# with the tiny package installed under those names (tests/integration/test_workflows.py).
FILE_COMBOS = {"t5_file", "tokenizer", "vae", "high_noise", "low_noise", "poses_file", "intrinsics_file",
               "pose_export", "lora_high_noise", "lora_low_noise", "fast_model", "log"}


WORKFLOWS = ("lingbot_camera_files", "lingbot_camera_preset", "lingbot_step_cache", "lingbot_no_camera",
             "lingbot_act2cam")  # one pass

# Widget values the frontend stores right after an input's own value.
EXTRA_WIDGETS = {("LingBotWorldSampler", "seed"): 1, ("LingBotWorldLongVideo", "seed"): 1, ("LoadImage", "image"): 1,
                 ("LingBotWorldFastSampler", "seed"): 1, ("LingBotWorldFastLongVideo", "seed"): 1,
                 ("LingBotWorldPlay", "seed"): 1}
# The nodes whose seed widget the graphs fix at 42.
SEEDED = ("LingBotWorldSampler", "LingBotWorldLongVideo", "LingBotWorldFastSampler", "LingBotWorldFastLongVideo",
          "LingBotWorldPlay")


def _widget_names(class_type: str) -> list[str] | None:
    cls = pack_nodes.NODE_CLASS_MAPPINGS.get(class_type)
    if cls is None:
        return None
    schema = cls.INPUT_TYPES()
    names = []
    for section in ("required", "optional"):
        for name, spec in schema.get(section, {}).items():
            kind = spec[0]
            if isinstance(kind, list) or kind in ("COMBO", "INT", "FLOAT", "STRING", "BOOLEAN"):
                names.append(name)
    return names


def cls_optional(class_type: str) -> set[str]:
    return set(pack_nodes.NODE_CLASS_MAPPINGS[class_type].INPUT_TYPES().get("optional", {}))


@pytest.mark.parametrize("name", WORKFLOWS)
def test_api_workflow_matches_node_schemas(name, comfy_dirs):
    graph = json.loads((REPO / "workflows" / "api" / f"{name}.json").read_text(encoding="utf-8"))
    classes = [node["class_type"] for node in graph.values()]
    assert classes.count("LingBotWorldSampler") == 1 and "SaveVideo" in classes and "CreateVideo" in classes
    assert ("LingBotWorldCamera" in classes) == (name != "lingbot_no_camera")
    if name == "lingbot_step_cache":
        fast = next(n for n in graph.values() if n["class_type"] == "LingBotWorldSampler")["inputs"]
        assert {k: fast[k] for k in ("cache_threshold", "cfg_truncate", "attention", "preset")} == \
            {"cache_threshold": 0.05, "cfg_truncate": 0.2, "attention": "auto", "preset": "none"}
    for node_id, node in graph.items():
        cls = pack_nodes.NODE_CLASS_MAPPINGS.get(node["class_type"])
        if cls is None:
            continue
        schema = cls.INPUT_TYPES()
        assert set(schema["required"]) <= set(node["inputs"]), node_id
        assert set(node["inputs"]) <= set(schema["required"]) | set(schema.get("optional", {})), node_id
        for key, value in node["inputs"].items():
            if isinstance(value, list):
                assert value[0] in graph, f"{node_id}.{key} links to a missing node"
    fps = [n["inputs"]["fps"] for n in graph.values() if n["class_type"] == "CreateVideo"]
    assert fps == [16.0]
    sampler = next(n for n in graph.values() if n["class_type"] == "LingBotWorldSampler")
    encode = next(n for n in graph.values() if n["class_type"] == "LingBotWorldVAEEncode")
    for camera in (n for n in graph.values() if n["class_type"] == "LingBotWorldCamera"):
        assert [camera["inputs"][k] for k in ("width", "height", "frames")] == \
            [encode["inputs"][k] for k in ("width", "height", "frames")]
        assert sampler["inputs"]["camera"][0] in graph


def test_act2cam_workflow_has_the_official_settings(comfy_dirs):
    """The official act2cam example's settings: Base-Cam, 121 frames, the README's action
    string (90 frames: the camera holds still after it), and the official_act2cam preset's
    sampler values set in the widgets (preset none, so that the steps stay editable)."""
    from comfyui_lingbot_world.pipeline.sampler_presets import PRESET_FRAMES, apply_preset
    from comfyui_lingbot_world.pipeline.sampling import SamplingParams
    from comfyui_lingbot_world.wan.camera_actions import action_frames

    graph = json.loads((REPO / "workflows" / "api" / "lingbot_act2cam.json").read_text(encoding="utf-8"))
    camera = next(n for n in graph.values() if n["class_type"] == "LingBotWorldCamera")["inputs"]
    sampler = next(n for n in graph.values() if n["class_type"] == "LingBotWorldSampler")["inputs"]
    dit = next(n for n in graph.values() if n["class_type"] == "LingBotWorldDiTLoader")["inputs"]
    assert camera["source"] == "actions" and camera["actions"] == "w-10,a-10,d-10,iw-15,none-10,j-10,l-10,s-15"
    assert action_frames(camera["actions"]) == 90 < camera["frames"] == PRESET_FRAMES["official_act2cam"] == 121
    assert "base-cam" in dit["high_noise"]
    official = apply_preset("official_act2cam", SamplingParams())
    assert [sampler[k] for k in ("steps", "shift", "cfg_high", "cfg_low", "boundary", "sampler")] == \
        [official.steps, official.shift, official.cfg_high, official.cfg_low, official.boundary, official.sampler]
    assert sampler.get("preset", "none") == "none"


def test_long_walk_api_workflow_matches_node_schemas(comfy_dirs):
    graph = json.loads((REPO / "workflows" / "api" / "lingbot_long_walk.json").read_text(encoding="utf-8"))
    for node_id, node in graph.items():
        cls = pack_nodes.NODE_CLASS_MAPPINGS.get(node["class_type"])
        if cls is None:
            continue
        schema = cls.INPUT_TYPES()
        assert set(schema["required"]) <= set(node["inputs"]) <= set(schema["required"]) | set(schema.get("optional", {}))
    camera = next(n for n in graph.values() if n["class_type"] == "LingBotWorldCamera")["inputs"]
    long = next(n for n in graph.values() if n["class_type"] == "LingBotWorldLongVideo")["inputs"]
    assert camera["source"] == "actions" and camera["frames"] == long["frames"] == 961
    assert [camera[k] for k in ("width", "height", "window", "overlap")] == [long[k] for k in ("width", "height", "window", "overlap")]
    assert (long["window"], long["overlap"], long["steps"]) == (81, 1, 40)
    assert long["camera_path"] == [next(k for k, n in graph.items() if n["class_type"] == "LingBotWorldCamera"), 2]
    assert "LingBotWorldSampler" not in {n["class_type"] for n in graph.values()}


def test_fast_clip_api_workflow_matches_node_schemas(comfy_dirs):
    """T5 -> Fast DiT Loader -> Camera -> VAE Encode -> Fast Sampler -> VAE Decode -> Create
    Video -> Save Video, 81 frames (7 chunks), the cache at the one set of defaults."""
    from comfyui_lingbot_world.pipeline.fast import DEFAULT_POLICY

    graph = json.loads((REPO / "workflows" / "api" / "lingbot_fast_clip.json").read_text(encoding="utf-8"))
    _match_schemas(graph)
    by_type = {node["class_type"]: (node_id, node["inputs"]) for node_id, node in graph.items()}
    assert set(by_type) == {"LoadImage", "LingBotWorldTextEncode", "LingBotWorldFastDiTLoader", "LingBotWorldCamera",
                            "LingBotWorldVAEEncode", "LingBotWorldFastSampler", "LingBotWorldVAEDecode",
                            "CreateVideo", "SaveVideo", "PreviewImage"}
    sampler = by_type["LingBotWorldFastSampler"][1]
    encode, camera = by_type["LingBotWorldVAEEncode"][1], by_type["LingBotWorldCamera"][1]
    assert encode["frames"] == camera["frames"] == 81
    assert [encode[k] for k in ("width", "height")] == [camera[k] for k in ("width", "height")] == [832, 480]
    assert sampler["fast_dit"][0] == by_type["LingBotWorldFastDiTLoader"][0]
    assert sampler["camera"] == [by_type["LingBotWorldCamera"][0], 0]
    assert sampler["i2v"] == [by_type["LingBotWorldVAEEncode"][0], 0]
    assert (sampler["kv_cache"], sampler["kv_window"], sampler["kv_sink"], sampler["kv_dtype"], sampler["shift"]) == \
        ("sliding_window", DEFAULT_POLICY.window, DEFAULT_POLICY.sink, "auto", 10.0)
    assert by_type["LingBotWorldFastDiTLoader"][1]["fast_model"].endswith("/lingbot_world_fast")
    assert [n["inputs"]["fps"] for n in graph.values() if n["class_type"] == "CreateVideo"] == [16.0]


def test_fast_walk_api_workflow_matches_node_schemas(comfy_dirs):
    """Camera (an action path of 957 frames) -> Fast Long Video: one causal pass."""
    graph = json.loads((REPO / "workflows" / "api" / "lingbot_fast_walk.json").read_text(encoding="utf-8"))
    _match_schemas(graph)
    camera_id, camera = next((k, n["inputs"]) for k, n in graph.items() if n["class_type"] == "LingBotWorldCamera")
    stream = next(n for n in graph.values() if n["class_type"] == "LingBotWorldFastLongVideo")["inputs"]
    assert camera["source"] == "actions" and camera["frames"] == stream["frames"] == 957
    assert [camera[k] for k in ("width", "height")] == [stream[k] for k in ("width", "height")]
    steps = sum(int(token.rsplit("-", 1)[1]) for token in camera["actions"].split(","))
    assert steps < 957  # the action path covers the video
    assert stream["camera_path"] == [camera_id, 2]
    assert not {"LingBotWorldSampler", "LingBotWorldFastSampler", "LingBotWorldVAEEncode"} & \
        {n["class_type"] for n in graph.values()}


def test_play_api_workflow_matches_node_schemas(comfy_dirs):
    graph = json.loads((REPO / "workflows" / "api" / "lingbot_play.json").read_text(encoding="utf-8"))
    _match_schemas(graph)
    play = next(n for n in graph.values() if n["class_type"] == "LingBotWorldPlay")["inputs"]
    assert (play["width"], play["height"], play["mode"], play["chunk_budget"], play["fps"]) == (832, 480, "turn", 80, 16)
    loader = next(k for k, n in graph.items() if n["class_type"] == "LingBotWorldFastDiTLoader")
    assert play["fast_dit"] == [loader, 0] and graph[loader]["inputs"]["bf16_quantize"] == "nf4"
    assert {n["class_type"] for n in graph.values()} == {"LoadImage", "LingBotWorldTextEncode",
                                                         "LingBotWorldFastDiTLoader", "LingBotWorldPlay"}


def _match_schemas(graph: dict) -> None:
    for node_id, node in graph.items():
        cls = pack_nodes.NODE_CLASS_MAPPINGS.get(node["class_type"])
        if cls is None:
            continue
        schema = cls.INPUT_TYPES()
        offered = set(schema["required"]) | set(schema.get("optional", {}))
        assert set(schema["required"]) <= set(node["inputs"]) <= offered, node_id
        for key, value in node["inputs"].items():
            if isinstance(value, list):
                assert value[0] in graph, f"{node_id}.{key} links to a missing node"


def assert_ui_is_the_api_graph(ui: dict, api: dict) -> None:
    """Widget values follow INPUT_TYPES order, links follow the API graph."""
    links = {link[0]: link for link in ui["links"]}
    nodes = {str(n["id"]): n for n in ui["nodes"] if n["type"] != "MarkdownNote"}
    assert set(nodes) == set(api)
    for node_id, node in nodes.items():
        expected = api[node_id]
        assert node["type"] == expected["class_type"]
        for slot in node["inputs"]:
            source = expected["inputs"].get(slot["name"])
            if slot["link"] is None:
                assert source is None
                continue
            _, origin, origin_slot, target, target_slot, _ = links[slot["link"]]
            assert [str(origin), origin_slot] == source and str(target) == node_id
            assert node["inputs"][target_slot] is slot
        names = _widget_names(node["type"])
        if names is None:
            continue
        values = list(node["widgets_values"])
        optional = cls_optional(node["type"])
        for input_name in names:
            if not values and input_name in optional and input_name not in expected["inputs"]:
                continue  # a widget added after the graph was saved: the frontend and the node use its default
            value, wanted = values.pop(0), expected["inputs"][input_name]
            # a widget linked to another node's output keeps a value the link overrides
            assert isinstance(wanted, list) or value == wanted, f"{node_id}.{input_name}"
            for _ in range(EXTRA_WIDGETS.get((node["type"], input_name), 0)):
                values.pop(0)
        assert values == []
    seed_widgets = next(n for n in nodes.values() if n["type"] in SEEDED)["widgets_values"]
    assert seed_widgets[seed_widgets.index(42) + 1] == "fixed"


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_shipped_api_workflow_gives_every_widget_input_of_the_pack_nodes(name, comfy_dirs):
    """The shipped API prompts name every widget input of the pack's nodes, optional ones
    included, as the page's own export of the template does (lingbot_step_cache.json's Camera
    lacked five); older prompts without them still validate (the legacy tests below)."""
    graph = json.loads((REPO / "workflows" / "api" / f"{name}.json").read_text(encoding="utf-8"))
    missing = {f"{node_id} {node['class_type']}": sorted(set(names) - set(node["inputs"]))
               for node_id, node in graph.items() if (names := _widget_names(node["class_type"])) is not None}
    assert {where: names for where, names in missing.items() if names} == {}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_ui_workflow_is_the_api_workflow(name, comfy_dirs):
    """Widget values follow INPUT_TYPES order, links follow the API graph, a thumbnail exists."""
    ui = json.loads((REPO / "example_workflows" / f"{TEMPLATES[name]}.json").read_text(encoding="utf-8"))
    api = json.loads((REPO / "workflows" / "api" / f"{name}.json").read_text(encoding="utf-8"))
    assert (REPO / "example_workflows" / f"{TEMPLATES[name]}.jpg").is_file()
    # Opens at a zoom where the frontend draws node bodies (it simplifies them below ~0.6).
    assert 0.6 <= ui["extra"]["ds"]["scale"] <= 1.5
    assert ui["version"] == 0.4
    assert_ui_is_the_api_graph(ui, api)


def test_templates_are_the_workflows_with_distinct_thumbnails():
    folder = REPO / "example_workflows"
    assert sorted(p.stem for p in folder.glob("*.json")) == sorted(TEMPLATES.values())
    assert sorted(p.stem for p in (REPO / "workflows" / "api").glob("*.json")) == sorted(TEMPLATES)
    thumbs = {name: np.asarray(Image.open(folder / f"{title}.jpg").convert("L"), dtype=np.float32)
              for name, title in TEMPLATES.items()}
    for first, second in [(a, b) for a in thumbs for b in thumbs if a < b]:
        # The camera graphs differ only in a few widgets, the note's heading and the path
        # drawing: at least 0.2% of the pixels must differ clearly (the first thumbnails,
        # which differed in one widget, had 0.12%).
        changed = (np.abs(thumbs[first] - thumbs[second]) > 30).mean()
        assert changed > 0.002, f"{first} and {second} have the same thumbnail ({changed:.4%} differs)"


# How frontend 1.58.1 (with ComfyUI 0.28.0) opens a template from the dialog: it fits the graph
# to the window, ignoring the saved extra.ds (1.32.9, the CI's, opens at extra.ds, so the browser
# test cannot catch a template grown too tall there). LiteGraph's fitToBounds:
# 0.75 of the window over the nodes' bounds (title bars included) padded by 10 on each side.
FIT_WINDOW, FIT_ZOOM, FIT_PAD, TITLE_HEIGHT = (1280, 800), 0.75, 10, 30
LOW_QUALITY_SCALE = 8 / 14  # below it the page draws every node as a grey box


def fitted_scale(ui: dict) -> float:
    nodes = ui["nodes"]
    left = min(n["pos"][0] for n in nodes) - FIT_PAD
    top = min(n["pos"][1] - TITLE_HEIGHT for n in nodes) - FIT_PAD
    right = max(n["pos"][0] + n["size"][0] for n in nodes) + FIT_PAD
    bottom = max(n["pos"][1] + n["size"][1] for n in nodes) + FIT_PAD
    return FIT_ZOOM * min(FIT_WINDOW[0] / (right - left), FIT_WINDOW[1] / (bottom - top))


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_template_fitted_to_the_window_stays_readable(name):
    """Frontend 1.58.1 opened the Fast clip, Fast walk and Play replay templates at 0.565-0.567
    (the Fast DiT Loader's new widgets had made them 1038-1042 units tall): grey boxes."""
    ui = json.loads((REPO / "example_workflows" / f"{TEMPLATES[name]}.json").read_text(encoding="utf-8"))
    assert fitted_scale(ui) >= LOW_QUALITY_SCALE + 0.01, fitted_scale(ui)


# --------------------------------------------------------------------------- workflows saved before


def test_the_legacy_copies_are_the_shipped_set():
    """tests/data/legacy_workflows/ holds every shipped graph as it was, under the names it was
    shipped as: saved workflows and API prompts of users, which must keep loading whatever the
    nodes and the templates' names become."""
    assert sorted(p.stem for p in (LEGACY / "api").glob("*.json")) == sorted(SHIPPED_BEFORE)
    assert sorted(p.stem for p in (LEGACY / "ui").glob("*.json")) == sorted(t for t, _ in SHIPPED_BEFORE.values())
    assert sorted(now for _, now in SHIPPED_BEFORE.values()) == sorted(TEMPLATES)


def test_template_names_fit_a_card_and_keep_the_fast_model_apart():
    """Issue 27: the cards cut long titles (the browser test measures them on the page), and
    "fast mode" (the Base model's step cache) shared a word with the LingBot-World Fast model."""
    assert all(len(title) <= MAX_TITLE for title in TEMPLATES.values()), TEMPLATES
    assert [name for name, title in TEMPLATES.items() if "fast" in title.lower() and "_fast_" not in name] == []


def test_the_dialog_order_is_the_readme_order():
    """web/js/lingbot_templates.js orders the dialog's cards; the README lists the templates in
    the same order (its first one first: the Quick start's camera preset)."""
    import re

    script = (REPO / "web" / "js" / "lingbot_templates.js").read_text(encoding="utf-8")
    order = re.findall(r'^    "([^"]+)",$', script.split("export const ORDER = [", 1)[1].split("];", 1)[0], re.M)
    assert order == list(TEMPLATES.values())
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    listed = readme.split("\n## Templates\n", 1)[1].split("\n## ", 1)[0]  # its table's first column
    assert re.findall(r"^\| \*\*([^*]+)\*\* \|", listed, re.M) == [t.removeprefix("LingBot-World ")
                                                                 for t in TEMPLATES.values()]
    table = (REPO / "workflows" / "README.md").read_text(encoding="utf-8")
    assert re.findall(r"^\| `(\w+)\.json` \| `([^`]+)` \|", table, re.M) == list(TEMPLATES.items())


@pytest.mark.parametrize("name", sorted(SHIPPED_BEFORE))
def test_a_legacy_ui_workflow_converts_to_its_api_prompt(name, comfy_dirs):
    """Read with today's node schemas, the old UI file gives the old API prompt, value for value."""
    ui = json.loads((LEGACY / "ui" / f"{SHIPPED_BEFORE[name][0]}.json").read_text(encoding="utf-8"))
    api = json.loads((LEGACY / "api" / f"{name}.json").read_text(encoding="utf-8"))
    assert_ui_is_the_api_graph(ui, api)


def _offered(spec) -> list | None:
    kind = spec[0]
    return kind if isinstance(kind, list) else spec[1].get("options") if kind == "COMBO" and len(spec) > 1 else None


@pytest.mark.parametrize("name", sorted(SHIPPED_BEFORE))
def test_a_legacy_api_prompt_validates_against_the_node_schemas(name, comfy_dirs):
    """Every input of the old prompt exists, every required one is given, numbers sit in
    their ranges and fixed choices are still offered (file combos list the user's files)."""
    graph = json.loads((LEGACY / "api" / f"{name}.json").read_text(encoding="utf-8"))
    for node_id, node in graph.items():
        cls = pack_nodes.NODE_CLASS_MAPPINGS.get(node["class_type"])
        if cls is None:
            continue
        schema = cls.INPUT_TYPES()
        specs = {**schema["required"], **schema.get("optional", {})}
        assert set(schema["required"]) <= set(node["inputs"]) <= set(specs), node_id
        for key, value in node["inputs"].items():
            spec = specs[key]
            if isinstance(value, list):  # a link
                assert value[0] in graph, f"{node_id}.{key} links to a missing node"
                continue
            options = _offered(spec)
            if options is not None and key not in FILE_COMBOS:
                assert value in options, f"{node_id}.{key}={value!r}"
            if spec[0] in ("INT", "FLOAT"):
                assert spec[1].get("min", value) <= value <= spec[1].get("max", value), f"{node_id}.{key}={value!r}"
