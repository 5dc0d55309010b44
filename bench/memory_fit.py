"""What each part of a Fast run takes on the GPU, measured, beside what the memory plan
(``pipeline.memory``) estimates for it: the numbers the plan's constants are fitted to.

    python bench/memory_fit.py --synthetic a14b --weights fp8 --vae VAE.pth --comfy .bench_host \
        --out $OUT/memory_fit.json

The transformer is built from seeded random weights of the given shapes on the GPU (no
package; ``bench/_synthetic.py``). Each part is measured as the growth of
``torch.cuda.memory_allocated`` it leaves (kept) and of ``max_memory_allocated`` while it
works (peak), one part at a time, in the order a Play session allocates them:

* ``weights``: the transformer on the GPU (every block);
* ``vae``: the Wan VAE's weights, then its stream encoder's state while the image condition
  is encoded (Play keeps the encoder until the condition is proven constant);
* ``tiny_decoder`` (``--comfy``): ComfyUI's tiny video VAE as Play's live decoder, its
  weights and one chunk's stream decode;
* ``wan_decoder``: the Wan VAE's stream decoder of one chunk instead (Fast Long Video);
* per cache dtype (``--kv-dtypes``) and camera-terms count (``--terms``): the KV cache, a
  chunk's five passes (the activations over the cache), with ``--cuda-graphs`` the graphs'
  pool (the captures happen in the chunks after the cache fills: ``--chunks`` of them).

Checked on the CPU with the tiny shapes (every figure then reads 0: no CUDA allocator):

    python bench/memory_fit.py --synthetic tiny --vae VAE.pth --size 32x48 --device cpu --out /tmp/fit.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path

import torch

import _pack  # noqa: F401  (registers the checkout as comfyui_lingbot_world)
from comfyui_lingbot_world.pipeline.fast import FastGenerator, FastParams  # noqa: E402
from comfyui_lingbot_world.pipeline.fast.conditions import StreamedI2V  # noqa: E402
from comfyui_lingbot_world.pipeline.image import as_pil, open_vae, vae_dtype  # noqa: E402
from comfyui_lingbot_world.pipeline.memory import (GIB, activation_bytes, camera_terms_bytes,  # noqa: E402
                                                   decode_chunk_bytes, fast_run_bytes, graph_pool_bytes,
                                                   release_module, vae_budgets, vae_stream_bytes)
from comfyui_lingbot_world.wan.conditioning import image_to_tensor  # noqa: E402
from comfyui_lingbot_world.wan.geometry import latent_size, video_tokens  # noqa: E402
from comfyui_lingbot_world.wan.runtime.kv_cache import KV_DTYPES, CachePolicy  # noqa: E402
from _synthetic import SyntheticDiT  # noqa: E402
from fast_chunks import load_image, sync  # noqa: E402
from play_session import random_text, synthetic_config, tiny_decoder_factory  # noqa: E402


class Meter:
    """The allocator's growth across a part: what it keeps and its peak while it works."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0

    def __enter__(self) -> "Meter":
        sync(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.before = self.allocated()
        return self

    def __exit__(self, *exc) -> None:
        sync(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else 0
        self.kept = self.allocated() - self.before
        self.peak = max(peak - self.before, self.kept)


def gib(n: int | float | None) -> float | None:
    return None if n is None else round(float(n) / GIB, 6)


def part(measured: Meter, estimate: int | None, what: str, against: str = "peak") -> dict:
    """One part's record: kept and peak, measured, beside the plan's estimate and their ratio
    (``against``: the figure the plan counts, "peak" or, for what stays such as the weights,
    "kept")."""
    record = {"what": what, "kept_gib": gib(measured.kept), "peak_gib": gib(measured.peak),
              "estimate_gib": gib(estimate)}
    measured_bytes = measured.peak if against == "peak" else measured.kept
    if estimate and measured_bytes:
        record[f"estimate_over_{against}"] = round(estimate / measured_bytes, 4)
    return record


def measure(args: argparse.Namespace) -> dict:
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    height, width = (int(v) for v in args.size.lower().split("x"))
    lat_h, lat_w = latent_size(height, width)
    config = synthetic_config(args.synthetic)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    parts: dict = {}

    with Meter(device) as m:
        model = SyntheticDiT(config, dtype, weights=args.weights)(device)
    params = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    # What stays is what the plan counts: making the fp8 weights from bf16 peaks higher once, at load.
    parts["weights"] = part(m, params, "the transformer, every block on the GPU (estimate: its tensors' bytes)",
                            against="kept")

    pixels = image_to_tensor(as_pil(load_image(args.image, height, width)), height, width)
    vae_device = device
    with Meter(device) as m:
        vae = open_vae(args.vae, vae_device, vae_dtype(vae_device, args.vae_precision))
    vae_weights = m.kept
    parts["vae_weights"] = part(m, Path(args.vae).stat().st_size if args.vae_precision == "fp32" else
                                Path(args.vae).stat().st_size // 2, "the Wan VAE's weights")
    with Meter(device) as m:
        source = StreamedI2V(vae, pixels.to(vae_device), None)
        source.prefetch(args.prefetch)
    parts["vae_encoder"] = part(m, vae_stream_bytes(height, width, args.vae_precision, decoder=False),
                                f"the stream encoder's state, {args.prefetch} latent frames encoded")
    stream_budget, _ = vae_budgets(vae_weights, height, width, args.vae_precision, live_decoder=True)

    x0 = torch.randn(1, 16, 3, lat_h, lat_w, generator=torch.Generator().manual_seed(1)).to(device, vae.dtype)
    with Meter(device) as m:
        decoder = vae.stream_decoder()
        for i in range(3):
            video = decoder.decode_next(x0[:, :, i:i + 1])
            del video
        decoder.close()
        del decoder
    parts["wan_decoder_chunk"] = part(m, vae_stream_bytes(height, width, args.vae_precision)
                                      - vae_stream_bytes(height, width, args.vae_precision, decoder=False)
                                      + decode_chunk_bytes(height, width, args.vae_precision),
                                      "the Wan VAE's stream decoder: one chunk decoded a latent frame at a time")
    if args.comfy:
        tiny_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        with Meter(device) as m:
            make = tiny_decoder_factory(args.comfy, device, tiny_dtype)
            tiny = make()
        parts["tiny_weights"] = part(m, None, "the tiny video VAE's weights and decoder")
        with Meter(device) as m:
            for _ in range(2):
                for i in range(3):
                    video = tiny.decode_next(x0[:, :, i:i + 1].to(tiny_dtype))
                    del video
        _, tiny_decode = vae_budgets(vae_weights, height, width, args.vae_precision, live_decoder=True)
        parts["tiny_decode_chunk"] = part(m, tiny_decode, "two chunks decoded by the tiny decoder (kept: its memory)")
        tiny.close() if hasattr(tiny, "close") else None
        del tiny, make
    parts["vae_stream_budget"] = {"estimate_gib": gib(stream_budget),
                                  "what": "the plan's whole VAE budget with the live decoder (weights, encoder, tiny kept)"}

    text = random_text(config)
    camera = torch.randn(1, 384, 3, lat_h, lat_w, generator=torch.Generator().manual_seed(2))
    runs = {}
    for kv in args.kv_dtypes.split(","):
        for terms in (int(t) for t in args.terms.split(",")):
            policy = CachePolicy(window=args.kv_window, sink=args.kv_sink, dtype=kv)
            fp = FastParams(seed=0, policy=policy, attention=args.attention, camera_terms=terms,
                            cuda_graphs=args.cuda_graphs)
            run: dict = {"kv_dtype": kv, "camera_terms": terms}
            with Meter(device) as whole:
                with Meter(device) as m:
                    gen = FastGenerator(model, text, source, fp, latent_frames=None)
                run["cache_alloc"] = part(m, None, "the cache as allocated when the session opens")
                per_chunk = []
                for c in range(args.chunks):
                    with Meter(device) as m:
                        gen.next_chunk(camera.to(device))
                    per_chunk.append({"kept_gib": gib(m.kept), "peak_gib": gib(m.peak)})
                run["chunks"] = per_chunk
                run["cache_nbytes_gib"] = gib(gen.cache.nbytes())
                graphs = gen.cache.graphs
                run["graphs"] = None if graphs is None else {"captures": graphs.captures, "replays": graphs.replays}
                # Freed, not kept: the model's kept cache would be the next run's baseline.
                gen.close(free=True)
            estimate = (fast_run_bytes(config, policy, lat_h, lat_w, None, attention=args.attention)
                        + terms * camera_terms_bytes(config, lat_h, lat_w, policy.chunk)
                        + (graph_pool_bytes(config, lat_h, lat_w, policy.chunk) if args.cuda_graphs else 0))
            run["whole"] = part(whole, estimate, "the run: cache + terms + graphs + a chunk's passes at their peak")
            run["activation_estimate_gib"] = gib(activation_bytes(video_tokens(policy.chunk, lat_h, lat_w), config.dim))
            runs[f"{kv}_terms{terms}"] = run
            torch.cuda.empty_cache() if device.type == "cuda" else None
    source.close()
    release_module(vae)
    release_module(model)
    return {"gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
            "ranks": 1, "synthetic": args.synthetic, "weights": args.weights, "size": args.size,
            "vae_precision": args.vae_precision, "attention": args.attention, "cuda_graphs": args.cuda_graphs,
            "kv_window": args.kv_window, "kv_sink": args.kv_sink, "parts": parts, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--synthetic", default="a14b", choices=("a14b", "tiny"))
    p.add_argument("--weights", default="fp8", choices=("bf16", "fp8", "int8", "nf4"))
    p.add_argument("--vae", required=True, help="a Wan 2.1 VAE file (make_checkpoint --parts vae)")
    p.add_argument("--vae-precision", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--comfy", default=None, help="ComfyUI's sources (comfy/): measure the tiny live decoder too")
    p.add_argument("--image")
    p.add_argument("--size", default="480x832")
    p.add_argument("--device", default="auto")
    p.add_argument("--kv-dtypes", default=",".join(KV_DTYPES))
    p.add_argument("--kv-window", type=int, default=9)
    p.add_argument("--kv-sink", type=int, default=3)
    p.add_argument("--terms", default="0,40", help="comma-separated camera-terms counts, a run each")
    p.add_argument("--attention", default=None)
    p.add_argument("--cuda-graphs", action="store_true")
    p.add_argument("--chunks", type=int, default=5, help="chunks per run (the cache fills at 3 with window 9)")
    p.add_argument("--prefetch", type=int, default=4, help="latent frames the image condition encodes up front")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    record = measure(args)
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(out)
    print(json.dumps({k: v.get("estimate_over_peak", v.get("estimate_over_kept")) for k, v in record["parts"].items()}
                     | {k: v["whole"].get("estimate_over_peak") for k, v in record["runs"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
