"""Write a synthetic (random-weight) LingBot-World package, laid out as the NF4 package
(``--layout nf4``: *_bnb_nf4 expert folders) or as the official bf16 release (``--layout bf16``:
high_noise_model/ and low_noise_model/ with sharded safetensors); docs/conventions.md#checkpoint-layouts.

    python <checkout> make_checkpoint --preset tiny --layout nf4 --out DIR
    python <checkout> make_checkpoint --model act --preset tiny --layout nf4 --out DIR
    python -m comfyui_lingbot_world.tools.make_checkpoint --preset a14b --layout nf4 --out DIR --device cuda
    python <checkout> make_checkpoint --model fast --preset tiny --layout bf16 --out DIR --parts transformer

``--model fast`` writes the LingBot-World Fast transformer instead of the two experts: one
folder as the official release places it inside the Base-Cam folder, ``lingbot_world_fast/``
(bf16 shards; ``--layout bf16``), or ``lingbot_world_fast_bnb_nf4/`` (the NF4 layout of the
package tool; ``--layout nf4``), each with the official Fast config.json (``_class_name``
WanModelFast, ``local_attn_size``, ``sink_size``: how loaders/model_kind.py tells it from a
Base expert). Its default parts are the transformer, T5, VAE and tokenizer; ``--parts
transformer`` adds it to a package written before.

``--parts comfy_t5 --comfy-t5 fp8_scaled`` also writes the text encoder as ComfyUI users have
it (``umt5_xxl_*.safetensors``: HF key names, SentencePiece model inside; see
tools/synthetic/t5.py); it is not part of the default parts.

``--model act`` writes the Act checkpoint's experts (config.json unchanged; the control
layer patch_embedding_wancamctrl takes 7 channels, [dim, 1792] at A14B and tiny patch
sizes, instead of Base-Cam's 6; docs/conventions.md#act-checkpoint).

Nothing in --out is replaced unless ``--overwrite``; then each part is written under a hidden
temporary name and renamed into place (loaders/new_file.py), so a file of --out that is a hard
link to a release's file (``quantize`` links the T5, the VAE and the tokenizer) is unlinked,
never written into: the release keeps its bytes.

``tiny`` takes seconds on a CPU. ``a14b`` has the real shapes (each expert ~9.6 GB as NF4,
~37 GB as bf16; umT5-XXL ~10.6 GB); build it with --device cuda where one is available: the
experts are made and quantized part by part on that device, never whole in RAM. The room the
parts need is checked on --out's disk before anything is written, and each part says when it
starts, how far it got (every few seconds) and when it is done.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from ..loaders.dit_weights import linear_layers
from ..loaders.nf4_convert import BLOCKSIZE, QUANT_STATE_MAX_BYTES
from ..loaders.model_kind import fast_config_fields
from ..loaders.new_file import install, partial_name, refuse_existing, remove
from ..loaders.package import BASE_ROLES, FAST, T5_FILE, TOKENIZER_FOLDER, VAE_FILE, expert_folder
from .synthetic.dit import write_synthetic_bf16_expert, write_synthetic_nf4_expert
from .synthetic.t5 import COMFY_T5_FILES, write_comfy_t5, write_t5_checkpoint, write_tokenizer
from .synthetic.vae import write_vae_checkpoint
from ..wan.config import A14B, TINY, DiTConfig
from ..wan.model import LingBotDiT
from ..wan.t5 import T5_TINY, UMT5_XXL, UMT5Encoder
from ..wan.vae import VAE_TINY, WAN21, WanVAE
from . import cli
from .cli import duration, human_bytes, tree_bytes

GEOMETRY_PRESETS = {
    "tiny": {"dit": TINY, "t5": T5_TINY, "vae": VAE_TINY},
    "a14b": {"dit": A14B, "t5": UMT5_XXL, "vae": WAN21},
}
# Model -> the control its camera layer reads (wan/config.py): Base-Cam and Fast take Plücker
# rays, Act ray directions + W/A/S/D keys.
MODELS = {"base": "cam", "act": "act", "fast": "cam"}
# The model's own weights first: the two experts of Base and Act, the one transformer of Fast.
MODEL_PART = {"base": "experts", "act": "experts", "fast": "transformer"}
SHARED_PARTS = ("t5", "vae", "tokenizer")
PARTS = (MODEL_PART["base"], *SHARED_PARTS)  # the default parts of --model base
# Written only when asked for: the text encoder in ComfyUI's layout.
EXTRA_PARTS = ("comfy_t5",)
FAST_SEED_OFFSET = 4  # after the experts (0, 1), T5 (2) and the VAE (3)
PROGRESS_SECONDS = 5.0  # at most one progress line this often per expert
# Room counted for the tokenizer folder: a bound well above what write_tokenizer writes for
# umT5's vocabulary.
TOKENIZER_BYTES = 64 << 20
FILE_OVERHEAD = 1 << 20  # a part's headers, index and config.json, at most


def parts_for(model: str) -> tuple[str, ...]:
    """The parts ``--model`` can write, its default set first."""
    return (MODEL_PART[model], *SHARED_PARTS)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.ArgumentParser(prog="make_checkpoint", description=__doc__)
    p.add_argument("--preset", choices=sorted(GEOMETRY_PRESETS), required=True, help="model geometry")
    p.add_argument("--model", choices=list(MODELS), default="base",
                   help="base: LingBot-World Base-Cam's two experts (Plücker rays); act: LingBot-World Act's two "
                   "experts (ray directions + W/A/S/D keys); fast: the one LingBot-World Fast transformer")
    p.add_argument("--layout", choices=("nf4", "bf16"), required=True,
                   help="nf4: the NF4 package's layout (*_bnb_nf4 expert folders); bf16: the official bf16 "
                   "release's (high_noise_model/, low_noise_model/ with sharded safetensors)")
    p.add_argument("--out", type=Path, required=True, help="package folder to write (created if missing)")
    p.add_argument("--seed", type=int, default=0, help="base seed; each component gets its own offset")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where expert weights are made")
    p.add_argument("--parts", default=None,
                   help=f"comma-separated subset of {','.join(PARTS + EXTRA_PARTS)} (default: {','.join(PARTS)}); "
                   f"with --model fast, {MODEL_PART['fast']} instead of {MODEL_PART['base']}")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the parts --out already holds (each is written anew and renamed into place)")
    p.add_argument("--comfy-t5", choices=sorted(COMFY_T5_FILES), default="bf16",
                   help="format of the comfy_t5 part (ComfyUI's umt5_xxl_*.safetensors layout)")
    args = p.parse_args(argv)
    allowed = parts_for(args.model) + EXTRA_PARTS
    given = args.parts if args.parts is not None else ",".join(parts_for(args.model))
    parts = [s.strip() for s in given.split(",") if s.strip()]
    unknown = sorted(set(parts) - set(allowed))
    if unknown or not parts:
        p.error(f"--parts: unknown part(s) {', '.join(unknown) or '(none given)'} for --model {args.model}; "
                f"choose from {', '.join(allowed)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    args.parts = parts
    return args


def part_targets(out: Path, layout: str, parts: list[str], comfy_t5: str = "bf16") -> list[Path]:
    """The files and folders of ``out`` that writing ``parts`` makes (or replaces)."""
    names = {MODEL_PART["fast"]: [expert_folder(FAST, layout)],
             "experts": [expert_folder(role, layout) for role in BASE_ROLES], "t5": [T5_FILE],
             "comfy_t5": [COMFY_T5_FILES[comfy_t5]], "vae": [VAE_FILE], "tokenizer": [TOKENIZER_FOLDER]}
    return [out / name for part in parts for name in names[part]]


def _state_bytes(module: torch.nn.Module, itemsize: int) -> int:
    return sum(t.numel() for t in module.state_dict().values()) * itemsize


def _expert_bytes(config: DiTConfig, layout: str) -> int:
    """An expert's files, from its shapes alone (a model on the meta device): bf16 throughout,
    or (NF4) each linear weight in 4 bits with a byte of absmax per block and its quant state."""
    with torch.device("meta"):
        model = LingBotDiT(config)
    total = _state_bytes(model, 2)
    if layout == "nf4":
        linears = linear_layers(model).values()
        values = sum(layer.weight.numel() for layer in linears)
        total -= values * 2 - values // 2 - values // BLOCKSIZE - len(linears) * QUANT_STATE_MAX_BYTES
    return total


def part_bytes(part: str, preset: str, layout: str, model: str = "base") -> int:
    """What writing ``part`` puts on the disk: its tensors' bytes and a mebibyte a file for
    headers and config.json, a little above its files' size."""
    shapes = GEOMETRY_PRESETS[preset]
    if part in ("experts", MODEL_PART["fast"]):
        config = dataclasses.replace(shapes["dit"], control_type=MODELS[model])
        return (_expert_bytes(config, layout) + FILE_OVERHEAD) * (2 if part == "experts" else 1)
    if part == "tokenizer":
        return TOKENIZER_BYTES
    with torch.device("meta"):
        if part == "vae":
            return _state_bytes(WanVAE(shapes["vae"]), 4) + FILE_OVERHEAD  # float32
        return _state_bytes(UMT5Encoder(shapes["t5"]), 2) + FILE_OVERHEAD  # t5, comfy_t5: bf16 at most


