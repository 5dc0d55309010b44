"""LingBot-World Camera (Act, Base-Cam): a camera path (preset, .npy files, an action
string, Act files or a pose export) for the sampler, and the whole path for the Long Video node.

Each source is one entry of ``PATH_SOURCES``: a function from the node's inputs
(``CameraInputs``) to a ``CameraPath``; a new source is a new entry (its combo option is
appended, so saved graphs keep their values)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from comfy_api.latest import io

from ..loaders.pose_import import CAMERA_AXES
from ..loaders.trajectory import ACTION_FILE, read_intrinsics_row
from ..pipeline.camera import (CameraCondition, CameraPath, camera_condition, path_from_act_files, path_from_actions,
                               path_from_export, path_from_files, path_from_play_actions, path_from_preset)
from ..pipeline.camera_preview import draw_trajectory
from ..pipeline.long_video import WindowedCamera
from ..wan.camera_presets import CAMERA_PRESETS
from ..wan.camera_actions import EXAMPLE as DEFAULT_ACTIONS
from ..wan.long_video import MAX_FRAMES, plan_windows, window_cuts
from . import inputs
from .host.model_files import (NO_FILE, file_stamp, list_input_files, list_pose_exports, resolve_input_file,
                               resolve_pose_export)

# When the keyframes of an action string are taken (wan/camera_actions.py, wan/play_camera.py).
KEYFRAMES_OFFICIAL, KEYFRAMES_PLAY = "act2cam (official)", "per chunk (Play)"
KEYFRAME_TIMINGS = (KEYFRAMES_OFFICIAL, KEYFRAMES_PLAY)
DEFAULT_PRESET = "dolly_in"
PREVIEW_SIZE = (512, 512)
ACTIONS_TOOLTIP = (
    "When source is actions: KEYS-FRAMES tokens, comma-separated. W/S forward/back, A/D left/right, I/K look "
    "up/down, J/L turn left/right; none = hold still; keys combine, e.g. wj-10 walks forward while turning left. "
    "The official act2cam camera: the string may be shorter than the video (the camera then holds still), "
    "never longer. Drives Base-Cam (its camera) and Act (its W/A/S/D keys) alike."
)


def preview_image(poses: np.ndarray, cuts: tuple[int, ...] = ()) -> torch.Tensor:
    """The top-down drawing of a path as a ComfyUI IMAGE batch [1, H, W, 3] in 0..1;
    ``cuts``: pose indices where a long video's windows begin."""
    pixels = draw_trajectory(poses, size=PREVIEW_SIZE, cuts=cuts)
    return torch.from_numpy(np.ascontiguousarray(pixels)).float().div(255.0)[None]


ONE_PASS_TOOLTIP = (
    "Camera conditioning for the LingBot sampler (one pass). Only for videos of at most one window: when "
    "frames > window it is not built (it would take GBs) and the node stops with a message if this output is "
    "connected; use camera_path with LingBot-World Long Video instead."
)


def _output_connected(hidden, slot: int) -> bool:
    """Whether another node of the running prompt reads output ``slot`` of this node (False
    outside a prompt, where nothing can read it)."""
    prompt = getattr(hidden, "prompt", None) if hidden is not None else None
    node_id = getattr(hidden, "unique_id", None) if hidden is not None else None
    if not isinstance(prompt, dict) or node_id is None:
        return False
    link = [str(node_id), slot]
    return any(isinstance(value, list) and len(value) == 2 and [str(value[0]), value[1]] == link
               for node in prompt.values() if isinstance(node, dict)
               for value in node.get("inputs", {}).values())


