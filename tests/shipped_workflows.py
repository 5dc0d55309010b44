"""The workflows the pack ships: API graphs (workflows/api) and the UI templates beside them."""
from __future__ import annotations

# API graph name -> UI template name, in the README's order (the Templates dialog's, web/js/
# lingbot_templates.js). The dialog shows a custom node's template file name as the card's title
# and (with - and _ as spaces) as its description, so the templates are named for people, short
# enough to show whole on a card (27 characters at most; issue 27).
TEMPLATES = {
    "lingbot_camera_preset": "LingBot-World camera preset",
    "lingbot_camera_files": "LingBot-World camera files",
    "lingbot_no_camera": "LingBot-World no camera",
    "lingbot_step_cache": "LingBot-World step cache",
    "lingbot_long_walk": "LingBot-World long walk",
    "lingbot_act2cam": "LingBot-World act2cam",
    "lingbot_fast_clip": "LingBot-World Fast clip",
    "lingbot_fast_walk": "LingBot-World Fast walk",
    "lingbot_play": "LingBot-World Play",
    "lingbot_play_replay": "LingBot-World Play replay",
}
# The shipped graphs as users saved them (tests/data/legacy_workflows/, under the names they had):
# API name then -> (UI template name then, the shipped graph it is now). Issue 27 shortened the
# names and renamed "fast mode" (the Base model's step cache) apart from LingBot-World Fast.
SHIPPED_BEFORE = {
    **{name: (title, name) for name, title in TEMPLATES.items()},
    "lingbot_camera_files": ("LingBot-World camera path from files", "lingbot_camera_files"),
    "lingbot_no_camera": ("LingBot-World image to video without camera", "lingbot_no_camera"),
    "lingbot_fast": ("LingBot-World fast mode camera preset", "lingbot_step_cache"),
    "lingbot_fast_walk": ("LingBot-World Fast one-minute walk", "lingbot_fast_walk"),
    "lingbot_act2cam": ("LingBot-World act2cam (official settings)", "lingbot_act2cam"),
}
del SHIPPED_BEFORE["lingbot_step_cache"]  # shipped as lingbot_fast
MAX_TITLE = 27  # characters of a title the dialog's card shows whole at 1280 px (its bold font)
# The LingBot-World Fast graphs (their frames fill whole 12-frame chunks: 9, 21, ...).
FAST_WORKFLOWS = ("lingbot_fast_clip", "lingbot_fast_walk")
# A live session: it waits for keys, so it is not run like the others (tests/integration/test_play_server.py
# runs its API graph; the browser test of the Play panel runs the template).
LIVE_TEMPLATES = ("lingbot_play",)
# Graphs that render a Play session again from its action log: they need a session's log in the
# output folder (tests/integration/test_play_replay.py makes one and runs them to the same latent).
REPLAY_TEMPLATES = ("lingbot_play_replay",)

# Inputs whose widget the frontend follows with one more value in widgets_values (the seed's
# "control after generate", LoadImage's upload button), besides what the schema flags.
_SEED_NAMES = ("seed", "noise_seed")
_WIDGET_TYPES = ("COMBO", "INT", "FLOAT", "STRING", "BOOLEAN")


def _is_widget(spec: list) -> bool:
    return isinstance(spec[0], list) or spec[0] in _WIDGET_TYPES


def _extra_values(name: str, spec: list) -> int:
    options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    if options.get("image_upload") or options.get("video_upload"):
        return 1
    if spec[0] == "INT" and (options.get("control_after_generate") or name in _SEED_NAMES):
        return 1
    return 0


def template_prompt(ui: dict, object_info: dict) -> dict:
    """The API prompt that the page queues for a UI workflow (example_workflows/), read with the
    server's own node schemas (GET /object_info): widget values in the schema's input order,
    links as [node id, output slot]; notes (nodes with no schema and no outputs) left out."""
    links = {link[0]: link for link in ui["links"]}
    prompt: dict = {}
    for node in ui["nodes"]:
        schema = object_info.get(node["type"])
        if schema is None:
            if node.get("outputs"):
                raise ValueError(f"node {node['id']}: type {node['type']!r} is not offered by the server")
            continue  # a note
        inputs: dict = {}
        for slot in node.get("inputs", []):
            if slot.get("link") is not None:
                _, origin, origin_slot, *_ = links[slot["link"]]
                inputs[slot["name"]] = [str(origin), origin_slot]
        values = list(node.get("widgets_values") or [])
        specs = {**schema["input"].get("required", {}), **schema["input"].get("optional", {})}
        order = schema["input_order"].get("required", []) + schema["input_order"].get("optional", [])
        for name in order:
            spec = specs[name]
            if not _is_widget(spec):
                continue
            if not values:
                break  # a widget added after the file was saved: the node's default applies
            value = values.pop(0)
            del values[:_extra_values(name, spec)]
            inputs.setdefault(name, value)
        prompt[str(node["id"])] = {"class_type": node["type"], "inputs": inputs}
    return prompt
