"""Turn an official bf16 release into the NF4 layout once, so that no load has to quantize.

    python <checkout> quantize --src lingbot-world-base-cam --out lingbot-world-base-cam-nf4 [--device cuda]

--src is a release folder (Base-Cam or Act: high_noise_model/ and low_noise_model/; with
lingbot_world_fast/ inside, as the official README puts LingBot-World Fast, that too) or
one expert folder (the Fast download on its own). --out gets high_noise_model_bnb_nf4/,
low_noise_model_bnb_nf4/ and lingbot_world_fast_bnb_nf4/ (config.json, model.safetensors,
quantization_meta.json: the layout the DiT Loader reads), and the T5, the VAE and the
tokenizer hard-linked (copied when --out is on another filesystem; the release is never
changed). Each expert is read one tensor at a time from its shards and written as it is
quantized, so RAM holds a layer, not the model: 37 GB bf16 -> 9.6 GB NF4 per expert.

--format fp8 writes high_noise_model_fp8/, low_noise_model_fp8/ and lingbot_world_fast_fp8/ instead
(config.json and model_fp8.safetensors: e4m3 weights with one float32 scale per output channel,
loaders/fp8.py): 37 GB bf16 -> ~18.5 GB, for the 8-bit GEMMs of Ada / Hopper cards without a
conversion at every load.

Nothing in --out is replaced unless --overwrite. Every part is written under a hidden
temporary name in --out and renamed when complete: an interrupted run leaves nothing that
looks finished. Every argument is checked before any work; a mistake answers in one line.
"""
from __future__ import annotations

import argparse
import errno
import filecmp
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..loaders.errors import CheckpointError
from ..loaders.fp8 import convert_to_fp8
from ..loaders.new_file import install, partial_name, remove
from ..loaders.nf4_convert import ConversionPlan, Progress, convert_to_nf4, plan_conversion
from ..loaders.package import FAST, expert_folder
from ..loaders.release import Release, ReleaseExpert, find_release
from . import cli
from .cli import duration, human_bytes, tree_bytes

PROGRESS_SECONDS = 5.0  # at most one progress line this often per expert
FORMATS = ("nf4", "fp8")  # rows of loaders.layout.LAYOUTS this tool writes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = cli.ArgumentParser(prog="quantize", description=__doc__)
    p.add_argument("--src", type=Path, required=True,
                   help="the official bf16 release folder (or one expert folder, e.g. lingbot_world_fast/)")
    p.add_argument("--out", type=Path, required=True, help="the NF4 package folder to write into (created if missing)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the experts are quantized: cuda is much faster than the CPU")
    p.add_argument("--format", choices=FORMATS, default="nf4",
                   help="nf4: bitsandbytes 4-bit (~9.6 GB an expert, the default); fp8: e4m3 with per-channel scales "
                   "(~18.5 GB, for the fp8 GEMMs of RTX 40 / H100 and newer)")
    p.add_argument("--overwrite", action="store_true", help="replace what --out already holds of the output")
    return p.parse_args(argv)


@dataclass
class Job:
    release: Release
    plans: list[tuple[ReleaseExpert, ConversionPlan]]
    out: Path
    device: str
    overwrite: bool
    format: str = "nf4"
    notes: list[str] = field(default_factory=list)

    def out_name(self, expert: ReleaseExpert) -> str:
        """The expert's folder in --out: its official name with the layout's suffix."""
        return expert_folder(expert.role, self.format)


def _same_file(a: Path, b: Path) -> bool:
    """``b`` is ``a`` (a hard link) or a copy of it, byte for byte."""
    try:
        return a.samefile(b) or (a.is_file() and b.is_file() and filecmp.cmp(a, b, shallow=False))
    except OSError:
        return False


def _already_there(src: Path, dst: Path) -> bool:
    """``dst`` holds the same file, or a folder of the same files, as ``src``."""
    if not src.is_dir():
        return _same_file(src, dst)
    if not dst.is_dir() or dst.is_symlink():
        return False
    files = sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file())
    return files == sorted(p.relative_to(dst) for p in dst.rglob("*") if p.is_file()) and all(
        _same_file(src / f, dst / f) for f in files)


