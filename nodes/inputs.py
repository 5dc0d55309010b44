"""What the pack's nodes share: the socket types they pass between each other, the inputs
several nodes declare (one declaration: the same names, defaults, ranges and tooltips on
every node, so graphs move between them), and the checks that read those inputs."""
from __future__ import annotations

import math
from pathlib import Path

import torch
from comfy_api.latest import io

from ..pipeline.experts import AS_STORED, WEIGHT_CHOICES
from ..pipeline.fast import DEFAULT_POLICY, FastParams
from ..pipeline.guards import VAE_PRECISIONS
from ..pipeline.image import VAESource
from ..pipeline.text import TextEmbeddings
from ..pipeline.text_conditioning import embedding_from_conditioning, text_from_conditioning
from ..wan.runtime.attention import CHOICES as ATTENTION_CHOICES
from ..wan.runtime.kv_cache import KV_DTYPES, CachePolicy
from ..wan.geometry import MAX_SEED
from ..wan.long_video import MAX_FRAMES
from ..wan.scheduler import DEFAULT_FAST_STEPS, FAST_STEPS, SAMPLERS, fast_step_indices
from .host.devices import DEVICE_CHOICES, DEVICE_TOOLTIP
from .host.expert_patcher import QUANTIZE_CHOICES, ExpertLoadOptions
from .host.fast_model import FastDiT
from .host.model_files import NO_FILE, VAE_KINDS, default_in_package, list_vae_files, resolve_model_path

# --------------------------------------------------------------------------- socket types

TEXT = "LINGBOT_TEXT"  # pipeline.text.TextEmbeddings
DIT = "LINGBOT_DIT"  # nodes.host.expert_patcher.DiTExperts
CAMERA = "LINGBOT_CAMERA"  # pipeline.camera.CameraCondition
I2V = "LINGBOT_I2V"  # pipeline.image.I2VCondition
CAMERA_PATH = "LINGBOT_CAMERA_PATH"  # pipeline.camera.CameraPath
FAST_DIT = "LINGBOT_FAST_DIT"  # nodes.host.fast_model.FastDiT

Text = io.Custom(TEXT)
DiT = io.Custom(DIT)
Camera = io.Custom(CAMERA)
I2VCond = io.Custom(I2V)
CameraPathType = io.Custom(CAMERA_PATH)
FastDiTType = io.Custom(FAST_DIT)

CATEGORY = "LingBot-World"
# The node library's folders (one per kind of node; the Act checkpoint is driven through the
# Camera node's W/A/S/D inputs, so its folder is the camera's).
BASE_CATEGORY = f"{CATEGORY}/Base"
FAST_CATEGORY = f"{CATEGORY}/Fast"
PLAY_CATEGORY = f"{CATEGORY}/Play"
CAMERA_CATEGORY = f"{CATEGORY}/Camera and Act"
FILES_CATEGORY = f"{CATEGORY}/Text and VAE"
CAMERA_NODE = "LingBot-World Camera (Act, Base-Cam)"  # the Camera node's display name, for messages


def search_aliases(*aliases: str) -> dict[str, list[str]]:
    """``io.Schema`` keywords that make the node search find a node by these phrases: the V3
    schema's ``search_aliases`` where the host has it (ComfyUI 0.28; its frontend searches them,
    every word of a query within one alias), nothing on older hosts (0.3.75), whose search reads
    the node's name and display name only."""
    fields = getattr(io.Schema, "__dataclass_fields__", {})
    return {"search_aliases": list(aliases)} if "search_aliases" in fields else {}


PRECISIONS = tuple(VAE_PRECISIONS)  # the VAE's (pipeline/guards.py reads them)

# --------------------------------------------------------------------------- inputs

MAX_BLOCK_SWAP = 40  # the A14B transformers have 40 blocks; a larger count means "all on the GPU"


