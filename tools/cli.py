"""What the command-line tools share: one-line answers to user mistakes, defaults in --help,
and arguments checked before any model loads. (bitsandbytes' start-up advice is dropped where
the pack imports it: wan/runtime/bnb.py.)"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, NoReturn, Sequence

from PIL import Image, UnidentifiedImageError


class UsageError(Exception):
    """A mistake in the command line: printed as one line naming the flag and the fix."""

    def __init__(self, flag: str, problem: str) -> None:
        super().__init__(f"{flag}: {problem}" if flag else problem)
        self.flag = flag


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the module docstring's layout and shows each option's default, where it has a
    short one (a long default, such as the negative prompt, is described in its help)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if default is None or default is False or default == argparse.SUPPRESS or "%(default)" in text or len(str(default)) > 40:
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (tuple, list)) else default
        return f"{text} (default: {shown})"


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a parse error raises UsageError (one line) instead of printing usage."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(**kwargs)

    def error(self, message: str) -> NoReturn:
        # argparse words its errors as "argument --x: problem"; keep the flag, drop the prefix.
        if message.startswith("argument "):
            flag, _, problem = message[len("argument "):].partition(": ")
            raise UsageError(flag.split("/")[0], problem + f" (see {self.prog} --help)")
        raise UsageError("", message + f" (see {self.prog} --help)")


def device(text: str, flag: str) -> str:
    """A --device value checked now, not when the first model loads: auto, cpu, cuda or
    cuda:N, where a CUDA choice needs a CUDA GPU that torch can see."""
    import torch

    choice = text.strip().lower()
    if choice in ("auto", "cpu"):
        return choice
    kind, _, index = choice.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise UsageError(flag, f"{text!r} is not a device; use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise UsageError(flag, f"{text} asked, but torch sees no CUDA GPU here; use --device cpu (or auto)")
    count = torch.cuda.device_count()
    if index and int(index) >= count:
        raise UsageError(flag, f"{text} asked, but torch sees {count} CUDA GPU(s): cuda:0 to cuda:{count - 1}")
    return choice


def existing_file(path: Path, flag: str, what: str) -> Path:
    if not path.exists():
        raise UsageError(flag, f"{what} {path} does not exist")
    if not path.is_file():
        raise UsageError(flag, f"{path} is a folder; give the {what} file")
    return path


def existing_dir(path: Path, flag: str, what: str) -> Path:
    if not path.exists():
        raise UsageError(flag, f"{what} {path} does not exist")
    if not path.is_dir():
        raise UsageError(flag, f"{path} is a file; give the {what} folder")
    return path


def cache_dir(path: Path | None, flag: str) -> Path | None:
    """A cache folder checked now: a folder (created later when missing), not a file, and
    writable where it exists."""
    if path is None:
        return None
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        what = f"{path} is a file" if existing == path else f"{existing} (inside {path}) is a file"
        raise UsageError(flag, f"{what}; give a folder for the cache (it is created when missing)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(flag, f"folder {existing} is not writable; choose another {flag}")
    return path


def switches() -> None:
    """Every ``LINGBOT_*`` environment switch read now (wan/runtime/switches.py): a value one
    does not take answers in one line naming it, before any model loads."""
    from ..wan.runtime import switches as process_switches

    try:
        process_switches.check()
    except ValueError as exc:
        raise UsageError("", str(exc)) from None


def attention(name: str, device: str, flag: str) -> str:
    """An --attention choice decided now on ``device`` (``wan.runtime.attention.decide``: for
    auto, LINGBOT_ATTENTION when set) and its kernel run once (a tiny call, the experts' head
    size), so a kernel that cannot run here (not installed, no CUDA, built for another GPU or
    torch) answers in one line before any model loads, not at the first sampling step."""
    import torch

    from ..pipeline.memory import resolve_device
    from ..wan.runtime import attention as attn
    from ..wan.runtime.switches import ATTENTION

    where = resolve_device(device)
    env = ATTENTION.name if name == "auto" and ATTENTION() is not None else None  # auto is what it says
    try:
        picked = attn.decide(name, where)
    except ValueError as exc:  # it names the choice or the variable, and what runs here
        raise UsageError("" if env else flag, str(exc)) from None
    if picked == "sdpa":
        return name
    try:
        q = torch.randn(1, 16, 2, 128, device=where, dtype=torch.bfloat16)
        with attn.attention_backend(picked):
            out = attn.attention(q, q, q)
        if where.type == "cuda":
            torch.cuda.synchronize(where)
        if not bool(torch.isfinite(out).all()):
            raise RuntimeError("it returned NaN or infinite values")
    except Exception as exc:  # noqa: BLE001 - whatever the kernel raises, the answer is the same
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if env:
            raise UsageError("", f"{env}={picked} cannot run here: {reason} (on {where}); unset {env} or set it "
                                 "to sdpa") from None
        raise UsageError(flag, f"attention {picked!r} cannot run here: {reason} (on {where}); use --attention "
                               "sdpa") from None
    return name


def open_image(path: Path, flag: str) -> Image.Image:
    existing_file(path, flag, "image")
    try:
        image = Image.open(path)
        image.load()
    except (UnidentifiedImageError, OSError) as exc:
        raise UsageError(flag, f"{path} is not an image Pillow can read ({exc})") from None
    return image


def output_file(path: Path, flag: str, suffix: str, overwrite: bool) -> Path:
    """Check an output path before any work: right suffix, folder exists and is writable,
    and an existing file is only replaced when the user said so."""
    if path.suffix.lower() != suffix:
        raise UsageError(flag, f"{path} must end in {suffix}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(flag, f"folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(flag, f"folder {folder} is not writable; choose another --out")
    if path.is_dir():
        raise UsageError(flag, f"{path} is a folder; give a file name ending in {suffix}")
    if path.exists() and not overwrite:
        raise UsageError(flag, f"{path} exists; pass --overwrite to replace it, or choose another name")
    return path


def run(prog: str, main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run a tool's main: user mistakes become one line on stderr (exit 2), no traceback.

    Errors the pack raises for bad inputs (files that are not what they should be, values
    out of range) are user mistakes too; anything else is a bug and keeps its traceback.
    """
    try:
        return main(argv)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # CheckpointError, CameraError: they name the file or field
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