class LingBotWorldCamera(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        npy_files = [NO_FILE] + list_input_files(".npy")
        return io.Schema(
            node_id="LingBotWorldCamera",
            display_name=inputs.CAMERA_NODE,
            category=inputs.CAMERA_CATEGORY,
            **inputs.search_aliases("lingbot act", "lingbot camera", "lingbot act2cam", "lingbot wasd keys",
                                    "lingbot base-cam", "lingbot plucker"),
            description=(
                "Turns a camera path into the conditioning LingBot-World follows. Use a preset "
                "move, poses.npy ([N,4,4] camera-to-world, OpenCV axes) and intrinsics.npy ([N,4] fx, fy, "
                "cx, cy for 832x480) from ComfyUI's input folder, a keyboard action string (W/A/S/D, I/J/K/L), "
                "a pose export (ViPE folder, .npz, poses.npy, .csv camera log), or for the Act checkpoint "
                "poses.npy + intrinsics.npy + action.npy (W/A/S/D per frame). Base-Cam reads Plücker rays, Act "
                "ray directions + W/A/S/D keys; an action string drives both (the sampler builds what its "
                "checkpoint reads). Also outputs the whole path for LingBot-World Long Video and a top-down drawing "
                "of it with the window cuts."
            ),
            inputs=[
                io.Combo.Input("source", options=list(SOURCES), default="preset",
                               tooltip="preset: a built-in camera move; files: poses_file and intrinsics_file; "
                               "actions: the actions string (Base-Cam or Act); import: pose_export (intrinsics_file "
                               "optional); act_files: for the Act checkpoint, poses_file and intrinsics_file plus "
                               "action.npy beside poses_file ([frames, 4] W/A/S/D)."),
                io.Combo.Input("preset", options=list(CAMERA_PRESETS), default=DEFAULT_PRESET,
                               tooltip="Camera move when source is preset."),
                io.Float.Input("speed", default=1.0, min=0.0, max=8.0, step=0.05,
                               tooltip="How far a preset pans, tilts or orbits (1 = 40 degrees over 81 frames). "
                               "A dolly's distance is normalized by the model, so speed does not change it."),
                io.Combo.Input("poses_file", options=npy_files,
                               tooltip="poses.npy in ComfyUI's input folder (or a subfolder): [N,4,4] camera-to-world."),
                io.Combo.Input("intrinsics_file", options=npy_files,
                               tooltip="intrinsics.npy in ComfyUI's input folder: [N,4] fx, fy, cx, cy in pixels of "
                               "832x480. Required for files; for actions and import, (none) means default "
                               "intrinsics for the output size (or the export's own)."),
                inputs.width_input(inputs.MATCH_CAMERA_FEEDS),
                inputs.height_input(inputs.MATCH_CAMERA_FEEDS),
                inputs.frames_input(MAX_FRAMES, inputs.MATCH_CAMERA_FEEDS),
                # Optional widgets, so API prompts saved before they existed still validate.
                io.String.Input("actions", default=DEFAULT_ACTIONS, optional=True, tooltip=ACTIONS_TOOLTIP),
                io.Combo.Input("pose_export", options=[NO_FILE] + list_pose_exports(), optional=True,
                               tooltip="When source is import: a ViPE output folder, an .npz, a poses.npy or a .csv "
                               "camera log (header x,y,z,qx,qy,qz,qw, optional frame or time) in ComfyUI's input "
                               "folder; camera-to-world poses, their camera axes as camera_axes says."),
                io.Boolean.Input("normalize_scale", default=True, optional=True,
                                 tooltip="For import: rescale the translations so the median step per frame is the "
                                 "action step (tracker units are arbitrary)."),
                *inputs.window_inputs(optional=True),
                io.Combo.Input("camera_axes", options=list(CAMERA_AXES), default="opencv", optional=True,
                               tooltip="For import: the camera axes of the poses. opencv: x right, y down, looking "
                               "down +z (ViPE, COLMAP, ROS optical frames, the pack). opengl: x right, y up, looking "
                               "down -z (USD camera prims, OpenGL, Blender); turned into OpenCV axes by "
                               "diag(1, -1, -1). x_forward_z_up: looking down +x, z up (Isaac Sim's world camera "
                               "axes, a robot's body frame)."),
                io.Combo.Input("keyframes", options=list(KEYFRAME_TIMINGS), default=KEYFRAMES_OFFICIAL, optional=True,
                               tooltip="For actions: act2cam (official) spreads the keyframes over the whole video "
                               "and scales by its largest step; per chunk (Play) is the causal law of LingBot-World "
                               "Play, so a Play session's action log replays through the Fast sampler with the same "
                               "seed to the same video (the camera then ignores window/overlap)."),
            ],
            outputs=[
                inputs.Camera.Output("camera", display_name="camera", tooltip=ONE_PASS_TOOLTIP),
                io.Image.Output("path_preview", display_name="path_preview",
                                tooltip="Top-down view of the camera path used: green dot = start, red square = end, "
                                "ticks = view direction, numbered bars = where long-video windows begin."),
                inputs.CameraPathType.Output("camera_path", display_name="camera_path",
                                            tooltip="The whole camera path, for LingBot-World Long Video."),
            ],
            hidden=[io.Hidden.prompt, io.Hidden.unique_id],
        )

    @classmethod
    def fingerprint_inputs(cls, source, poses_file, intrinsics_file, pose_export=NO_FILE, **_):
        # Same names, new contents: the files' stamps make ComfyUI run the node again.
        if source == "import":
            try:
                path = resolve_pose_export(pose_export)
                files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
                stamps = [file_stamp(p) for p in files]
            except (ValueError, OSError):
                stamps = [str(pose_export)]
            if intrinsics_file != NO_FILE:
                stamps.append(str(intrinsics_file))
            return "|".join(stamps)
        if source not in ("files", "act_files") and not (source == "actions" and intrinsics_file != NO_FILE):
            return source
        stamps = []
        files = [("poses_file", poses_file), ("intrinsics_file", intrinsics_file)]
        if source == "act_files" and isinstance(poses_file, str):
            files.append(("poses_file", action_file(poses_file)))
        for field, name in files:
            try:
                stamps.append(file_stamp(resolve_input_file(name, field, ".npy")))
            except (ValueError, OSError):
                stamps.append(str(name))  # the run itself reports the problem
        return "|".join(stamps)

    @classmethod
    def validate_inputs(cls, poses_file, intrinsics_file, pose_export=NO_FILE) -> bool | str:
        return inputs.offered(cls, poses_file=poses_file, intrinsics_file=intrinsics_file, pose_export=pose_export)

    @classmethod
    def execute(cls, source: str, preset: str, speed: float, poses_file: str, intrinsics_file: str,
                width: int, height: int, frames: int, actions: str = DEFAULT_ACTIONS, pose_export: str = NO_FILE,
                normalize_scale: bool = True, window: int = 81, overlap: int = 1,
                camera_axes: str = "opencv", keyframes: str = KEYFRAMES_OFFICIAL) -> io.NodeOutput:
        if keyframes not in KEYFRAME_TIMINGS:
            raise ValueError(f"keyframes: {keyframes!r} is not one of {', '.join(KEYFRAME_TIMINGS)}")
        path = camera_path(source, preset, speed, poses_file, intrinsics_file, width, height, frames, actions,
                           pose_export, normalize_scale, camera_axes, play_timing=keyframes == KEYFRAMES_PLAY)
        if not path.windowed:  # a Play log: the Fast sampler's one pass, no windows
            return io.NodeOutput(camera_condition(path, frames, height, width), preview_image(path.poses[:frames]),
                                 path)
        plan = plan_windows(frames, window, overlap)  # checks frames, window and overlap
        camera: CameraCondition | None = None
        if len(plan) == 1:
            camera = camera_condition(path, frames, height, width)
        elif _output_connected(cls.hidden, 0):
            raise ValueError(
                f"frames: {frames} frames are {len(plan)} windows of {window}; the camera output is the one-pass "
                f"sampler's and holds at most one window. Connect camera_path to LingBot-World Long Video, or "
                f"set frames <= {window}"
            )
        else:
            WindowedCamera(path, frames, height, width)  # the whole path must cover the video
        # The drawing shows the part of the path the video uses, with the window cuts.
        return io.NodeOutput(camera, preview_image(path.poses[:frames], window_cuts(plan)), path)


def _intrinsics_row(intrinsics_file: str) -> np.ndarray | None:
    if intrinsics_file == NO_FILE:
        return None
    return read_intrinsics_row(resolve_input_file(intrinsics_file, "intrinsics_file", ".npy"), "intrinsics_file")


@dataclass(frozen=True)
class CameraInputs:
    """The node inputs a source reads to make its path."""

    source: str
    preset: str
    speed: float
    poses_file: str
    intrinsics_file: str
    width: int
    height: int
    frames: int
    actions: str = DEFAULT_ACTIONS
    pose_export: str = NO_FILE
    normalize_scale: bool = True
    camera_axes: str = "opencv"
    play_timing: bool = False  # an action string under the per-chunk (Play) keyframes


def _from_preset(i: CameraInputs) -> CameraPath:
    return path_from_preset(i.preset, i.speed, i.frames)


def _from_files(i: CameraInputs) -> CameraPath:
    return path_from_files(resolve_input_file(i.poses_file, "poses_file", ".npy"),
                           resolve_input_file(i.intrinsics_file, "intrinsics_file", ".npy"))


def _from_actions(i: CameraInputs) -> CameraPath:
    intrinsics = _intrinsics_row(i.intrinsics_file)  # its errors name intrinsics_file, not actions
    build = path_from_play_actions if i.play_timing else path_from_actions
    try:
        return build(i.actions, i.frames, i.height, i.width, intrinsics)
    except ValueError as error:
        raise ValueError(f"actions: {error}") from error


def _from_export(i: CameraInputs) -> CameraPath:
    if i.camera_axes not in CAMERA_AXES:
        raise ValueError(f"camera_axes: {i.camera_axes!r} is not one of {', '.join(CAMERA_AXES)}")
    path = path_from_export(resolve_pose_export(i.pose_export), i.height, i.width, normalize_scale=i.normalize_scale,
                            camera_axes=i.camera_axes)
    k = _intrinsics_row(i.intrinsics_file)
    if k is not None:
        path.intrinsics = k
    return path


def action_file(poses_file: str) -> str:
    """The input-folder name of the action.npy beside ``poses_file``."""
    folder = poses_file.rsplit("/", 1)[0] + "/" if "/" in poses_file else ""
    return folder + ACTION_FILE


def _from_act_files(i: CameraInputs) -> CameraPath:
    poses = resolve_input_file(i.poses_file, "poses_file", ".npy")
    action = poses.parent / ACTION_FILE
    if not action.is_file():
        raise ValueError(f"source act_files: no {ACTION_FILE} beside poses_file {i.poses_file!r}; the Act checkpoint "
                         f"needs the W/A/S/D keys of each frame there ([frames, 4], columns w, a, s, d), as the "
                         "official Act examples hold them. For Base-Cam use source files")
    return path_from_act_files(poses, resolve_input_file(i.intrinsics_file, "intrinsics_file", ".npy"), action)


# Source name -> its path. The combo offers them in this order (new ones go last).
PATH_SOURCES: dict[str, Callable[[CameraInputs], CameraPath]] = {
    "preset": _from_preset,
    "files": _from_files,
    "actions": _from_actions,
    "import": _from_export,
    "act_files": _from_act_files,
}
SOURCES = tuple(PATH_SOURCES)


def camera_path(source: str, preset: str, speed: float, poses_file: str, intrinsics_file: str, width: int,
                height: int, frames: int, actions: str, pose_export: str, normalize_scale: bool,
                camera_axes: str = "opencv", play_timing: bool = False) -> CameraPath:
    """The whole camera path the node's inputs describe (``play_timing``: an action string
    under the per-chunk Play keyframes)."""
    build = PATH_SOURCES.get(source)
    if build is None:
        raise ValueError(f"source: {source!r} is not one of {', '.join(SOURCES)}")
    return build(CameraInputs(source, preset, speed, poses_file, intrinsics_file, width, height, frames, actions,
                              pose_export, normalize_scale, camera_axes, play_timing))
