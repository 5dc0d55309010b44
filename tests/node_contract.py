"""What the pack promises for each node: its folder in the node menu, its inputs in the order
saved workflows store them (required, then optional), each input's type and the default a
fresh node shows, and its outputs in the order links name them. One table, checked against
the node classes in process (``unit/test_node_schemas.py``) and against a real server's
/object_info (``integration/test_workflows.py``), both through ``differences``.

A new input is one ``Input`` in its node's row (one in a shared group such as
``FAST_SAMPLING`` where several nodes take it at the same place); one that older workflows
must keep working without goes at the end of ``optional`` (a UI workflow stores widget
values by position, an API prompt may lack it). A new output is one ``Output`` at the end of
``outputs`` (links name outputs by position).
"""
from __future__ import annotations

from dataclasses import dataclass

from comfyui_lingbot_world.wan.negative_prompt import DEFAULT_NEGATIVE_PROMPT

NO_DEFAULT = object()  # a link: no widget, no default
FILES = object()  # a combo of the files found: its default depends on what is installed


@dataclass(frozen=True)
class Input:
    name: str
    type: str  # a widget's (INT, FLOAT, STRING, BOOLEAN, COMBO) or a link's (LINGBOT_DIT, IMAGE, ...)
    default: object = NO_DEFAULT


@dataclass(frozen=True)
class Output:
    name: str
    type: str


@dataclass(frozen=True)
class NodeContract:
    category: str
    required: tuple[Input, ...]
    optional: tuple[Input, ...]
    outputs: tuple[Output, ...]


def files(name: str) -> Input:
    return Input(name, "COMBO", FILES)


BASE, FAST, PLAY = "LingBot-World/Base", "LingBot-World/Fast", "LingBot-World/Play"
CAMERA, TEXT_VAE = "LingBot-World/Camera and Act", "LingBot-World/Text and VAE"

# The inputs several nodes show alike.
DEVICE = Input("device", "COMBO", "auto")
VAE_MODEL, PRECISION = Input("vae_model", "VAE"), Input("precision", "COMBO", "fp32")
SIZE = (Input("width", "INT", 832), Input("height", "INT", 480))
# The Base sampling widgets after steps (Sampler, Long Video).
BASE_SAMPLING = (Input("shift", "FLOAT", 10.0), Input("cfg_high", "FLOAT", 5.0), Input("cfg_low", "FLOAT", 5.0),
                 Input("boundary", "FLOAT", 0.947), Input("seed", "INT", 0), Input("sampler", "COMBO", "unipc"))
KV_POLICY = (Input("kv_window", "INT", 9), Input("kv_sink", "INT", 3), Input("kv_dtype", "COMBO", "auto"))
# The sampling widgets of the three Fast nodes (Fast Sampler, Fast Long Video, Play), after their cache policy.
FAST_SAMPLING = (Input("shift", "FLOAT", 10.0), Input("seed", "INT", 0))
# Appended last and optional on the three Fast nodes: graphs saved before it run the official 4.
STEPS = Input("steps", "INT", 4)
TEXT, POSITIVE, NEGATIVE = Input("text", "LINGBOT_TEXT"), Input("positive", "CONDITIONING"), \
    Input("negative", "CONDITIONING")
FAST_DIT, IMAGE = Input("fast_dit", "LINGBOT_FAST_DIT"), Input("image", "IMAGE")
KV_CACHE = Input("kv_cache", "COMBO", "sliding_window")

