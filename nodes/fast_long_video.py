"""LingBot-World Fast Long Video: up to 957 frames in one causal pass, streamed into an .mp4.

The Fast twin of LingBot-World Long Video. The work is ``pipeline.fast.stream_fast_video``:
one Fast session for the whole video (no windows, no seams), each chunk of 12 frames
decoded by the VAE's stream decoder and appended to an .mp4 in ComfyUI's output folder as
soon as it is made. The camera is made chunk by chunk from the whole path
(``path_camera``: the Camera node's one-pass camera, chunk by chunk) and the image condition encoded as far as the chunks need
(``StreamedI2V``): no whole-video tensor is ever built. Returns the saved VIDEO and shows it
like core Save Video; a Cancel keeps every chunk written. As the Long Video node: the file
is checked before any load (``long_video.output_file``), a failure before the first frame
leaves no empty file, and the bar moves without latent previews, which the page would show
instead of the finished video.
"""
from __future__ import annotations

import logging

from comfy_api.latest import InputImpl, io, ui

from ..pipeline.camera import CameraPath
from ..pipeline.fast import frames_note, path_camera, stream_fast_video, stream_frames
from ..pipeline.memory import vae_budgets
from ..pipeline.video_file import VideoWriter
from ..wan.camera import CameraError
from ..wan.conditioning import check_size
from ..wan.geometry import latent_frames as count_latent_frames, latent_size
from ..wan.long_video import MAX_FRAMES
from ..wan.scheduler import DEFAULT_FAST_STEPS
from . import inputs
from .host.devices import check_interrupt
from .host.fast_model import prepared_fast_run
from .host.outputs import output_file
from .host.progress import ChunkProgress
from .inputs import FAST_LOADER, check_input

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "LingBotWorld/fast_long"
# 81 as on a fresh Camera node, so a fresh pair agrees (a whole-chunk count: 7 chunks); the
# one-minute template sets 957 (the longest whole-chunk count within a minute) on both.
DEFAULT_FRAMES = inputs.DEFAULT_FRAMES
MATCH_CAMERA_PATH = "Must match the Camera node when camera_path is connected."