def check(args: argparse.Namespace) -> Job:
    """Everything that can be checked before work: the release (headers only), the device,
    the output folder, what it already holds and the room on its disk."""
    if not args.src.exists():
        raise cli.UsageError("--src", f"{args.src} does not exist")
    if not args.src.is_dir():
        raise cli.UsageError("--src", f"{args.src} is a file; give the release folder (or one expert folder)")
    try:
        release = find_release(args.src)
        plans = [(expert, plan_conversion(expert.folder)) for expert in release.experts]
    except CheckpointError as exc:
        raise cli.UsageError("--src", str(exc)) from None
    kinds = {plan.model_name for expert, plan in plans if expert.role != FAST}
    if len(kinds) > 1:
        told = ", ".join(f"{expert.role}/ is {plan.model_name}" for expert, plan in plans if expert.role != FAST)
        raise cli.UsageError("--src", f"the two experts are of different models ({told}, told by the shape of "
                                      "patch_embedding_wancamctrl.weight); take both from the same release")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise cli.UsageError("--device", "cuda: no CUDA device is available; use --device cpu")
    out = args.out
    cli.out_outside(out, "--out", args.src)
    room_at = cli.output_folder(out, "--out")
    job = Job(release, plans, out, args.device, args.overwrite, args.format)
    taken = [job.out_name(expert) + "/" for expert, _ in plans if (out / job.out_name(expert)).exists()]
    taken += [path.name for path in release.shared
              if (out / path.name).exists() and not _already_there(path, out / path.name)]
    if taken and not args.overwrite:
        raise cli.UsageError("--out", f"{out} already holds {', '.join(taken)}; pass --overwrite to replace "
                                      f"{'it' if len(taken) == 1 else 'them'}, or choose another --out")
    if out.is_dir():
        job.notes += [f"{p} is left from an interrupted run; delete it" for p in sorted(out.glob(".*.partial-*"))]
    # fp8: one byte a linear weight, about half the bf16 source.
    needed = sum(plan.output_bytes if args.format == "nf4" else plan.source_bytes // 2 + 2**20 for _, plan in plans)
    out_device = room_at.stat().st_dev
    needed += sum(tree_bytes(p) for p in release.shared if p.stat().st_dev != out_device)  # copied, not linked
    cli.check_room(room_at, needed, "--out")
    for expert, _ in plans:
        if expert.note:
            job.notes.append(f"{expert.folder}: {expert.note}")
    return job


# --- doing it -----------------------------------------------------------------------------

class MemoryWatch:
    """Peak resident memory of this process, sampled: anonymous (what must fit in RAM) and
    in all (also the shards' memory-mapped pages, which the kernel can drop and re-read)."""

    def __init__(self, interval: float = 0.05) -> None:
        self.peak_anon = self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)

    @staticmethod
    def sample() -> dict[str, int]:
        try:
            with open("/proc/self/status", encoding="ascii") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            return {name: int(fields[name].split()[0]) * 1024 for name in ("RssAnon", "VmRSS")}
        except (OSError, KeyError, ValueError):  # not Linux
            return {}

    def _run(self, interval: float) -> None:
        while not self._stop.is_set():
            now = self.sample()
            self.peak_anon = max(self.peak_anon, now.get("RssAnon", 0))
            self.peak_rss = max(self.peak_rss, now.get("VmRSS", 0))
            time.sleep(interval)

    def __enter__(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _printer(label: str, estimate: int) -> Callable[[Progress], None]:
    start = time.perf_counter()
    last = [start]

    def show(p: Progress) -> None:
        now = time.perf_counter()
        done = p.tensors_done == p.tensors_total
        if not done and now - last[0] < PROGRESS_SECONDS:
            return
        last[0] = now
        left = (now - start) * (p.read_total - p.read_bytes) / max(p.read_bytes, 1)
        eta = "" if done else f", {duration(left)} left"
        print(f"  {label}: {p.tensors_done}/{p.tensors_total} tensors, {human_bytes(p.written_bytes)} of "
              f"~{human_bytes(estimate)} written{eta}", flush=True)

    return show


def _temporary(out: Path, name: str) -> Path:
    return partial_name(out / name)


_CANNOT_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES}


