"""LingBot-World Long Video: up to 961 frames as chained windows, streamed into an .mp4.

The work is ``pipeline.long_video.sample_windows``; this node gives it ComfyUI-managed
experts carrying the LoRA Loaders' LoRAs (``run_experts``, as the sampler), ComfyUI's
progress bar, and a file in ComfyUI's output folder that grows window by window (a
fragmented MP4 that plays while it grows, ``pipeline/video_file.py``). The file is created
and a probe written before the first window, so a bad prefix, a read-only folder or a full
disk fail before any sampling, naming the file. It returns a VIDEO (the file) and shows it
in the UI like core Save Video; the frames never come back as an IMAGE batch (961 frames in
float32 would be gigabytes). No latent previews: the page would show them instead of the
video (``nodes/host/progress.LivePreview``). A Cancel stops between steps or windows; the
file keeps every finished window.
"""
from __future__ import annotations

from comfy_api.latest import InputImpl, io, ui

import comfy.model_management as mm

from ..pipeline.camera import CameraPath, check_controls
from ..pipeline.long_video import WindowedCamera, WindowParams, sample_windows
from ..pipeline.sampling import SamplingParams
from ..pipeline.video_file import VideoWriter
from ..wan.geometry import latent_shape, video_tokens
from ..wan.long_video import MAX_FRAMES, plan_windows
from . import inputs
from .host.devices import VAE_WORKSPACE, check_interrupt, make_room
from .host.expert_patcher import DiTExperts, run_experts
from .host.outputs import output_file
from .host.progress import LivePreview
from .inputs import check_input, pick_text, vae_source

DEFAULT_PREFIX = "LingBotWorld/long"


class LingBotWorldLongVideo(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LingBotWorldLongVideo",
            display_name="LingBot-World Long Video",
            category=inputs.BASE_CATEGORY,
            **inputs.search_aliases("lingbot base", "lingbot long video", "lingbot long walk"),
            description=(
                "Makes a long video (up to 961 frames, one minute at 16 fps) as chained windows: each window "
                "starts on the last frame(s) of the previous one and follows its piece of the camera path. "
                "Each finished window is decoded and appended to an .mp4 in ComfyUI's output folder, so memory "
                "stays that of one window and a Cancel keeps the finished windows. Outputs the saved VIDEO."
            ),
            inputs=[
                *inputs.model_inputs(),
                inputs.image_input(),
                *inputs.vae_file_inputs(),
                inputs.CameraPathType.Input("camera_path", optional=True,
                                           tooltip="The whole camera path from LingBot-World Camera Plücker "
                                           "Conditioning (camera_path output). Without it the camera layers are "
                                           "skipped."),
                inputs.width_input(inputs.MATCH_CAMERA),
                inputs.height_input(inputs.MATCH_CAMERA),
                # 81 as on a fresh Camera node, so a fresh pair agrees (one window; the long
                # walk template sets 961 on both).
                io.Int.Input("frames", default=inputs.DEFAULT_FRAMES, min=5, max=MAX_FRAMES, step=4,
                             tooltip="Frames of the whole video: 4n+1 (81 = 5 s, one window; 961 = 60 s at 16 fps). "
                             + inputs.MATCH_CAMERA),
                *inputs.window_inputs(),
                io.Float.Input("scale_quantile", default=1.0, min=0.5, max=1.0, step=0.01,
                               tooltip="Translation unit of the whole path: 1 = its largest step (as one pass). "
                               "Below 1, that quantile of the steps, for tracked paths with rare jumps."),
                io.Int.Input("steps", default=40, min=1, max=200, tooltip="Denoising steps per window."),
                *inputs.guidance_inputs("Seed of the first window's noise; window k uses seed + k."),
                io.Int.Input("decode_tile", default=0, min=0, max=512, step=8,
                             tooltip="0 decodes whole frames. Otherwise the latent tile size (e.g. 32): lower "
                             "VRAM for large videos, a little slower."),
                io.Boolean.Input("keep_experts", default=False,
                                 tooltip="Keep both experts loaded across windows (no reload per window); needs "
                                 "room for both (about 2 x 9.6 GB NF4 plus activations)."),
                io.Int.Input("fps", default=16, min=1, max=120, tooltip="Frame rate of the .mp4 (the model's is 16)."),
                io.String.Input("filename_prefix", default=DEFAULT_PREFIX,
                                tooltip="Where the .mp4 goes in ComfyUI's output folder (as Save Video's prefix)."),
                inputs.vae_model_input(),
                *inputs.conditioning_inputs(),
            ],
            outputs=[io.Video.Output("video", display_name="video",
                                     tooltip="The saved .mp4 (for Save Video, Get Video Components, ...).")],
            is_output_node=True,
        )

    @classmethod
    def validate_inputs(cls, vae) -> bool | str:
        return inputs.offered(cls, vae=vae)

    @classmethod
    def execute(cls, dit, image, vae, width, height, frames, window, overlap, scale_quantile, steps, shift,
                cfg_high, cfg_low, boundary, seed, sampler, decode_tile, keep_experts, fps, filename_prefix,
                text=None, camera_path=None, vae_model=None, positive=None, negative=None) -> io.NodeOutput:
        check_input(dit, DiTExperts, "dit", "LingBot-World NF4 DiT Loader")
        text = pick_text(text, positive, negative, dit.config.text_dim)
        inputs.check_image(image)
        inputs.check_sampler(sampler)
        plan = plan_windows(frames, window, overlap)  # bad frames/window/overlap fail before any load
        camera = None
        if camera_path is not None:
            check_input(camera_path, CameraPath, "camera_path",
                         f"{inputs.CAMERA_NODE} (its camera_path output)")
            # Base-Cam or Act: the wrong pairing fails here, before an expert loads.
            check_controls(camera_path, dit.config.control_type, dit.label)
            camera = WindowedCamera(camera_path, frames, height, width, scale_quantile, dit.config.control_type)
        source_vae, vae_size = vae_source(vae, vae_model)
        params = SamplingParams(steps=steps, shift=shift, cfg_high=cfg_high, cfg_low=cfg_low,
                                boundary=boundary, seed=seed, sampler=sampler)
        tokens = video_tokens(*latent_shape(plan[0].frames, height, width), dit.config.patch_size)
        comfy_experts, experts = run_experts(dit, tokens, keep_resident=keep_experts)  # as the sampler: its LoRAs
        path, name, subfolder = output_file(filename_prefix, width, height)  # before any window
        device = mm.get_torch_device()
        live = LivePreview(steps * len(plan), images=False)
        writer = None
        try:
            make_room(device, vae_size, VAE_WORKSPACE)
            with VideoWriter(path, fps=fps) as writer:
                sample_windows(experts, text, source_vae, image[0], frames, height, width, camera, params,
                               WindowParams(window, overlap, scale_quantile), writer.write, device=device,
                               decode_tile=decode_tile or None, on_step=live.on_step, check_interrupt=check_interrupt)
        finally:
            comfy_experts.close()  # also on a cancel: no expert stays resident after this node
            if writer is None or writer.frames_written == 0:
                path.unlink(missing_ok=True)  # failed before its first frame: no empty file left behind
        saved = ui.PreviewVideo([ui.SavedResult(name, subfolder, io.FolderType.output)])
        return io.NodeOutput(InputImpl.VideoFromFile(str(path)), ui=saved)
