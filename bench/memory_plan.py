"""``--memory auto`` of the Fast benches: the settings the nodes' ``auto`` would take on a
card of the cap's size (``pipeline.memory.plan_fast_memory``), applied to the bench's
arguments (kv dtype, blocks on the GPU, decode overlap, kept camera terms) and recorded in its JSON."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

import _pack  # noqa: F401  (registers the checkout as comfyui_lingbot_world)
from comfyui_lingbot_world.loaders.expert_size import expert_memory  # noqa: E402
from comfyui_lingbot_world.loaders.layout import read_config  # noqa: E402
from comfyui_lingbot_world.pipeline.memory import (GIB, camera_terms_bytes, fast_run_bytes, graph_pool_bytes,  # noqa: E402
                                                   plan_fast_memory, vae_budgets)
from comfyui_lingbot_world.wan.geometry import latent_size  # noqa: E402
from comfyui_lingbot_world.wan.runtime.kv_cache import KV_DTYPES, CachePolicy  # noqa: E402

RESERVE_BYTES = 1 * GIB  # ComfyUI's minimum inference memory on a CUDA host (--reserve-vram unset)


def card_bytes(args: argparse.Namespace, device: torch.device) -> int:
    """The card the plan is for: the cap, else the device's memory."""
    if args.vram_cap_gb:
        return int(args.vram_cap_gb * GIB)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return 80 * GIB


def apply_memory_plan(args: argparse.Namespace, dit: Path, vae_file: Path | None, device: torch.device,
                      precision: str = "bf16", live_decoder: bool = False) -> dict:
    """Set ``args.kv_dtype``, ``args.blocks_on_gpu`` and ``args.overlap`` (off where the
    plan has no room for it) from the plan for this card (``vae_file`` None: no VAE beside
    the transformer; ``live_decoder``: Play's tiny video VAE decodes, the Wan VAE only
    encodes); returns the plan's record."""
    height, width = (int(v) for v in args.size.lower().split("x"))
    config = read_config(dit)
    on_gpu, _ = expert_memory(dit, getattr(args, "weights", None) or getattr(args, "quantize", None), None)
    run = {d: fast_run_bytes(config, CachePolicy(window=args.kv_window or None, sink=args.kv_sink if args.kv_window
                                                 else 0, dtype=d), *latent_size(height, width), None)
           for d in KV_DTYPES}
    vae, decode = (0, 0) if vae_file is None else vae_budgets(Path(vae_file).stat().st_size, height, width, precision,
                                                             live_decoder)
    terms = camera_terms_bytes(config, *latent_size(height, width), CachePolicy().chunk)
    graphs = getattr(args, "cuda_graphs", False)
    plan = plan_fast_memory(card_bytes(args, device), on_gpu, config.num_layers, run, vae,
                            decode, RESERVE_BYTES,
                            terms_bytes=terms if getattr(args, "camera_terms", None) is None else 0,
                            graph_bytes=graph_pool_bytes(config, *latent_size(height, width), CachePolicy().chunk)
                            if graphs else 0)
    args.cuda_graphs = graphs and plan.cuda_graphs  # asked for, and room for the pool
    if getattr(args, "camera_terms", None) is None:
        args.camera_terms = plan.camera_terms
    args.kv_dtype = plan.kv_dtype
    args.blocks_on_gpu = plan.blocks_on_gpu or 0
    args.overlap = getattr(args, "overlap", True) and plan.overlap  # an asked-for sequential run stays one
    args.vae_on_gpu = plan.vae_on_gpu
    print(f"memory auto for {card_bytes(args, device) / GIB:.0f} GiB: {plan.describe()}"
          + ("" if plan.fits else " (does not fit: the smallest plan)"))
    return {"kv_dtype": plan.kv_dtype, "blocks_on_gpu": plan.blocks_on_gpu, "vae_on_gpu": plan.vae_on_gpu,
            "overlap": plan.overlap, "camera_terms": plan.camera_terms, "cuda_graphs": plan.cuda_graphs,
            "estimate_gb": plan.need / GIB, "live_decoder": live_decoder,
            "fits": plan.fits}
