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

import json
import uuid
from pathlib import Path
from typing import Callable

from comfy_api.latest import InputImpl, io, ui

from ..loaders.new_file import write_json
from ..pipeline.image import as_pil
from ..pipeline.latent import to_comfy_latent
from ..pipeline.memory import vae_budgets
from ..pipeline.play import PlaySettings
from ..pipeline.play.session import DEFAULT_CHUNK_BUDGET, MAX_CHUNK_BUDGET
from ..pipeline.play.protocol import MODES
from ..wan.conditioning import check_size, image_to_tensor
from ..wan.geometry import latent_size
from ..wan.scheduler import DEFAULT_FAST_STEPS
from . import inputs
from .host.fast_model import prepared_fast_run
from .host.outputs import output_file
from .host.play_run import (announced_start, prompt_recipe, run_play_session, start_image_record,
                            start_image_source)
from .host.tiny_vae import tiny_video_vae
from .inputs import FAST_LOADER, check_precision

DEFAULT_PREFIX = "LingBotWorld/play"
# What the action log says when the .mp4's frames came from the tiny VAE (the replay's Wan VAE
# Decode gives the full-quality frames of the same latents).
LIVE_DECODER_LOG = "tiny video VAE (TAEHV): the .mp4 frames are its decode"
LIVE_DECODER_TOOLTIP = (
    "Optional: a tiny video VAE for Wan 2.1 (lighttaew2_1.safetensors in models/vae_approx, picked in core's Load "
    "VAE) decodes the chunks for the panel and the .mp4 instead of the Wan VAE: a fraction of its cost, so play "
    "keeps up on fewer GPUs, at a preview's picture quality. The Wan VAE still encodes the start image, and the "
    "latent output decodes at full quality with Wan VAE Decode.")


def log_file(video: Path) -> Path:
    """Where the action log of a session's .mp4 is saved: beside it, same name, .json."""
    return video.with_suffix(".json")


def log_saver(video: Path, saved: list[int]) -> Callable[[dict], None]:
    """Saves a session's action log beside its .mp4 (the session calls it after every chunk
    and at its end) as a new file renamed into place each time (``loaders/new_file.py``):
    the log is whole whenever the process stops, and a link planted at its name is
    replaced, never written through. ``saved`` gets each saved log's chunk count."""
    def save(log: dict) -> None:
        write_json(log_file(video), log, indent=1)
        saved.append(log["chunks"])
    return save


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
                io.Vae.Input("live_decoder", optional=True, tooltip=LIVE_DECODER_TOOLTIP),
                inputs.fast_steps_input(),
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
                precision: str = "fp32", live_decoder=None, steps: int = DEFAULT_FAST_STEPS) -> io.NodeOutput:
        prompt = inputs.fast_prompt(fast_dit, text, positive)
        if live_decoder is not None:
            tiny_video_vae(live_decoder)  # refused before anything loads
        inputs.check_image(image)
        check_precision(precision)
        check_size(height, width)
        policy = inputs.cache_policy("sliding_window", kv_window, kv_sink, kv_dtype)
        settings = PlaySettings(width=width, height=height, seed=seed, shift=shift, chunk_budget=chunk_budget,
                                mode=mode, idle_timeout_s=float(idle_timeout), policy=policy, fps=fps,
                                vae_precision=precision, steps=steps)
        pixels = image_to_tensor(as_pil(image[0]), height, width)
        source, vae_bytes = inputs.vae_source_bytes(vae, vae_model)
        path, name, subfolder = output_file(filename_prefix, width, height)
        unique_id = getattr(cls.hidden, "unique_id", None) if cls.hidden is not None else None
        # The whole recipe in the log: prompt texts and start image beside the keys and settings.
        recipe = {**prompt_recipe(text), "start_image": start_image_record(image, start_image_source(cls.hidden)),
                  "vae": vae, "live_decoder": LIVE_DECODER_LOG if live_decoder is not None else None}
        node_id = None if unique_id is None else str(unique_id)
        saved: list[int] = []  # a log is saved once a chunk is in the .mp4
        try:
            with announced_start(node_id) as start, prepared_fast_run(
                    fast_dit, settings, kv_dtype == inputs.KV_AUTO, *latent_size(height, width), None,
                    *vae_budgets(vae_bytes, height, width, precision, live_decoder is not None),
                    keep_warm=True) as run:
                result = run_play_session(run, prompt, source, pixels, path,
                                          {"filename": name, "subfolder": subfolder, "type": "output"}, node_id,
                                          save_log=log_saver(path, saved), recipe=recipe, live_decoder=live_decoder,
                                          start=start)
        finally:
            if not saved:  # no chunk (a Cancel or a failure while loading or waiting): the file would not play
                path.unlink(missing_ok=True)
        if result.chunks == 0:
            raise RuntimeError(f"the Play session ended ({result.reason}) before any chunk was made, so nothing was "
                               "saved; queue it again and press a key (W/A/S/D, I/J/K/L) or Step in the Play panel")
        log_text = json.dumps(result.log)
        shown = ui.PreviewVideo([ui.SavedResult(name, subfolder, io.FolderType.output)]).as_dict()
        shown["text"] = [log_text]  # the action log, readable in /history and on the page
        return io.NodeOutput(InputImpl.VideoFromFile(str(path)), log_text,
                             {"samples": to_comfy_latent(result.latent)[None]}, ui=shown)