def _link_or_copy(src: Path, dst: Path) -> str:
    """Hard-link the file (or each file of the folder) ``src`` to ``dst``; copy where the
    filesystem cannot link. Returns "hard-linked" or "copied"."""
    files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
    if src.is_dir():
        dst.mkdir()
    how = "hard-linked"
    for f in files:
        target = dst if src.is_file() else dst / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        if how == "hard-linked":
            try:
                os.link(f, target)
                continue
            except OSError as exc:
                if exc.errno not in _CANNOT_LINK:
                    raise
                how = "copied"
        shutil.copy2(f, target)
    return how


def _shared(job: Job) -> list[str]:
    lines = []
    for path in job.release.shared:
        target = job.out / path.name
        if _already_there(path, target):
            lines.append(f"{path.name}{'/' if path.is_dir() else ''}: already there (the same)")
            continue
        temporary = _temporary(job.out, path.name)
        try:
            how = _link_or_copy(path, temporary)
            install(temporary, target)
        except BaseException:
            remove(temporary)
            raise
        lines.append(f"{path.name}{'/' if path.is_dir() else ''}: {how}"
                     + (" (--out is on another filesystem)" if how == "copied" else ""))
        print(f"  {lines[-1]}", flush=True)
    return lines


def _expert(job: Job, expert: ReleaseExpert, plan: ConversionPlan) -> str:
    label = f"{expert.role} ({'LingBot-World Fast' if expert.role == FAST else plan.model_name})"
    name = job.out_name(expert)
    print(f"{label}: {human_bytes(plan.source_bytes)} bf16 from {expert.folder} -> {job.out / name}/ "
          f"on {job.device}", flush=True)
    start = time.perf_counter()
    temporary = _temporary(job.out, name)
    try:
        if job.format == "fp8":
            show = _printer(expert.role, plan.source_bytes // 2)
            convert_to_fp8(expert.folder, temporary, job.device,
                           lambda done, total: show(Progress(done, total, plan.source_bytes * done // total,
                                                             plan.source_bytes, plan.source_bytes * done // total // 2)))
        else:
            convert_to_nf4(plan, temporary, job.device, _printer(expert.role, plan.output_bytes))
        install(temporary, job.out / name)
    except BaseException:
        remove(temporary)
        raise
    size = tree_bytes(job.out / name)
    return (f"{label}: {human_bytes(plan.source_bytes)} bf16 -> {human_bytes(size)} {job.format.upper()} in {name}/, "
            f"{duration(time.perf_counter() - start)}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    job = check(args)
    for note in job.notes:
        print(f"note: {note}", flush=True)
    if not job.release.shared and job.release.experts[0].folder == job.release.root:
        print("note: --src is one expert folder; the T5, the VAE and the tokenizer come from the Base-Cam release",
              flush=True)
    elif job.release.missing_shared:
        print(f"note: {job.release.root} has no {', '.join(job.release.missing_shared)}; the package will lack them",
              flush=True)
    start = time.perf_counter()
    job.out.mkdir(exist_ok=True)
    try:
        with MemoryWatch() as memory:
            shared = _shared(job)
            experts = [_expert(job, expert, plan) for expert, plan in job.plans]
    except OSError as exc:
        print(f"quantize: failed: {exc}", file=sys.stderr)
        return 1
    print(f"done in {duration(time.perf_counter() - start)}; {job.out}:")
    for line in experts + shared:
        print(f"  {line}")
    if memory.peak_rss:
        print(f"peak RSS {human_bytes(memory.peak_rss)}: {human_bytes(memory.peak_anon)} anonymous, the rest the shards' "
              "memory map (page cache the kernel can drop)")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run("quantize", main))