# The DiT loaders (Base experts, Fast): how the transformer comes into memory.
def quantize_input(tooltip: str, default: str = "none") -> io.Combo.Input:
    return io.Combo.Input("bf16_quantize", options=list(QUANTIZE_CHOICES), default=default, tooltip=tooltip)


WEIGHTS_TOOLTIP = (
    "The kind the transformer's linear weights are held in once loaded. as stored: as its folder holds them "
    "(a bf16 folder follows bf16_quantize). auto: the fastest kind this GPU runs whose weights fit beside the "
    "run (fp8 on RTX 40 / H100 and newer, int8 on RTX 30 / A100, else nf4; with fewer blocks on the GPU a larger "
    "kind fits). fp8 (~18.5 GB for A14B, needs RTX 40 / H100 or newer) and int8 (~18.5 GB, RTX 30 / A100 or newer) "
    "multiply in 8 bits with per-channel weight and per-token activation scales; made on load from any folder, or "
    "written once by 'python . quantize --format fp8'. nf4 ~9.6 GB, bf16 ~37 GB. The 8-bit kinds' picture "
    "quality on the real weights is not measured yet (their deviation from bf16 on synthetic weights is in "
    "bench/RESULTS.md); LoRAs work on every kind.")


def weights_input(default: str = AS_STORED) -> io.Combo.Input:
    # Optional: saved workflows and API prompts from before this input load with the default.
    return io.Combo.Input("weights", options=list(WEIGHT_CHOICES), default=default, optional=True,
                          tooltip=WEIGHTS_TOOLTIP)


ATTENTION_TOOLTIP = (
    "auto: LINGBOT_ATTENTION when it is set, else the kernel this GPU runs fastest among those installed (the same "
    "rule in every node and the command line): FlashAttention 3 on H100/H200 (pip install fa3-fwd), SageAttention "
    "on RTX 30/40, flash-attn 2 on A100 and on RTX 30/40 without SageAttention, else PyTorch SDPA. flash_fp8 "
    "(H100/H200 only): FlashAttention 3 on fp8 q, k and v, faster still, but it rounds them to 8 bits and its "
    "effect on the real model's pictures is not measured, so auto never picks it (a bf16 Fast KV cache then also "
    "keeps its frames' fp8 copy: more memory). sage, flash and flash_fp8 need their packages and a CUDA GPU; a "
    "choice that cannot run here is refused naming what can. Speeds: bench/RESULTS.md.")


def attention_input(what: str) -> io.Combo.Input:
    # Optional: saved workflows and API prompts from before this input run with auto.
    return io.Combo.Input("attention", options=list(ATTENTION_CHOICES), default="auto", optional=True,
                          tooltip=f"{what} {ATTENTION_TOOLTIP}")


def check_attention(attention: str) -> str:
    """The ``attention`` widget's value, checked (the kernel is decided per device when the run
    attends: ``wan.runtime.attention.decide``)."""
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"attention: {attention!r} is not one of {', '.join(ATTENTION_CHOICES)}")
    return attention


def block_swap_input() -> io.Int.Input:
    # The id stays "block_swap" (saved workflows and API prompts use it); the number is
    # the blocks KEPT on the GPU, as the label says.
    return io.Int.Input("block_swap", display_name="blocks on GPU (0 = all)", default=0, min=0,
                        max=MAX_BLOCK_SWAP, step=1,
                        tooltip="Blocks kept on the GPU; 0 = all (no block swap). N > 0 keeps N of the 40 "
                        "blocks on the GPU; the other blocks (spread among them) wait in pinned RAM and each "
                        "streams to the GPU while the blocks before it compute. Lower = less VRAM (~0.2 GB per block "
                        "for an NF4 A14B expert, ~0.9 GB for bf16) and more RAM; while the copies hide behind the "
                        "compute, the same speed (measured figures: bench/RESULTS.md).")


def device_input() -> io.Combo.Input:
    """Where a stage that loads its own model (T5, the VAE) runs."""
    return io.Combo.Input("device", options=list(DEVICE_CHOICES), default="auto", tooltip=DEVICE_TOOLTIP)


