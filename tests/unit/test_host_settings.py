"""nodes/host/host_settings.py: ComfyUI's command-line settings the pack's loaders follow."""
from __future__ import annotations


from comfy_host import use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported


def test_comfy_disable_pinned_memory_turns_staging_off(monkeypatch):
    from comfy.cli_args import args

    from comfyui_lingbot_world.loaders import pinned_upload
    from comfyui_lingbot_world.nodes.host.host_settings import follow_host_settings

    monkeypatch.setattr(args, "disable_pinned_memory", True)
    try:
        follow_host_settings()
        assert pinned_upload._allowed is False
        monkeypatch.setattr(args, "disable_pinned_memory", False)
        follow_host_settings()
        assert pinned_upload._allowed is True
    finally:
        pinned_upload.allow_pinned_staging(True)
