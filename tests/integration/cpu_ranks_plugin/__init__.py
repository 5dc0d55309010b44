"""Test-only ComfyUI custom node package: the Fast DiT Loader's ``devices=sequence_parallel``
on two CPU ranks (gloo) in a server started with ``--cpu``, where the pack itself offers the
mode on CUDA GPUs only.

Loaded ONLY by the server of tests/integration/test_sequence_parallel_server.py (through an
``--extra-model-paths-config`` that adds a ``custom_nodes`` folder, loaded after the pack);
never shipped. It replaces the GPUs the loaders may use (``nodes/host/gpus.usable_gpus``) by two
CPU devices, as tests/unit/test_fast_sequence_parallel.py does in-process, so everything else
runs as on two GPUs: the worker process spawned from ComfyUI's main.py, the worker copy under
ComfyUI's memory manager, Play's chunks in lock-step, ``POST /free`` and a killed worker.
"""
from __future__ import annotations

import importlib
import logging
import sys

import torch

log = logging.getLogger("lingbot_cpu_ranks_plugin")
RANKS = 2


def _find_pack() -> str:
    # ComfyUI imports a custom node package under its folder path: the pack is the package
    # whose own Fast DiT Loader module is loaded.
    for name in list(sys.modules):
        if f"{name}.nodes.fast_dit_loader" in sys.modules and f"{name}.nodes.host.gpus" in sys.modules:
            return name
    raise RuntimeError("lingbot cpu ranks plugin: the LingBot pack is not imported; it must load first")


def install() -> str:
    pack = _find_pack()
    gpus = importlib.import_module(f"{pack}.nodes.host.gpus")
    gpus.usable_gpus = lambda: ([torch.device("cpu")] * RANKS, f"{RANKS} CPU ranks (test plugin)")
    return pack


log.info("lingbot cpu ranks plugin: sequence parallel on %d CPU ranks in %s", RANKS, install())

NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}