def image_input() -> io.Image.Input:
    return io.Image.Input("image", tooltip="Start frame of the video (the first image of a batch is used).")


# Size and length: a Camera node and the node it feeds (VAE Encode for one pass, a Long Video
# node) must agree. ``match`` says, on each node, which other node that is.
MATCH_CAMERA = "Must match the Camera node."
MATCH_CAMERA_FEEDS = "Must match the VAE Encode node it feeds (one pass) or the Long Video node."
DEFAULT_FRAMES = 81  # the model's trained clip (5 s at 16 fps); every node's default, so fresh nodes agree


def _with(text: str, match: str) -> str:
    return f"{text} {match}" if match else text


def width_input(match: str = "") -> io.Int.Input:
    return io.Int.Input("width", default=832, min=16, max=4096, step=16,
                        tooltip=_with("Video width in pixels (a multiple of 16).", match))


def height_input(match: str = "") -> io.Int.Input:
    return io.Int.Input("height", default=480, min=16, max=4096, step=16,
                        tooltip=_with("Video height in pixels (a multiple of 16).", match))


def frames_input(maximum: int = 1601, match: str = "") -> io.Int.Input:
    return io.Int.Input("frames", default=DEFAULT_FRAMES, min=1, max=maximum, step=4,
                        tooltip=_with("Frames to generate: 4n+1 (81 = 5 s at 16 fps).", match))


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
        # defaults to a file (the DiT Loader's package's first).
        io.Combo.Input("vae", options=files + [NO_FILE], default=default_in_package(files) or NO_FILE,
                       tooltip=VAE_TOOLTIP),
    ]


def vae_model_input() -> io.Vae.Input:
    return io.Vae.Input("vae_model", optional=True, tooltip=VAE_MODEL_TOOLTIP)


def precision_input(note: str = "") -> io.Combo.Input:
    # Optional and last: graphs saved before it keep their widget values and validate.
    return io.Combo.Input(
        "precision", options=list(PRECISIONS), default="fp32", optional=True,
        tooltip="fp32 matches the reference VAE. bf16 halves the VAE's memory and is faster; its decoded pixels "
        "differ slightly from fp32's (measured figures: bench/RESULTS.md)." + (f" {note}" if note else ""),
    )


# LingBot-World Fast: the KV cache policy, shift and seed (the Fast Sampler and Fast Long
# Video). The defaults are pipeline.fast.DEFAULT_POLICY's, the one place they are set.
KV_CACHE_CHOICES = ("sliding_window", "full")
KV_AUTO = "auto"  # the memory plan's dtype (pipeline.memory.plan_fast_memory)
KV_DTYPE_CHOICES = (KV_AUTO, *KV_DTYPES)
MAX_KV_FRAMES = 240  # the latent frames of 957 video frames, the longest Fast video; more is the full cache


def fast_cache_inputs() -> list:
    default = DEFAULT_POLICY
    return [
        io.Combo.Input("kv_cache", options=list(KV_CACHE_CHOICES),
                       default="full" if default.full else "sliding_window",
                       tooltip="What each 12-frame chunk attends to. sliding_window: the first kv_sink latent "
                       "frames (the start image) and the most recent ones, kv_window in all; memory stays the "
                       "same however long the video. full: every frame made so far, as the official code and the "
                       "model's training do; memory grows with the video (1.28 GB per latent frame at 480x832 in "
                       "bf16: ~27 GB at 81 frames)."),
        io.Int.Input("kv_window", default=default.window or 9, min=3, max=MAX_KV_FRAMES, step=1,
                     tooltip="sliding_window: latent frames (4 video frames each) one chunk attends to, its own "
                     "3 included; at least 3, and more than kv_sink + 2. 9 keeps the start frames, the previous "
                     "chunk and the chunk itself (11.9 GB at 480x832 in bf16). A window as long as the video is "
                     "the full cache. The model was trained with the full cache: the window's effect on quality "
                     "with the real weights is not measured here."),
        io.Int.Input("kv_sink", default=default.sink, min=0, max=MAX_KV_FRAMES, step=1,
                     tooltip="sliding_window: the video's first latent frames that always stay in view (the "
                     "start image is latent frame 0); smaller than kv_window - 2."),
        io.Combo.Input("kv_dtype", options=list(KV_DTYPE_CHOICES), default=KV_AUTO,
                       tooltip="auto: bf16 when the run fits the GPU with it (the memory plan: the transformer, the "
                       "cache, the VAE where the node holds one, and a margin), else int8; the log says which and "
                       "why. bf16: the cache in the model's precision. int8: "
                       "the cached frames in 8 bits with per-token scales, about 40% of the memory (~4.7 GB "
                       "instead of 11.9 GB for window 9 at 480x832); a small error in what later chunks see."),
    ]


