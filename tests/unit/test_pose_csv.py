"""loaders/pose_csv.py: camera paths recorded as CSV (position + camera-to-world quaternion,
columns named in a header row), read bounded, with errors naming the file, line and column."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from comfyui_lingbot_world.loaders import pose_csv
from comfyui_lingbot_world.loaders.pose_csv import read_pose_csv
from comfyui_lingbot_world.wan.camera import CameraError
from comfyui_lingbot_world.wan.camera_actions import action_poses


def _rows(poses: np.ndarray) -> list[str]:
    out = []
    for pose in poses:
        q = Rotation.from_matrix(pose[:3, :3]).as_quat()
        out.append(",".join(f"{v:.17g}" for v in (*pose[:3, 3], *q)))
    return out


def test_columns_by_name_in_any_order(tmp_path) -> None:
    poses = action_poses("w-5,l-5,i-3")
    (tmp_path / "a.csv").write_text("\n".join(["x,y,z,qx,qy,qz,qw"] + _rows(poses)) + "\n")
    np.testing.assert_allclose(read_pose_csv(tmp_path / "a.csv"), poses, atol=1e-12)
    # Scalar first, spaces and capitals in the header, an extra column, a byte-order mark, CRLF.
    lines = [" QW , qx,qy ,qz, X,Y,Z ,speed"]
    for row in _rows(poses):
        x, y, z, qx, qy, qz, qw = row.split(",")
        lines.append(",".join([qw, qx, qy, qz, x, y, z, "1.5"]))
    (tmp_path / "b.csv").write_bytes(("\ufeff" + "\r\n".join(lines) + "\r\n").encode("utf-8"))
    np.testing.assert_allclose(read_pose_csv(tmp_path / "b.csv"), poses, atol=1e-12)


def test_a_time_column_orders_the_rows(tmp_path) -> None:
    poses = action_poses("w-4,j-4")
    rows = [f"{t},{row}" for t, row in zip(np.arange(len(poses)) * 0.0625, _rows(poses))]
    (tmp_path / "t.csv").write_text("\n".join(["time,x,y,z,qx,qy,qz,qw"] + rows[::-1]) + "\n")
    np.testing.assert_allclose(read_pose_csv(tmp_path / "t.csv"), poses, atol=1e-12)
    (tmp_path / "twice.csv").write_text("\n".join(["time,x,y,z,qx,qy,qz,qw", rows[0], rows[0]]) + "\n")
    with pytest.raises(CameraError, match="two rows have time = 0"):
        read_pose_csv(tmp_path / "twice.csv")


@pytest.mark.parametrize("text, words", [
    ("", "the file is empty"),
    ("x,y,z,qx,qy,qz,qw\n", "a header row but no poses"),
    ("x,y,z,qx,qy,qw\n0,0,0,0,0,1\n", "missing column.*qz"),
    ("x,y,z,qx,qy,qz,qw,x\n0,0,0,0,0,0,1,0\n", "x appear twice"),
    ("x,y,z,qx,qy,qz,qw\n0,0,zero,0,0,0,1\n", "line 2, column z: 'zero' is not a number"),
    ("x,y,z,qx,qy,qz,qw\n0,0,nan,0,0,0,1\n", "line 2, column z is nan"),
    ("x,y,z,qx,qy,qz,qw\n0,0,0,0,0,0\n", "line 2 has 6 fields, no value for column qw"),
    ("x,y,z,qx,qy,qz,qw\n0,0,0,0,0,0,2\n", "pose 0 has the quaternion .* of length 2; an orientation is a unit"),
])
def test_bad_files_name_the_line_and_column(tmp_path, text: str, words: str) -> None:
    (tmp_path / "bad.csv").write_text(text)
    with pytest.raises(CameraError, match=rf"bad\.csv: .*{words}"):
        read_pose_csv(tmp_path / "bad.csv")


def test_reading_is_bounded(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(pose_csv, "MAX_CSV_POSES", 3)
    (tmp_path / "long.csv").write_text("\n".join(["x,y,z,qx,qy,qz,qw"] + ["0,0,0,0,0,0,1"] * 4) + "\n")
    with pytest.raises(CameraError, match="more than 3 poses"):
        read_pose_csv(tmp_path / "long.csv")
    monkeypatch.setattr(pose_csv, "MAX_CSV_BYTES", 10)
    with pytest.raises(CameraError, match="at most 10 bytes"):
        read_pose_csv(tmp_path / "long.csv")
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00x")
    monkeypatch.setattr(pose_csv, "MAX_CSV_BYTES", 1000)
    with pytest.raises(CameraError, match="not a UTF-8 text file"):
        read_pose_csv(tmp_path / "binary.csv")
