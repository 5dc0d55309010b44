"""What the pack's nodes share: the socket types they pass between each other, the inputs
several nodes declare (one declaration: the same names, defaults, ranges and tooltips on
every node, so graphs move between them), and the checks that read those inputs."""
from __future__ import annotations

from pathlib import Path

import torch
from comfy_api.latest import io

from ..pipeline.image import VAESource
from ..pipeline.text import TextEmbeddings
from ..pipeline.text_conditioning import text_from_conditioning
from ..wan.long_video import MAX_FRAMES
from .host.devices import DEVICE_CHOICES, DEVICE_TOOLTIP
from .host.model_files import NO_FILE, VAE_KINDS, list_vae_files, resolve_model_path

# --------------------------------------------------------------------------- socket types

TEXT = "LINGBOT_TEXT"  # pipeline.text.TextEmbeddings
DIT = "LINGBOT_DIT"  # nodes.host.expert_patcher.DiTExperts
CAMERA = "LINGBOT_CAMERA"  # pipeline.camera.CameraCondition
I2V = "LINGBOT_I2V"  # pipeline.image.I2VCondition
CAMERA_PATH = "LINGBOT_CAMERA_PATH"  # pipeline.camera.CameraPath

Text = io.Custom(TEXT)
DiT = io.Custom(DIT)
Camera = io.Custom(CAMERA)
I2VCond = io.Custom(I2V)
CameraPathType = io.Custom(CAMERA_PATH)

CATEGORY = "LingBot-World"
SAMPLERS = ("unipc", "euler")
MAX_SEED = 0xFFFF_FFFF_FFFF_FFFF
PRECISIONS = ("fp32", "bf16")  # the VAE's

# --------------------------------------------------------------------------- inputs


def device_input() -> io.Combo.Input:
    """Where a stage that loads its own model (T5, the VAE) runs."""
    return io.Combo.Input("device", options=list(DEVICE_CHOICES), default="auto", tooltip=DEVICE_TOOLTIP)


def image_input() -> io.Image.Input:
    return io.Image.Input("image", tooltip="Start frame of the video (the first image of a batch is used).")


# Size and length: the Camera, VAE Encode and Long Video nodes must agree.
def width_input() -> io.Int.Input:
    return io.Int.Input("width", default=832, min=16, max=4096, step=16,
                        tooltip="Video width in pixels (a multiple of 16). Must match the VAE Encode node.")


def height_input() -> io.Int.Input:
    return io.Int.Input("height", default=480, min=16, max=4096, step=16,
                        tooltip="Video height in pixels (a multiple of 16). Must match the VAE Encode node.")


def frames_input(maximum: int = 1601, tooltip: str = "Must match the VAE Encode node.") -> io.Int.Input:
    return io.Int.Input("frames", default=81, min=1, max=maximum, step=4,
                        tooltip=f"Frames to generate: 4n+1 (81 = 5 s at 16 fps). {tooltip}")


def window_inputs(default_window: int = 81, optional: bool = False) -> list[io.Int.Input]:
    """The window plan of a long video (wan/long_video.py): the Camera and Long Video nodes."""
    return [
        io.Int.Input("window", default=default_window, min=5, max=MAX_FRAMES, step=4, optional=optional,
                     tooltip="Frames per window of a long video (4n+1; 81 is what the model was trained on)."),
        io.Int.Input("overlap", default=1, min=1, max=MAX_FRAMES - 4, step=4, optional=optional,
                     tooltip="Frames each window takes over from the previous one (4j+1; 1 = the model's "
                     "usual single start frame)."),
    ]


def model_inputs() -> list:
    """The experts and the pack's own prompt embeddings, first on both sampling nodes."""
    return [
        DiT.Input("dit", tooltip="Both experts, from the LingBot-World NF4 DiT Loader."),
        Text.Input("text", optional=True,
                   tooltip="Prompt embeddings from LingBot-World T5 Encode + Unload. Leave empty when "
                   "positive and negative are connected."),
    ]


def guidance_inputs(seed_tooltip: str) -> list:
    """shift, CFG per expert, boundary, seed, sampler: the settings the sampler and the Long
    Video node share."""
    return [
        io.Float.Input("shift", default=10.0, min=0.1, max=100.0, step=0.1,
                       tooltip="Flow-matching sigma shift; higher spends more steps at high noise."),
        io.Float.Input("cfg_high", default=5.0, min=1.0, max=30.0, step=0.1,
                       tooltip="Guidance scale while the high-noise expert runs (1 = no negative pass)."),
        io.Float.Input("cfg_low", default=5.0, min=1.0, max=30.0, step=0.1,
                       tooltip="Guidance scale while the low-noise expert runs (1 = no negative pass)."),
        io.Float.Input("boundary", default=0.947, min=0.0, max=1.0, step=0.001,
                       tooltip="Switch from the high- to the low-noise expert when the timestep "
                       "falls below boundary x 1000."),
        io.Int.Input("seed", default=0, min=0, max=MAX_SEED, control_after_generate=True, tooltip=seed_tooltip),
        io.Combo.Input("sampler", options=list(SAMPLERS), default="unipc",
                       tooltip="unipc: the reference solver; euler: plain flow-matching steps."),
    ]


