"""LingBot-World Play: a keyboard-driven LingBot-World Fast session as one queued prompt.

The session itself is ``pipeline.play.PlaySession``; this node gives it the Fast
transformer under ComfyUI's memory manager, the VAE, a file in the output folder that
grows chunk by chunk, ComfyUI's websocket for the frames (``nodes/host/play_routes.py``)
and ComfyUI's interrupt flag. While it runs, the page's Play panel (web/) sends the keys it
holds to the Play routes; when the session ends (Stop, the chunk budget, the idle timeout)
the node returns the .mp4, the action log (JSON: the per-frame keys as an action string,
the seed and settings that replay it through the Fast clip workflow bit for bit) and the
session's latent. A Cancel ends it as any prompt; the .mp4 keeps every finished chunk.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from pathlib import Path

import folder_paths
import torch

from comfy_api.latest import InputImpl, io, ui

import comfy.model_management as mm

from ..pipeline.image import as_pil, open_vae, vae_dtype
from ..pipeline.latent import to_comfy_latent
from ..pipeline.memory import build_or_release, release_module
from ..pipeline.play import PlaySession, PlaySettings
from ..pipeline.play.session import DEFAULT_CHUNK_BUDGET, MAX_CHUNK_BUDGET, vae_stream_bytes
from ..pipeline.video_file import VideoWriter
from ..wan.conditioning import check_size, image_to_tensor
from . import inputs
from .host.devices import check_interrupt
from .host.fast_model import FastDiT, fit_kv_dtype, loaded_fast_model, run_memory
from .host.play_routes import client_connected, controller_id, emitter
from .inputs import check_input, check_precision, vae_source
from .long_video import output_file

DEFAULT_PREFIX = "LingBotWorld/play"
MODES = ("turn", "continuous")
FAST_LOADER = "LingBot-World Fast DiT Loader"


def log_file(video: Path) -> Path:
    """Where the action log of a session's .mp4 is saved: beside it, same name, .json."""
    return video.with_suffix(".json")


def start_image_source(hidden) -> str | None:
    """The input file of the Load Image node that feeds this node's ``image`` in the running
    prompt (ComfyUI's hidden prompt and node id), or None (another node feeds it, or no prompt)."""
    prompt = getattr(hidden, "prompt", None) if hidden is not None else None
    node_id = getattr(hidden, "unique_id", None) if hidden is not None else None
    if not isinstance(prompt, dict) or node_id is None:
        return None
    link = prompt.get(str(node_id), {}).get("inputs", {}).get("image")
    if not (isinstance(link, list) and len(link) == 2):
        return None
    source = prompt.get(str(link[0]), {})
    name = source.get("inputs", {}).get("image") if source.get("class_type") == "LoadImage" else None
    return name if isinstance(name, str) else None


