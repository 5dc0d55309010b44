"""LingBot-World Fast Sampler: a clip made 12 frames (one chunk) at a time by the causal Fast transformer.

The work is ``pipeline.fast.sample_fast`` (4 steps, or the first 3, 2 or 1 of them, and a
commit pass per chunk, no CFG, the chunk's keys and values kept in the KV cache for the chunks after it); this node
gives it the transformer under ComfyUI's memory manager, ComfyUI's progress bar (one tick
per forward) and a live preview of each finished chunk, and returns the LATENT in ComfyUI's
Wan 2.1 convention, so core VAE Decode and the pack's decoder both read it.
"""
from __future__ import annotations

from comfy_api.latest import io

from ..pipeline.camera import CameraCondition
from ..pipeline.fast import ChunkNoise, fast_latent_frames, sample_fast
from ..pipeline.image import I2VCondition
from ..pipeline.latent import to_comfy_latent
from ..pipeline.sampling import check_camera_matches
from ..wan.scheduler import DEFAULT_FAST_STEPS
from . import inputs
from .host.devices import check_interrupt
from .host.fast_model import prepared_fast_run
from .host.progress import ChunkProgress
from .inputs import FAST_LOADER, check_input


def clip_latent_frames(i2v: I2VCondition) -> int:
    """The clip's latent frames, from the VAE Encode node's frame count (whole chunks only)."""
    try:
        return fast_latent_frames(i2v.frames)
    except ValueError as exc:
        raise ValueError(f"i2v: the LingBot-World Wan VAE Encode node's {exc}; set its frames there "
                         "(LingBot-World Fast makes 12 frames a chunk)") from None


class LingBotWorldFastSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LingBotWorldFastSampler",
            display_name="LingBot-World Fast Sampler",
            category=inputs.FAST_CATEGORY,
            **inputs.search_aliases("lingbot fast", "lingbot fast sampler", "lingbot fast clip", "lingbot play replay"),
            description=(
                "Generates the video latent with LingBot-World Fast: 12 frames (3 latent frames) at a time, 4 "
                "steps each (steps: fewer, faster) and no CFG, every chunk seeing the ones before it through a KV "
                "cache. The frame count is the Wan VAE Encode node's (9, 21, ..., 81: whole chunks). The prompt comes "
                "from the text input or one core CLIP Text Encode (positive); the camera is optional. Shows "
                "each finished chunk as a preview."
            ),
            inputs=[
                inputs.FastDiTType.Input("fast_dit", tooltip=f"The Fast transformer, from the {FAST_LOADER}."),
                inputs.I2VCond.Input("i2v", tooltip="Start-frame condition from LingBot-World Wan VAE Encode; its "
                                     "frames set the clip's length (4n+1 filling 12-frame chunks: 9, 21, ..., 81)."),
                *inputs.fast_cache_inputs(),
                *inputs.fast_sampling_inputs(inputs.FAST_SEED_TOOLTIP),
                *inputs.fast_prompt_inputs(),
                inputs.Camera.Input("camera", optional=True,
                                   tooltip=f"Camera path from {inputs.CAMERA_NODE}. Its width, "
                                   "height and frames must match the VAE Encode node."),
                inputs.fast_steps_input(),
            ],
            outputs=[io.Latent.Output("samples", display_name="samples",
                                      tooltip="The video latent (ComfyUI's Wan 2.1 format), for LingBot-World Wan VAE "
                                      "Decode or core VAE Decode.")],
        )

    @classmethod
    def execute(cls, fast_dit, i2v, kv_cache: str, kv_window: int, kv_sink: int, kv_dtype: str, shift: float,
                seed: int, text=None, positive=None, camera=None, steps: int = DEFAULT_FAST_STEPS) -> io.NodeOutput:
        prompt = inputs.fast_prompt(fast_dit, text, positive)
        check_input(i2v, I2VCondition, "i2v", "LingBot-World Wan VAE Encode")
        latent_frames = clip_latent_frames(i2v)
        if camera is not None:
            check_input(camera, CameraCondition, "camera", inputs.CAMERA_NODE)
        check_camera_matches(camera, i2v)
        params = inputs.fast_params(kv_cache, kv_window, kv_sink, kv_dtype, shift, seed, steps)
        # Checked before the transformer loads: everything above fails in milliseconds.
        _, _, lat_h, lat_w = i2v.y.shape
        progress = ChunkProgress(latent_frames // params.policy.chunk, steps=params.steps)
        # Each chunk's noise from (seed, chunk): a clip is the start of the stream with the same seed.
        noise = ChunkNoise(seed, renoises=params.steps - 1)
        auto = kv_dtype == inputs.KV_AUTO
        with prepared_fast_run(fast_dit, params, auto, lat_h, lat_w, latent_frames) as run:
            latent = sample_fast(run.model, prompt, i2v, camera, run.run, i2v.frames, noise=noise,
                                 on_step=progress.on_step, on_preview=progress.on_preview,
                                 check_interrupt=check_interrupt)
        return io.NodeOutput({"samples": to_comfy_latent(latent)[None]})


__all__ = ["LingBotWorldFastSampler", "clip_latent_frames"]
