"""Test-only ComfyUI custom node package: holds a LingBot stage open so a test can Cancel it.

Loaded ONLY by the servers of tests/integration/test_reliability.py (through an
``--extra-model-paths-config`` that adds a ``custom_nodes`` folder); never shipped with the
pack. It wraps a few functions of the already imported pack, so no test hook lives in the
product code. The protocol, in the folder named by ``$LINGBOT_FAULT_DIR``:

- ``<stage>.hold`` exists when the stage is reached: the plugin writes ``<stage>.reached``
  and blocks until the test deletes ``<stage>.hold`` (the test sends ``/interrupt`` in
  between). Stages: ``text`` (just after the T5 encoder loaded), ``expert`` (just after
  an expert loaded, inside ComfyUI's ``load_models_gpu``), ``sampling`` (before a model
  call of a sampling step) and ``decode`` (just after the VAE loaded for decoding).
- ``oom.once`` exists at a sampling step: the plugin deletes it and raises
  ``torch.cuda.OutOfMemoryError`` there, as a GPU that ran out of memory would.

After the hold ends the pack's own interrupt checks decide what happens: the plugin
never raises the interrupt itself.

It also adds ``LingBotFaultSink``, an output node that accepts any value, so that a test
can run part of a workflow (LoadImage -> VAE Encode) without the sampler.
"""
from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
import time
from pathlib import Path

import torch

log = logging.getLogger("lingbot_fault_plugin")
HOLD_LIMIT_S = 120.0  # a test that died must not leave the server blocked for ever


def _fault_dir() -> Path | None:
    value = os.environ.get("LINGBOT_FAULT_DIR")
    return Path(value) if value else None


def hold(stage: str) -> None:
    folder = _fault_dir()
    if folder is None:
        return
    flag = folder / f"{stage}.hold"
    if not flag.exists():
        return
    (folder / f"{stage}.reached").write_text(f"{time.time()}\n")
    log.info("lingbot fault plugin: holding stage %s", stage)
    deadline = time.monotonic() + HOLD_LIMIT_S
    while flag.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    log.info("lingbot fault plugin: released stage %s", stage)


def maybe_oom() -> None:
    folder = _fault_dir()
    flag = folder / "oom.once" if folder else None
    if flag is not None and flag.exists():
        flag.unlink()
        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 9.50 GiB (simulated by the LingBot test plugin)")


def _find_pack() -> str:
    # ComfyUI imports a custom node package under its folder path; the pack is the package
    # whose own pipeline.sampling module is loaded (ComfyUI's top-level ``nodes`` module
    # also lists LingBotWorldSampler, but has no such submodule).
    for name in list(sys.modules):
        if f"{name}.pipeline.sampling" in sys.modules and f"{name}.nodes.host.expert_patcher" in sys.modules:
            return name
    raise RuntimeError("lingbot fault plugin: the LingBot pack is not imported; it must load first")


def _after(module, attribute: str, stage: str) -> None:
    real = getattr(module, attribute)

    @functools.wraps(real)
    def wrapper(*args, **kwargs):
        result = real(*args, **kwargs)
        hold(stage)
        return result

    setattr(module, attribute, wrapper)


def install() -> str:
    pack = _find_pack()
    text = importlib.import_module(f"{pack}.pipeline.text")
    decode = importlib.import_module(f"{pack}.pipeline.decode")
    sampling = importlib.import_module(f"{pack}.pipeline.sampling")
    patcher = importlib.import_module(f"{pack}.nodes.host.expert_patcher")
    _after(text, "load_t5", "text")
    _after(decode, "load_vae", "decode")
    _after(patcher, "load_expert", "expert")

    real_velocity = sampling._ActiveExpert.velocity

    @functools.wraps(real_velocity)
    def velocity(self, *args, **kwargs):
        maybe_oom()
        hold("sampling")
        return real_velocity(self, *args, **kwargs)

    sampling._ActiveExpert.velocity = velocity
    return pack


class LingBotFaultSink:
    """Output node for tests: takes any value and reports its type."""

    CATEGORY = "testing"
    RETURN_TYPES = ()
    FUNCTION = "take"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("*", {})}}

    @classmethod
    def VALIDATE_INPUTS(cls, input_types=None, **_):
        return True  # accepts any socket type

    def take(self, value):
        shape = getattr(getattr(value, "y", None), "shape", None)
        return {"ui": {"received": [type(value).__name__], "shape": [list(shape) if shape is not None else None]}}


log.info("lingbot fault plugin: wrapped %s", install())

NODE_CLASS_MAPPINGS = {"LingBotFaultSink": LingBotFaultSink}
NODE_DISPLAY_NAME_MAPPINGS = {"LingBotFaultSink": "LingBot Fault Sink (tests)"}