def start_image_record(image: torch.Tensor, name: str | None) -> dict:
    """What the action log says of the start image: the Load Image file's name and sha256
    (the replay loads the same file), and the sha256 of the pixels the node got (``image[0]``
    as float32), which tell a changed file or another source apart."""
    pixels = image[0].detach().float().cpu().contiguous().numpy()
    record = {"file": name, "sha256": None, "pixels_sha256": hashlib.sha256(pixels.tobytes()).hexdigest()}
    if name is not None:
        try:
            path = Path(folder_paths.get_annotated_filepath(name))
            record["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        except (OSError, ValueError):
            pass  # the name stays; the file's hash is unknown
    return record


def prompt_recipe(text) -> dict:
    """The prompt texts for the action log: the T5 node's, or None with a word on where they are."""
    if text is not None and getattr(text, "prompt", None) is not None:
        return {"prompt": text.prompt, "negative_prompt": text.negative_prompt, "prompt_source": "text"}
    return {"prompt": None, "negative_prompt": None,
            "prompt_source": "positive: a CONDITIONING whose text this node does not see (copy it from its encoder)"}


def interrupt_types() -> tuple[type[BaseException], ...]:
    kind = getattr(mm, "InterruptProcessingException", None)
    return (kind,) if isinstance(kind, type) else ()


class LingBotWorldPlay(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LingBotWorldPlay",
            display_name="LingBot-World Play",
            category=inputs.PLAY_CATEGORY,
            **inputs.search_aliases("lingbot play", "lingbot play the world", "lingbot keyboard", "lingbot fast"),
            description=(
                "Walk through the world with the keyboard: W/A/S/D move, I/J/K/L look. Queue the prompt, then use "
                "the Play panel on this node: the keys held when a 12-frame chunk starts steer it. turn: each key "
                "press (or Step) makes one chunk (for cards that need seconds per chunk); continuous: chunks back "
                "to back. The session ends on Stop, after chunk_budget chunks, or idle_timeout seconds after the "
                "page is closed; Cancel ends it too. Outputs the .mp4 (written chunk by chunk), the action log "
                "that replays the session through the Fast clip workflow, and the session's latent."
            ),
            inputs=[
                inputs.FastDiTType.Input("fast_dit", tooltip=f"The Fast transformer, from the {FAST_LOADER}."),
                inputs.image_input(),
                *inputs.vae_file_inputs(),
                inputs.width_input(),
                inputs.height_input(),
                io.Int.Input("chunk_budget", default=DEFAULT_CHUNK_BUDGET, min=1, max=MAX_CHUNK_BUDGET,
                             tooltip="Most chunks the session makes (12 frames each, the first 9): 80 = 957 frames, "
                             "one minute at 16 fps."),
                io.Combo.Input("mode", options=list(MODES), default="turn",
                               tooltip="turn: one chunk per key press or Step (the default; cards that need "
                               "seconds per chunk). continuous: chunks back to back with the keys held as each "
                               "starts. The panel's Pause and Continue switch between them."),
                io.Int.Input("idle_timeout", default=120, min=1, max=3600,
                             tooltip="Seconds without input and without this tab connected after which the session "
                             "ends on its own (the page was closed or the network went away); what was made is "
                             "kept and the GPU freed."),
                *[i for i in inputs.fast_cache_inputs() if i.id != "kv_cache"],  # a session needs a window
                *inputs.fast_sampling_inputs("Seed of the noise: each chunk draws from (seed, chunk), so the action "
                                             "log replays with the same seed."),
                io.Int.Input("fps", default=16, min=1, max=120, tooltip="Frame rate of the .mp4 and the panel (the "
                             "model's is 16)."),
                io.String.Input("filename_prefix", default=DEFAULT_PREFIX,
                                tooltip="Where the .mp4 goes in ComfyUI's output folder (as Save Video's prefix)."),
                *inputs.fast_prompt_inputs(),
                inputs.vae_model_input(),
                inputs.precision_input(),
            ],
            outputs=[
                io.Video.Output("video", display_name="video", tooltip="The session's .mp4 (output folder)."),
                io.String.Output("action_log", display_name="action_log",
                                 tooltip="JSON: the per-frame keys as an action string and the seed and settings; "
                                 "paste actions into the Camera node (keyframes: per chunk (Play)) of the Fast clip "
                                 "workflow with the same seed to render the session again."),
                io.Latent.Output("latent", display_name="latent",
                                 tooltip="The whole session's latent (Wan 2.1 format), to decode again."),
            ],
            hidden=[io.Hidden.unique_id, io.Hidden.prompt],
            is_output_node=True,
        )

    @classmethod
    def validate_inputs(cls, vae) -> bool | str:
        return inputs.offered(cls, vae=vae)

    @classmethod
    def fingerprint_inputs(cls, **_) -> str:
        return uuid.uuid4().hex  # a session is live input: never reuse an earlier run's outputs

    @classmethod
    def execute(cls, fast_dit, image, vae, width, height, shift, seed, chunk_budget, mode, idle_timeout, kv_window,
                kv_sink, kv_dtype, fps, filename_prefix, text=None, positive=None, vae_model=None,
                precision: str = "fp32") -> io.NodeOutput:
        check_input(fast_dit, FastDiT, "fast_dit", FAST_LOADER)
        prompt = inputs.pick_prompt(text, positive, fast_dit.config.text_dim)
        inputs.check_image(image)
        check_precision(precision)
        check_size(height, width)
        if mode not in MODES:
            raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
        policy = inputs.cache_policy("sliding_window", kv_window, kv_sink, kv_dtype)
        settings = PlaySettings(width=width, height=height, seed=seed, shift=shift, chunk_budget=chunk_budget,
                                mode=mode, idle_timeout_s=float(idle_timeout), policy=policy, fps=fps,
                                vae_precision=precision)
        pixels = image_to_tensor(as_pil(image[0]), height, width)
        source, vae_size = vae_source(vae, vae_model)
        vae_weights = vae_size if isinstance(vae_size, int) else vae_size.stat().st_size
        stream_bytes = vae_weights + vae_stream_bytes(height, width, precision)
        if kv_dtype == inputs.KV_AUTO:
            policy = fit_kv_dtype(fast_dit, policy, height // 8, width // 8, None, extra=stream_bytes)
            settings = dataclasses.replace(settings, policy=policy)
        memory = run_memory(fast_dit, policy, height // 8, width // 8, None, extra=stream_bytes)
        path, name, subfolder = output_file(filename_prefix, width, height)
        video_ref = {"filename": name, "subfolder": subfolder, "type": "output"}
        # The whole recipe in the log: prompt texts and start image beside the keys and settings.
        recipe = {**prompt_recipe(text), "start_image": start_image_record(image, start_image_source(cls.hidden)),
                  "vae": vae}
        controller = controller_id()
        unique_id = getattr(cls.hidden, "unique_id", None) if cls.hidden is not None else None
        node_id = None if unique_id is None else str(unique_id)
        with loaded_fast_model(fast_dit, memory) as model:
            device = model.patch_embedding.weight.device
            vae_module = build_or_release(lambda: open_vae(source, device, vae_dtype(device, precision)))
            session = None
            try:
                with VideoWriter(path, fps=fps) as writer:
                    session = PlaySession(model, prompt, vae_module, pixels, settings, writer=writer, emit=emitter(),
                                          controller=controller, node_id=node_id,
                                          client_connected=client_connected(controller),
                                          check_interrupt=check_interrupt, interrupt_types=interrupt_types(),
                                          video_ref=video_ref, recipe=recipe)
                    result = session.run()
            finally:
                release_module(vae_module)
                del vae_module
                if session is not None and session.chunks_done:
                    # Beside the .mp4, also after a Cancel: the log that replays what was saved.
                    log_file(path).write_text(json.dumps(session.action_log(), indent=1))
        if result.chunks == 0:
            path.unlink(missing_ok=True)  # a file with no frames would not play
            raise RuntimeError(f"the Play session ended ({result.reason}) before any chunk was made, so nothing was "
                               "saved; queue it again and press a key (W/A/S/D, I/J/K/L) or Step in the Play panel")
        log_text = json.dumps(result.log)
        shown = ui.PreviewVideo([ui.SavedResult(name, subfolder, io.FolderType.output)]).as_dict()
        shown["text"] = [log_text]  # the action log, readable in /history and on the page
        return io.NodeOutput(InputImpl.VideoFromFile(str(path)), log_text,
                             {"samples": to_comfy_latent(result.latent)[None]}, ui=shown)
