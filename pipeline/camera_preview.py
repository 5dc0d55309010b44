"""A picture of a camera path: the top-down drawing shown by the Camera node and written by
``generate --preview`` (PIL; the path itself is plain arrays, see ``wan/camera.py``)."""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageDraw

from ..wan.camera import CameraError, as_float_array


def draw_trajectory(
    poses: np.ndarray | torch.Tensor, size: tuple[int, int] = (512, 512), cuts: tuple[int, ...] = ()
) -> np.ndarray:
    """Top-down view of a camera path: uint8 RGB [height, width, 3] for ``size`` = (width, height).

    The path is drawn in the first camera's ground plane (its x to the right, its z
    forward = up in the picture), so the preview does not depend on the world's axes.
    Short ticks show where the camera looks; a green dot marks the start, a red square
    the end. ``cuts``: pose indices where a long video's windows begin, marked by white
    bars across the path and numbered.
    """
    width, height = int(size[0]), int(size[1])
    if width < 16 or height < 16:
        raise ValueError(f"size must be at least 16×16 pixels; got {width}×{height}")
    p = as_float_array(poses, "poses")
    if p.ndim != 3 or p.shape[1:] != (4, 4) or p.shape[0] < 1:
        raise CameraError(f"poses: expected shape [N, 4, 4] with N >= 1, got {list(p.shape)}")
    rel = np.linalg.inv(p[0]) @ p  # everything in the first camera's frame
    xz = rel[:, [0, 2], 3]
    look = rel[:, :3, 2][:, [0, 2]]  # camera z axis (view direction) on the ground plane

    lo, hi = xz.min(axis=0), xz.max(axis=0)
    extent = float(max(hi[0] - lo[0], hi[1] - lo[1]))
    tick = 0.1 * extent
    if extent < 1e-9:
        # A camera that only turns: a fan of long ticks around a fixed point.
        extent, tick = 0.0, 1.0
    centre = (lo + hi) / 2
    margin = 0.14 * min(width, height)
    scale = (min(width, height) - 2 * margin) / (extent + 2 * tick)

    def to_px(pt: np.ndarray) -> tuple[float, float]:
        return (width / 2 + (pt[0] - centre[0]) * scale, height / 2 - (pt[1] - centre[1]) * scale)

    img = Image.new("RGB", (width, height), (24, 26, 30))
    draw = ImageDraw.Draw(img)
    # Axes through the start camera: x (right) and z (forward).
    ox, oy = to_px(np.zeros(2))
    draw.line([(0, oy), (width, oy)], fill=(55, 58, 66))
    draw.line([(ox, 0), (ox, height)], fill=(55, 58, 66))
    draw.text((width - 14, oy + 2), "x", fill=(120, 124, 134))
    draw.text((ox + 4, 2), "z", fill=(120, 124, 134))

    n = len(xz)
    every = max(1, n // 24)
    for i in list(range(0, n, every)) + [n - 1]:
        d = look[i]
        norm = float(np.hypot(*d))
        if norm < 1e-9:  # looking straight up or down
            continue
        tip = xz[i] + d / norm * tick
        draw.line([to_px(xz[i]), to_px(tip)], fill=(240, 190, 60), width=2)
    if n > 1:
        pts = [to_px(q) for q in xz]
        for i in range(n - 1):
            t = i / max(1, n - 2)
            colour = (int(80 + 150 * t), int(170 - 60 * t), int(255 - 120 * t))
            draw.line([pts[i], pts[i + 1]], fill=colour, width=3)
    r = max(3, min(width, height) // 64)
    for number, i in enumerate(cuts, start=1):
        if not 0 <= i < n:
            raise ValueError(f"cut at pose {i} is outside the path of {n} poses")
        _draw_cut(draw, to_px, xz, i, 2 * r, str(number + 1))
    sx, sy = to_px(xz[0])
    draw.ellipse([sx - r, sy - r, sx + r, sy + r], fill=(70, 200, 90))
    ex, ey = to_px(xz[-1])
    draw.rectangle([ex - r, ey - r, ex + r, ey + r], outline=(230, 70, 70), width=2)
    draw.text((6, 6), f"top view, {n} poses", fill=(200, 200, 200))
    draw.text((6, height - 16), "start", fill=(70, 200, 90))
    draw.text((48, height - 16), "end", fill=(230, 70, 70))
    if cuts:
        draw.text((6, 20), f"{len(cuts) + 1} windows", fill=(235, 235, 235))
    return np.asarray(img, dtype=np.uint8).copy()


def _draw_cut(draw, to_px, xz: np.ndarray, i: int, half: float, label: str) -> None:
    """A bar across the path at pose ``i`` (perpendicular to the local direction of travel)."""
    x, y = to_px(xz[i])
    a, b = to_px(xz[max(i - 1, 0)]), to_px(xz[min(i + 1, len(xz) - 1)])
    dx, dy = b[0] - a[0], b[1] - a[1]
    norm = float(np.hypot(dx, dy))
    nx, ny = (-dy / norm, dx / norm) if norm > 1e-9 else (1.0, 0.0)
    draw.line([(x - nx * half, y - ny * half), (x + nx * half, y + ny * half)], fill=(245, 245, 245), width=2)
    draw.text((x + nx * half + 2, y + ny * half - 6), label, fill=(245, 245, 245))