def fast_sampling_inputs(seed_tooltip: str) -> list:
    return [
        io.Float.Input("shift", default=10.0, min=0.1, max=100.0, step=0.1,
                       tooltip="Flow-matching sigma shift of the fixed timesteps (10 as the official Fast CLI)."),
        io.Int.Input("seed", default=0, min=0, max=MAX_SEED, control_after_generate=True, tooltip=seed_tooltip),
    ]


def fast_steps_input() -> io.Int.Input:
    """LingBot-World Fast's steps per chunk (optional and declared after every other widget of
    the Fast nodes: graphs saved without it load with 4, the official schedule)."""
    return io.Int.Input("steps", default=DEFAULT_FAST_STEPS, min=min(FAST_STEPS), max=max(FAST_STEPS), optional=True,
                        tooltip="Denoising steps per 12-frame chunk. 4: the official schedule. 3, 2 or 1: its first "
                        "timesteps only, the same model and loop: fewer transformer passes per chunk (4 steps = 5 "
                        "passes with the one that stores the chunk, 2 steps = 3 passes, 1 step = 2), so faster. The "
                        "model was trained for 4: the picture quality of fewer steps on the real weights is not "
                        "measured here.")


FAST_SEED_TOOLTIP = ("Seed of the noise. Each 12-frame chunk draws its noise from (seed, chunk): a chunk's noise "
                     "does not depend on how long the video is.")


def fast_prompt_inputs() -> list:
    """The prompt of the Fast nodes: the pack's T5 node, or one core CONDITIONING (no CFG:
    there is no negative prompt)."""
    return [
        Text.Input("text", optional=True,
                   tooltip="Prompt embeddings from LingBot-World T5 Encode + Unload (its negative prompt is not "
                   "used: Fast runs without CFG). Leave empty when positive is connected."),
        io.Conditioning.Input("positive", optional=True,
                              tooltip="Instead of text: the prompt from CLIP Text Encode, with umt5_xxl loaded by "
                              "CLIPLoader (type wan). Fast has no negative prompt."),
    ]


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


def load_options(bf16_quantize: str, block_swap: int, weights: str = AS_STORED) -> ExpertLoadOptions:
    """The loaders' bf16_quantize, block_swap and weights widgets, checked, as load options."""
    if weights not in WEIGHT_CHOICES:
        raise ValueError(f"weights: {weights!r} is not one of {', '.join(WEIGHT_CHOICES)}")
    if bf16_quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"bf16_quantize: {bf16_quantize!r} is not one of {', '.join(QUANTIZE_CHOICES)}")
    if isinstance(block_swap, bool) or not isinstance(block_swap, int) or not 0 <= block_swap <= MAX_BLOCK_SWAP:
        raise ValueError(f"block_swap: {block_swap!r} is not a count of blocks kept on the GPU from 0 (all) to "
                         f"{MAX_BLOCK_SWAP}")
    return ExpertLoadOptions(quantize=None if bf16_quantize == "none" else bf16_quantize, weights=weights,
                             blocks_on_gpu=block_swap or None)  # the widget's 0 = all blocks


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


