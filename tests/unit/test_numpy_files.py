"""Hostile pose and intrinsics files: each array's header is
read and bounded before its data, only real numbers are taken, and every refusal names the
file and the field (the node's input, not a neighbouring one)."""
from __future__ import annotations

import io
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import folder_paths  # noqa: E402

from comfyui_lingbot_world.loaders.errors import CheckpointError  # noqa: E402
from comfyui_lingbot_world.loaders.numpy_files import MAX_POSES  # noqa: E402
from comfyui_lingbot_world.loaders.pose_import import import_poses  # noqa: E402
from comfyui_lingbot_world.loaders.trajectory import read_intrinsics_row, read_npy  # noqa: E402
from comfyui_lingbot_world.nodes.host import model_files  # noqa: E402
from comfyui_lingbot_world.nodes.camera import LingBotWorldCamera  # noqa: E402
from comfyui_lingbot_world.wan.camera_actions import action_poses  # noqa: E402

NONE = model_files.NO_FILE


def npy_bytes(shape: tuple[int, ...], descr: str = "<f8", data: bytes = b"") -> bytes:
    """An .npy file whose header declares ``shape`` (and ``data`` after it, maybe too little)."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue() + data


def npz_with(path: Path, **members: bytes) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            archive.writestr(f"{name}.npy", content)
    return path


def walk(n: int) -> np.ndarray:
    return action_poses(f"w-{n - 1}", n)


# --------------------------------------------------------------------------- 3. size caps


def test_npz_of_more_poses_than_the_cap_is_refused_before_its_data_is_read(tmp_path):
    poses = np.tile(np.eye(4), (MAX_POSES + 1, 1, 1))  # rigid poses: valid apart from their number
    np.savez_compressed(tmp_path / "many.npz", poses=poses)
    del poses
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=r"many.npz: poses .*10,000 poses"):
            import_poses(tmp_path / "many.npz")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, f"{peak} bytes allocated before the refusal"


def test_npz_inflating_to_20_million_poses_is_refused_from_its_header(tmp_path):
    # What an 8.7 MB .npz of zeros declares: 20 M poses, 2.6 GB of float64 once inflated.
    npz_with(tmp_path / "bomb.npz", poses=npy_bytes((20_000_000, 4, 4), data=bytes(4096)))
    with pytest.raises(CheckpointError, match=r"bomb.npz: poses .*declares shape \[20000000, 4, 4\]"):
        import_poses(tmp_path / "bomb.npz")


def test_210_byte_npz_claiming_2e9_poses_is_refused_without_allocating(tmp_path):
    path = npz_with(tmp_path / "tiny.npz", poses=npy_bytes((2_000_000_000, 4, 4)))
    assert path.stat().st_size < 300
    with pytest.raises(CheckpointError, match=r"tiny.npz: poses .*10,000 poses"):
        import_poses(path)


def test_the_cap_leaves_real_exports_alone(tmp_path):
    np.savez(tmp_path / "long.npz", poses=walk(2000))  # a long tracked clip: more poses than frames
    assert len(import_poses(tmp_path / "long.npz", normalize_scale=False).poses) == 2000


def test_npy_with_a_header_larger_than_its_data_is_truncated(tmp_path):
    (tmp_path / "poses.npy").write_bytes(npy_bytes((81, 4, 4), data=bytes(100)))
    with pytest.raises(CheckpointError, match=r"poses.npy: poses is truncated"):
        read_npy(tmp_path / "poses.npy", "poses")


# --------------------------------------------------------------------------- 6. complex values


def test_complex_poses_in_an_npz_are_refused_naming_file_and_field(tmp_path):
    np.savez(tmp_path / "c.npz", poses=walk(9).astype(np.complex128))
    with pytest.raises(CheckpointError, match=r"c.npz: poses \(array 'poses' of the .npz\) holds complex numbers"):
        import_poses(tmp_path / "c.npz")
    np.savez(tmp_path / "k.npz", poses=walk(9), intrinsics=np.array([500.0, 500, 416, 240]) + 1j)
    with pytest.raises(CheckpointError, match=r"k.npz: intrinsics .*complex"):
        import_poses(tmp_path / "k.npz")


# --------------------------------------------------------------------------- 10. raw errors


def test_truncated_npz_names_the_file(tmp_path):
    np.savez(tmp_path / "whole.npz", poses=walk(41))
    data = (tmp_path / "whole.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"cut.npz: is not a complete .npz archive"):
        import_poses(tmp_path / "cut.npz")


def test_object_array_in_an_npz_names_the_field(tmp_path):
    np.savez(tmp_path / "o.npz", poses=np.array([{"pose": 1}], dtype=object))
    with pytest.raises(CheckpointError, match=r"o.npz: poses .*not a plain numeric .*Python objects"):
        import_poses(tmp_path / "o.npz")


def test_zero_dimensional_intrinsics_is_refused_with_its_shape(tmp_path):
    np.save(tmp_path / "intrinsics.npy", np.float64(500.0))
    with pytest.raises(CheckpointError, match=r"intrinsics.npy: intrinsics has shape \[\]; expected \[N, 4\]"):
        read_intrinsics_row(tmp_path / "intrinsics.npy")


# --------------------------------------------------------------------------- through the node


@pytest.fixture
def input_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "input"
    folder.mkdir()
    monkeypatch.setattr(folder_paths, "input_directory", str(folder))
    return folder


clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def _camera(source: str, intrinsics: str = NONE, export: str = NONE, frames: int = 9):
    return LingBotWorldCamera.execute(source, "pan_left", 1.0, NONE, intrinsics, 48, 32, frames, "w-8", export,
                                      True, 81, 1)


@pytest.mark.parametrize("source", ["actions", "import"])
def test_node_names_intrinsics_file_for_an_object_array(input_dir, source):
    np.save(input_dir / "k.npy", np.array([None, 1], dtype=object), allow_pickle=True)
    np.savez(input_dir / "walk.npz", poses=walk(9))
    with pytest.raises(ValueError, match=r"k.npy: intrinsics_file is not a plain numeric") as caught:
        _camera(source, intrinsics="k.npy", export="walk.npz")
    assert not str(caught.value).startswith("actions")


def test_node_refuses_zero_dimensional_intrinsics_naming_the_input(input_dir):
    np.save(input_dir / "k.npy", np.float64(500.0))
    with pytest.raises(ValueError, match=r"intrinsics_file has shape \[\]"):
        _camera("actions", intrinsics="k.npy")
