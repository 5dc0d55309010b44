"""ComfyUI command-line settings the pack's own loaders follow."""
from __future__ import annotations

from comfy.cli_args import args

from ...loaders.pinned_upload import allow_pinned_staging


def follow_host_settings() -> None:
    """``--disable-pinned-memory``: no page-locked staging buffers when loading weights."""
    allow_pinned_staging(not getattr(args, "disable_pinned_memory", False))