CONTRACT: dict[str, NodeContract] = {
    "LingBotWorldTextEncode": NodeContract(
        TEXT_VAE,
        required=(files("t5_file"), files("tokenizer"), Input("prompt", "STRING", ""),
                  Input("negative_prompt", "STRING", DEFAULT_NEGATIVE_PROMPT), DEVICE),
        optional=(),
        outputs=(Output("text", "LINGBOT_TEXT"),)),
    "LingBotWorldDiTLoader": NodeContract(
        BASE,
        required=(files("high_noise"), files("low_noise"), Input("bf16_quantize", "COMBO", "none"),
                  Input("block_swap", "INT", 0)),
        optional=(Input("devices", "COMBO", "single"), Input("weights", "COMBO", "as stored")),
        outputs=(Output("dit", "LINGBOT_DIT"),)),
    "LingBotWorldCamera": NodeContract(
        CAMERA,
        required=(Input("source", "COMBO", "preset"), Input("preset", "COMBO", "dolly_in"),
                  Input("speed", "FLOAT", 1.0), files("poses_file"), files("intrinsics_file"), *SIZE,
                  Input("frames", "INT", 81)),
        optional=(Input("actions", "STRING", "w-20,j-10,w-30"), files("pose_export"),
                  Input("normalize_scale", "BOOLEAN", True), Input("window", "INT", 81), Input("overlap", "INT", 1),
                  Input("camera_axes", "COMBO", "opencv"), Input("keyframes", "COMBO", "act2cam (official)")),
        outputs=(Output("camera", "LINGBOT_CAMERA"), Output("path_preview", "IMAGE"),
                 Output("camera_path", "LINGBOT_CAMERA_PATH"))),
    "LingBotWorldVAEEncode": NodeContract(
        TEXT_VAE,
        required=(IMAGE, files("vae"), *SIZE, Input("frames", "INT", 81), DEVICE),
        optional=(VAE_MODEL, PRECISION),
        outputs=(Output("i2v", "LINGBOT_I2V"),)),
    "LingBotWorldSampler": NodeContract(
        BASE,
        required=(Input("dit", "LINGBOT_DIT"), Input("i2v", "LINGBOT_I2V"), Input("steps", "INT", 40), *BASE_SAMPLING),
        optional=(TEXT, Input("camera", "LINGBOT_CAMERA"), POSITIVE, NEGATIVE, Input("cache_threshold", "FLOAT", 0.0),
                  Input("cfg_truncate", "FLOAT", 0.0), Input("attention", "COMBO", "auto"),
                  Input("preset", "COMBO", "none")),
        outputs=(Output("samples", "LATENT"),)),
    "LingBotWorldVAEDecode": NodeContract(
        TEXT_VAE,
        required=(Input("samples", "LATENT"), files("vae"), Input("tile", "INT", 0), DEVICE),
        optional=(VAE_MODEL, PRECISION),
        outputs=(Output("frames", "IMAGE"),)),
    "LingBotWorldLoraLoader": NodeContract(
        BASE,
        required=(Input("dit", "LINGBOT_DIT"), Input("lora_high_noise", "COMBO", "none"),
                  Input("strength_high", "FLOAT", 1.0), Input("lora_low_noise", "COMBO", "none"),
                  Input("strength_low", "FLOAT", 1.0)),
        optional=(),
        outputs=(Output("dit", "LINGBOT_DIT"),)),
    "LingBotWorldLongVideo": NodeContract(
        BASE,
        required=(Input("dit", "LINGBOT_DIT"), IMAGE, files("vae"), *SIZE, Input("frames", "INT", 81),
                  Input("window", "INT", 81), Input("overlap", "INT", 1), Input("scale_quantile", "FLOAT", 1.0),
                  Input("steps", "INT", 40), *BASE_SAMPLING, Input("decode_tile", "INT", 0),
                  Input("keep_experts", "BOOLEAN", False), Input("fps", "INT", 16),
                  Input("filename_prefix", "STRING", "LingBotWorld/long")),
        optional=(TEXT, Input("camera_path", "LINGBOT_CAMERA_PATH"), VAE_MODEL, POSITIVE, NEGATIVE),
        outputs=(Output("video", "VIDEO"),)),
    "LingBotWorldFastDiTLoader": NodeContract(
        FAST,
        required=(files("fast_model"), Input("bf16_quantize", "COMBO", "nf4"), Input("block_swap", "INT", 0)),
        optional=(Input("weights", "COMBO", "as stored"), Input("devices", "COMBO", "single"),
                  Input("attention", "COMBO", "auto")),
        outputs=(Output("fast_dit", "LINGBOT_FAST_DIT"), Output("model_info", "STRING"))),
    "LingBotWorldFastSampler": NodeContract(
        FAST,
        required=(FAST_DIT, Input("i2v", "LINGBOT_I2V"), KV_CACHE, *KV_POLICY, *FAST_SAMPLING),
        optional=(TEXT, POSITIVE, Input("camera", "LINGBOT_CAMERA"), STEPS),
        outputs=(Output("samples", "LATENT"),)),
    "LingBotWorldFastLongVideo": NodeContract(
        FAST,
        required=(FAST_DIT, IMAGE, files("vae"), *SIZE, Input("frames", "INT", 81), KV_CACHE, *KV_POLICY,
                  *FAST_SAMPLING, Input("decode_tile", "INT", 0), Input("fps", "INT", 16),
                  Input("filename_prefix", "STRING", "LingBotWorld/fast_long")),
        optional=(TEXT, POSITIVE, Input("camera_path", "LINGBOT_CAMERA_PATH"), VAE_MODEL, PRECISION, STEPS),
        outputs=(Output("video", "VIDEO"),)),
    "LingBotWorldPlay": NodeContract(
        PLAY,
        required=(FAST_DIT, IMAGE, files("vae"), *SIZE, Input("chunk_budget", "INT", 80),
                  Input("mode", "COMBO", "turn"), Input("idle_timeout", "INT", 120), *KV_POLICY, *FAST_SAMPLING,
                  Input("fps", "INT", 16), Input("filename_prefix", "STRING", "LingBotWorld/play")),
        optional=(TEXT, POSITIVE, VAE_MODEL, PRECISION, Input("live_decoder", "VAE"), STEPS),
        outputs=(Output("video", "VIDEO"), Output("action_log", "STRING"), Output("latent", "LATENT"))),
    # What the Fast clip nodes take from a Play session's log: kv_dtype and precision link
    # into their combo widgets.
    "LingBotWorldPlayLog": NodeContract(
        PLAY,
        required=(files("log"),),
        optional=(IMAGE,),
        outputs=(Output("start_image", "IMAGE"), Output("prompt", "STRING"), Output("negative_prompt", "STRING"),
                 Output("actions", "STRING"), Output("frames", "INT"), Output("width", "INT"),
                 Output("height", "INT"), Output("seed", "INT"), Output("shift", "FLOAT"), Output("kv_window", "INT"),
                 Output("kv_sink", "INT"), Output("kv_dtype", "COMBO"), Output("precision", "COMBO"),
                 Output("steps", "INT"))),
}