def pick_prompt(text, positive, text_dim: int) -> torch.Tensor:
    """The Fast nodes' prompt states [tokens, text_dim] from exactly one source: the pack's
    T5 node (its positive prompt) or one core CONDITIONING."""
    if text is not None and positive is not None:
        raise ValueError("text and positive are both connected; connect either LingBot-World T5 Encode + Unload to "
                         "text, or CLIP Text Encode to positive")
    if text is None and positive is None:
        raise ValueError("no prompt: connect LingBot-World T5 Encode + Unload to text, or CLIP Text Encode "
                         "(CLIPLoader type wan) to positive")
    if text is not None:
        check_input(text, TextEmbeddings, "text", "LingBot-World T5 Encode + Unload")
        prompt = text.positive
    else:
        prompt = embedding_from_conditioning(positive, "positive")
    if prompt.shape[-1] != text_dim:
        source = "text" if text is not None else "positive"
        raise ValueError(f"{source}: the text encoder gives {prompt.shape[-1]} features per token but the Fast "
                         f"transformer takes {text_dim}; use umT5-XXL (CLIPLoader type wan)")
    return prompt


def cache_policy(kv_cache: str, kv_window: int, kv_sink: int, kv_dtype: str) -> CachePolicy:
    """The KV cache policy of the Fast widgets; errors name the widget. kv_dtype "auto"
    gives the bf16 policy, whose dtype the memory plan then decides for the device
    (``host.fast_model.prepared_fast_run``)."""
    if kv_cache not in KV_CACHE_CHOICES:
        raise ValueError(f"kv_cache: {kv_cache!r} is not one of {', '.join(KV_CACHE_CHOICES)}")
    if kv_dtype not in KV_DTYPE_CHOICES:
        raise ValueError(f"kv_dtype: {kv_dtype!r} is not one of {', '.join(KV_DTYPE_CHOICES)}")
    if kv_dtype == KV_AUTO:
        kv_dtype = "bf16"
    if kv_cache == "full":
        return CachePolicy(window=None, sink=0, dtype=kv_dtype)
    for name, value in (("kv_window", kv_window), ("kv_sink", kv_sink)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}: {value!r} is not a whole number of latent frames")
    return CachePolicy(window=kv_window, sink=kv_sink, dtype=kv_dtype)  # its errors name kv_window / kv_sink


FAST_LOADER = "LingBot-World Fast DiT Loader"


def check_shift(shift: float) -> float:
    if isinstance(shift, bool) or not isinstance(shift, (int, float)) or not math.isfinite(shift) or shift <= 0:
        raise ValueError(f"shift: {shift!r} is not a number above 0 (10 is the official Fast setting)")
    return float(shift)


def fast_params(kv_cache: str, kv_window: int, kv_sink: int, kv_dtype: str, shift: float, seed: int,
                steps: int = DEFAULT_FAST_STEPS) -> FastParams:
    """The Fast nodes' cache and sampling widgets as ``FastParams`` (kv_dtype auto: bf16,
    fitted to the device when the run is prepared); errors name the widget."""
    return FastParams(seed=seed, shift=check_shift(shift), policy=cache_policy(kv_cache, kv_window, kv_sink, kv_dtype),
                      timestep_indices=fast_step_indices(steps))


def fast_prompt(fast_dit, text, positive) -> torch.Tensor:
    """The Fast nodes' transformer input checked and their prompt picked (``pick_prompt``)."""
    check_input(fast_dit, FastDiT, "fast_dit", FAST_LOADER)
    return pick_prompt(text, positive, fast_dit.config.text_dim)


def vae_source_bytes(vae: str, vae_model) -> tuple[VAESource, int]:
    """``vae_source`` with the VAE's size in bytes."""
    source, size = vae_source(vae, vae_model)
    return source, size if isinstance(size, int) else size.stat().st_size


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