class LingBotWorldFastLongVideo(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LingBotWorldFastLongVideo",
            display_name="LingBot-World Fast Long Video",
            category=inputs.FAST_CATEGORY,
            **inputs.search_aliases("lingbot fast", "lingbot fast long video", "lingbot fast walk"),
            description=(
                "Makes a long video with LingBot-World Fast (up to 957 frames, one minute at 16 fps) in ONE causal "
                "pass: 12 frames at a time, every chunk seeing the start frames and the recent ones through the KV "
                "cache, so there are no windows or seams. Each chunk is decoded as it is made and appended to an "
                ".mp4 in ComfyUI's output folder: memory stays the same however long the video, and a Cancel "
                "keeps the chunks written. Outputs the saved VIDEO."
            ),
            inputs=[
                inputs.FastDiTType.Input("fast_dit", tooltip=f"The Fast transformer, from the {FAST_LOADER}."),
                inputs.image_input(),
                *inputs.vae_file_inputs(),
                inputs.width_input(MATCH_CAMERA_PATH),
                inputs.height_input(MATCH_CAMERA_PATH),
                io.Int.Input("frames", default=DEFAULT_FRAMES, min=9, max=MAX_FRAMES, step=4,
                             tooltip="Frames of the video: 4n+1, made 12 at a time (the first chunk 9), so the video "
                             "is cut to whole chunks: 961 (one minute at 16 fps) gives 957, 81 stays 81; the camera "
                             "path is spread over the frames asked, as in the official generate_fast. "
                             + MATCH_CAMERA_PATH),
                *inputs.fast_cache_inputs(),
                *inputs.fast_sampling_inputs(inputs.FAST_SEED_TOOLTIP),
                io.Int.Input("decode_tile", default=0, min=0, max=512, step=8,
                             tooltip="0 decodes whole frames. Otherwise the latent tile size (e.g. 32): lower "
                             "VRAM for large videos, a little slower."),
                io.Int.Input("fps", default=16, min=1, max=120, tooltip="Frame rate of the .mp4 (the model's is 16)."),
                io.String.Input("filename_prefix", default=DEFAULT_PREFIX,
                                tooltip="Where the .mp4 goes in ComfyUI's output folder (as Save Video's prefix)."),
                *inputs.fast_prompt_inputs(),
                inputs.CameraPathType.Input("camera_path", optional=True,
                                           tooltip="The whole camera path from LingBot-World Camera Plücker "
                                           "Conditioning (camera_path output; its camera output stays unconnected). "
                                           "Without it the camera layers are skipped."),
                inputs.vae_model_input(),
                inputs.precision_input("Here the VAE encodes the start frame and decodes every chunk as it comes: "
                                       "bf16 also halves the stream decoder's carried state (3.8 GB in fp32 at "
                                       "480x832)."),
                inputs.fast_steps_input(),
            ],
            outputs=[io.Video.Output("video", display_name="video",
                                     tooltip="The saved .mp4 (for Save Video, Get Video Components, ...).")],
            is_output_node=True,
        )

    @classmethod
    def validate_inputs(cls, vae) -> bool | str:
        return inputs.offered(cls, vae=vae)

    @classmethod
    def execute(cls, fast_dit, image, vae, width, height, frames, kv_cache, kv_window, kv_sink, kv_dtype, shift,
                seed, decode_tile, fps, filename_prefix, text=None, positive=None, camera_path=None, vae_model=None,
                precision: str = "fp32", steps: int = DEFAULT_FAST_STEPS) -> io.NodeOutput:
        prompt = inputs.fast_prompt(fast_dit, text, positive)
        inputs.check_image(image)
        inputs.check_precision(precision)
        check_size(height, width)
        made, note = frames_made(frames)  # bad counts fail before any load
        params = inputs.fast_params(kv_cache, kv_window, kv_sink, kv_dtype, shift, seed, steps)
        camera = stream_camera(camera_path, frames, height, width)  # the count asked, as the official
        source_vae, vae_bytes, latent_frames = *inputs.vae_source_bytes(vae, vae_model), count_latent_frames(made)
        progress = ChunkProgress(latent_frames // params.policy.chunk, images=False,  # an output node: the page
                                 steps=params.steps)  # ends on the video
        path, name, subfolder = output_file(filename_prefix, width, height)
        writer = None
        try:  # room for the cache and a chunk beside the transformer, and for the VAE and its streams
            with prepared_fast_run(fast_dit, params, kv_dtype == inputs.KV_AUTO, *latent_size(height, width),
                                   latent_frames, *vae_budgets(vae_bytes, height, width, precision)) as run, \
                    VideoWriter(path, fps=fps) as writer:
                stream_fast_video(run.model, prompt, source_vae, image[0], made, height, width, camera, run.run,
                                  writer.write, device=run.vae_device, precision=precision, overlap=run.overlap,
                                  decode_tile=decode_tile or None, on_step=progress.on_step,
                                  on_preview=progress.on_preview, check_interrupt=check_interrupt)
        finally:
            if writer is None or writer.frames_written == 0:
                path.unlink(missing_ok=True)  # failed before its first frame: no empty file left behind
        shown = ui.PreviewVideo([ui.SavedResult(name, subfolder, io.FolderType.output)]).as_dict()
        return io.NodeOutput(InputImpl.VideoFromFile(str(path)), ui=shown if note is None else {**shown, "text": [note]})


def frames_made(frames: int) -> tuple[int, str | None]:
    """The frames the stream makes (whole chunks) and, when not the count asked, the note
    the node logs and shows."""
    made, note = stream_frames(frames), frames_note(frames)
    if note is None:
        return made, None
    log.warning("LingBot Fast Long Video: %s", note)
    return made, note


def stream_camera(camera_path, frames: int, height: int, width: int):
    """The chunk-by-chunk camera of the ``camera_path`` input (None: no camera)."""
    if camera_path is None:
        return None
    check_input(camera_path, CameraPath, "camera_path", f"{inputs.CAMERA_NODE} (its camera_path output)")
    try:
        return path_camera(camera_path, frames, height, width)
    except ValueError as exc:  # CameraError, or an action string longer than the video
        raise CameraError(f"camera_path: {exc}") from None


__all__ = ["DEFAULT_FRAMES", "LingBotWorldFastLongVideo"]