def input_type(spec: list | tuple) -> str:
    """An input's type from its schema entry: V1 ``[[choices], {...}]`` is a combo."""
    return "COMBO" if isinstance(spec[0], list) else spec[0]


def _input_differences(node_id: str, section: str, promised: tuple[Input, ...], specs: dict) -> list[str]:
    where = f"{node_id} {section}"
    if list(specs) != [i.name for i in promised]:
        return [f"{where} inputs are {list(specs)}, promised {[i.name for i in promised]}"]
    found = []
    for promise in promised:
        spec = specs[promise.name]
        options = spec[1] if len(spec) > 1 else {}
        if input_type(spec) != promise.type:
            found.append(f"{where} {promise.name}: type {input_type(spec)}, promised {promise.type}")
        if promise.default is NO_DEFAULT or promise.default is FILES:
            continue
        if options.get("default", NO_DEFAULT) != promise.default:
            found.append(f"{where} {promise.name}: default {options.get('default')!r}, promised {promise.default!r}")
    return found


def differences(node_id: str, category: str, required: dict, optional: dict, outputs: list[tuple[str, str]],
                contract: NodeContract | None = None) -> list[str]:
    """What a node's schema (its category, ``{name: [type, options]}`` per section, its
    ``(name, type)`` outputs) breaks of ``contract`` (``CONTRACT[node_id]`` by default);
    [] when it keeps it all."""
    contract = contract or CONTRACT[node_id]
    found = [] if category == contract.category else [f"{node_id} category {category!r}, promised "
                                                      f"{contract.category!r}"]
    found += _input_differences(node_id, "required", contract.required, required)
    found += _input_differences(node_id, "optional", contract.optional, optional)
    promised = [(o.name, o.type) for o in contract.outputs]
    if list(outputs) != promised:
        found.append(f"{node_id} outputs are {list(outputs)}, promised {promised}")
    return found
