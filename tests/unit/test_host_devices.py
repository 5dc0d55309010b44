"""nodes/host/devices.py: the device a stage runs on."""
from __future__ import annotations

import pytest
import torch

from comfy_host import use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
from comfyui_lingbot_world.nodes.host.devices import pick_device  # noqa: E402


def test_pick_device_on_a_cpu_host():
    assert pick_device("auto") == torch.device("cpu")
    assert pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device=gpu"):
        pick_device("gpu")