class _PartProgress:
    """An expert's progress line, at most every PROGRESS_SECONDS (its end has a line of its own)."""

    def __init__(self, name: str, say: Callable[[str], None]) -> None:
        self.name, self.say = name, say
        self.start = self.last = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if done == total or now - self.last < PROGRESS_SECONDS:
            return
        self.last = now
        self.say(f"  {self.name}: {done}/{total} parts made, about "
                 f"{duration((now - self.start) * (total - done) / done)} left")


def write_package(out: Path, preset: str, layout: str, seed: int, device: str, parts: list[str],
                  comfy_t5: str = "bf16", model: str = "base", overwrite: bool = False,
                  say: Callable[[str], None] | None = None) -> list[Path]:
    """Write the chosen parts of a package into ``out``; returns the written paths.
    ``transformer`` is the LingBot-World Fast transformer (``--model fast``). A part ``out``
    already holds is refused (``TargetExists``) unless ``overwrite``; each part is written
    under a temporary name and renamed into place, never into an existing file. ``say``
    receives a line as each part starts and ends, and an expert's progress."""
    for target in part_targets(out, layout, parts, comfy_t5):
        refuse_existing(target, overwrite)
    shapes = dict(GEOMETRY_PRESETS[preset])
    shapes["dit"] = dataclasses.replace(shapes["dit"], control_type=MODELS[model])
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    say = say or (lambda line: None)

    def put(name: str, part: str, write: Callable[[Path], Path]) -> None:
        target, temporary = out / name, partial_name(out / name)
        share = part_bytes(part, preset, layout, model) // (2 if part == "experts" else 1)
        made_on = f", made on {device}" if part in ("experts", MODEL_PART["fast"]) else ""
        say(f"{name}: writing, up to {human_bytes(share)}{made_on}")
        started = time.perf_counter()
        remove(temporary)
        try:
            write(temporary)
            install(temporary, target)
        except BaseException:
            remove(temporary)
            raise
        say(f"{name}: done in {duration(time.perf_counter() - started)}")
        written.append(target)

    write_dit = write_synthetic_nf4_expert if layout == "nf4" else write_synthetic_bf16_expert
    if MODEL_PART["fast"] in parts:
        name = expert_folder(FAST, layout)
        put(name, MODEL_PART["fast"],
            lambda path: write_dit(path, shapes["dit"], seed=seed + FAST_SEED_OFFSET, device=device,
                                   config_fields=fast_config_fields(shapes["dit"]), on_part=_PartProgress(name, say)))
    if "experts" in parts:
        for offset, role in enumerate(BASE_ROLES):  # high- and low-noise differ by seed
            folder = expert_folder(role, layout)
            put(folder, "experts", lambda path, offset=offset, folder=folder: write_dit(
                path, shapes["dit"], seed=seed + offset, device=device, on_part=_PartProgress(folder, say)))
    if "t5" in parts:
        put(T5_FILE, "t5", lambda path: write_t5_checkpoint(path, shapes["t5"], seed=seed + 2))
    if "comfy_t5" in parts:  # the same weights as the t5 part (same seed), ComfyUI's layout
        put(COMFY_T5_FILES[comfy_t5], "comfy_t5",
            lambda path: write_comfy_t5(path, shapes["t5"], seed=seed + 2, fmt=comfy_t5))
    if "vae" in parts:
        put(VAE_FILE, "vae", lambda path: write_vae_checkpoint(path, shapes["vae"], seed=seed + 3))
    if "tokenizer" in parts:
        put(TOKENIZER_FOLDER, "tokenizer", lambda path: write_tokenizer(path, vocab_size=shapes["t5"].vocab_size))
    return written


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cli.out_outside(args.out, "--out")
    room_at = cli.output_folder(args.out, "--out", make_parents=True)  # not a file; writable where it is made
    taken = [p.name + ("/" if p.is_dir() else "") for p in part_targets(args.out, args.layout, args.parts, args.comfy_t5)
             if p.exists() or p.is_symlink()]
    if taken and not args.overwrite:
        raise cli.UsageError("--out", f"{args.out} already holds {', '.join(taken)}; pass --overwrite to replace "
                                      f"{'it' if len(taken) == 1 else 'them'}, or choose another --out")
    cli.check_room(room_at, sum(part_bytes(part, args.preset, args.layout, args.model) for part in args.parts),
                   "--out")
    start = time.perf_counter()
    try:
        written = write_package(args.out, args.preset, args.layout, args.seed, args.device, args.parts,
                                args.comfy_t5, args.model, args.overwrite, say=lambda line: print(line, flush=True))
    except OSError as exc:  # a disk that filled up or turned read-only while writing: it is --out's
        print(f"make_checkpoint: error: --out: writing into {args.out} failed ({exc}); the part being written "
              "was removed, the parts before it are in place", file=sys.stderr)
        return 1
    except (ValueError, RuntimeError) as exc:
        print(f"make_checkpoint: failed: {exc}", file=sys.stderr)
        return 1
    print(f"{args.preset} {args.model} package, layout {args.layout}, seed {args.seed}, in {args.out} "
          f"({time.perf_counter() - start:.1f} s):")
    for path in written:
        files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        for f in files:
            print(f"  {human_bytes(f.stat().st_size):>9}  {f.relative_to(args.out)}")
    print(f"  {human_bytes(sum(tree_bytes(p) for p in written)):>9}  total")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run("make_checkpoint", main))