def conditioning_inputs() -> list:
    """The optional core CONDITIONING inputs, an alternative to the pack's text input."""
    return [
        io.Conditioning.Input("positive", optional=True,
                              tooltip="Instead of text: the prompt from CLIP Text Encode, with umt5_xxl "
                              "loaded by CLIPLoader (type wan)."),
        io.Conditioning.Input("negative", optional=True,
                              tooltip="With positive: the negative prompt from CLIP Text Encode."),
    ]


VAE_TOOLTIP = (
    "Wan2.1 VAE weights (Wan2.1_VAE.pth or wan_2.1_vae.safetensors) from models/lingbot or models/vae. "
    "Not used when vae_model is connected."
)
VAE_MODEL_TOOLTIP = (
    "Optional: a core Load VAE node with wan_2.1_vae.safetensors. When connected it is used instead of "
    "the vae file."
)


def vae_file_inputs() -> list[io.Input]:
    files = list_vae_files()
    return [
        # "(none)" lets a workflow that only uses vae_model carry no file name; a fresh node
        # still defaults to the first file found.
        io.Combo.Input("vae", options=files + [NO_FILE], default=files[0] if files else NO_FILE, tooltip=VAE_TOOLTIP),
    ]


def vae_model_input() -> io.Vae.Input:
    return io.Vae.Input("vae_model", optional=True, tooltip=VAE_MODEL_TOOLTIP)


def precision_input() -> io.Combo.Input:
    # Optional and last: graphs saved before it keep their widget values and validate.
    return io.Combo.Input(
        "precision", options=list(PRECISIONS), default="fp32", optional=True,
        tooltip="fp32 matches the reference VAE. bf16 halves the VAE's memory (480x832x81 decode: 4.4 instead "
        "of 8.7 GiB on an H100) and is ~1.7x faster; its decoded pixels differed from fp32 by 0.006 on "
        "average (max 0.06, on the -1..1 scale; synthetic weights, bench/RESULTS.md).",
    )


# --------------------------------------------------------------------------- reading them


def offered(node: type[io.ComfyNode], **values) -> bool | str:
    """True when every given combo value is one the node offers now, else what is wrong.

    For the nodes' ``validate_inputs`` of the file and folder combos: the 0.3.x hosts do not
    check V3 combo values at all, and a host skips its own check of an input that
    ``validate_inputs`` takes, so the pack checks them the same way on every host.
    """
    # define_schema, not GET_SCHEMA: during validation the class is a locked clone that
    # cannot cache a schema.
    options = {i.id: i.options for i in node.define_schema().inputs if isinstance(i, io.Combo.Input)}
    wrong = [
        f"{name}: {value!r} is not offered; the list has {len(options[name])} entries (refresh, or check the "
        "model folders)"
        for name, value in values.items()
        if isinstance(value, str) and value not in options.get(name, [value])
    ]
    return "; ".join(wrong) or True


def check_input(value, kind: type, field: str, source: str) -> None:
    if not isinstance(value, kind):
        raise ValueError(f"{field}: expected the output of {source}, got {type(value).__name__}")


def check_image(image) -> None:
    if not isinstance(image, torch.Tensor) or image.dim() != 4 or image.shape[0] < 1 or image.shape[-1] not in (1, 3, 4):
        shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
        raise ValueError(f"image: expected a ComfyUI IMAGE batch [B, H, W, 3], got {shape}")


def check_sampler(sampler: str) -> None:
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler: {sampler!r} is not one of {', '.join(SAMPLERS)}")


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision: {precision!r} is not one of {', '.join(PRECISIONS)}")


def pick_text(text, positive, negative, text_dim: int) -> TextEmbeddings:
    """The prompt embeddings from exactly one source: the pack's T5 node or core CONDITIONING."""
    core = positive is not None or negative is not None
    if text is not None and core:
        raise ValueError("text and positive/negative are both connected; connect either LingBot-World T5 Encode "
                         "+ Unload to text, or CLIP Text Encode nodes to positive and negative")
    if text is None and not core:
        raise ValueError("no prompt: connect LingBot-World T5 Encode + Unload to text, or CLIP Text Encode "
                         "(CLIPLoader type wan) to positive and negative")
    if text is not None:
        check_input(text, TextEmbeddings, "text", "LingBot-World T5 Encode + Unload")
        return text
    if positive is None:
        raise ValueError("positive: connect a CLIP Text Encode with the prompt next to negative")
    embeddings = text_from_conditioning(positive, negative)
    if embeddings.positive.shape[-1] != text_dim:
        raise ValueError(
            f"positive: the text encoder gives {embeddings.positive.shape[-1]} features per token but the DiT takes "
            f"{text_dim}; load umt5_xxl with CLIPLoader type wan"
        )
    return embeddings


def vae_source(vae: str, vae_model) -> tuple[VAESource, int | Path]:
    """What the pipeline loads (a state dict or a file) and its size for make_room."""
    if vae_model is not None:
        get_sd = getattr(vae_model, "get_sd", None)
        if get_sd is None:
            raise ValueError(f"vae_model: expected a VAE from Load VAE, got {type(vae_model).__name__}")
        tensors = get_sd()
        return tensors, sum(t.numel() * t.element_size() for t in tensors.values())
    if vae == NO_FILE:
        raise ValueError("vae: choose a Wan2.1 VAE file, or connect a Load VAE node to vae_model")
    path = resolve_model_path(vae, VAE_KINDS, "vae", want_dir=False)
    return path, path
