"""What the command-line tools share: one-line answers to user mistakes, defaults in --help,
and arguments checked before any model loads. (bitsandbytes' start-up advice is dropped where
the pack imports it: wan/runtime/bnb.py.)"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Callable, NoReturn, Sequence

from PIL import Image

from ..loaders.image_file import Note
from ..loaders.image_file import open_image as open_picture

from ..loaders.errors import CheckpointError
from ..loaders.layout import CONFIG_FILE, detect_expert_layout


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
        if (default is None or default is False or default == argparse.SUPPRESS or "%(default)" in text
                or len(str(default)) > 40 or (not isinstance(default, (int, float)) and not default)):
            return text  # (an empty list or text: no "(default: )")
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
    """``path`` must be a file; ``what`` names it with its noun ("prompt file")."""
    if not path.exists():
        raise UsageError(flag, f"{what} {path} does not exist")
    if not path.is_file():
        raise UsageError(flag, f"{path} is a folder; give the {what}")
    return path


def existing_dir(path: Path, flag: str, what: str) -> Path:
    """``path`` must be a folder; ``what`` names it with its noun ("package folder")."""
    if not path.exists():
        raise UsageError(flag, f"{what} {path} does not exist")
    if not path.is_dir():
        raise UsageError(flag, f"{path} is a file; give the {what}")
    return path


def out_outside(out: Path, flag: str, source: Path | None = None, source_flag: str = "--src") -> None:
    """Refuse an output folder that would write into what the tools read: the ``source``
    folder (a release being converted) or anything inside it, and any expert folder (a
    folder the loaders read as one: config.json and weights) or a folder inside one. Links
    are resolved; the message names both paths."""
    target = out.resolve()
    if source is not None and target.is_relative_to(source.resolve()):
        where = "is" if target == source.resolve() else "is inside"
        raise UsageError(flag, f"{out} {where} the folder {source_flag} {source} it reads: the tool would write into "
                         f"the release's own folders; choose an {flag} outside {source}")
    for folder in (target, *target.parents):
        if (folder / CONFIG_FILE).is_file():
            try:
                detect_expert_layout(folder)
            except CheckpointError:
                continue
            where = "is" if folder == target else "is inside"
            raise UsageError(flag, f"{out} {where} the expert folder {folder}: the tool would write into its "
                             f"files; choose an {flag} outside it (a package folder holds expert folders)")


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


def open_image(path: Path, flag: str, note: Note) -> Image.Image:
    """The picture at ``path``, upright as ComfyUI's Load Image shows it (loaders/image_file.py);
    ``note`` receives what a person should know about it."""
    existing_file(path, flag, "image file")
    try:
        return open_picture(path, note)
    except ValueError as exc:
        raise UsageError(flag, str(exc)) from None


def output_file(path: Path, flag: str, suffix: str, overwrite: bool) -> Path:
    """Check an output path before any work: right suffix, folder exists and is writable,
    and an existing file is only replaced when the user said so."""
    if path.suffix.lower() != suffix:
        raise UsageError(flag, f"{path} must end in {suffix}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(flag, f"folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(flag, f"folder {folder} is not writable; choose another {flag}")
    if path.is_dir():
        raise UsageError(flag, f"{path} is a folder; give a file name ending in {suffix}")
    if path.exists() and not overwrite:
        raise UsageError(flag, f"{path} exists; pass --overwrite to replace it, or choose another name")
    return path


def tree_bytes(path: Path) -> int:
    """Bytes of a file, or of every file below a folder."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def human_bytes(n: float) -> str:
    """A size as a person reads it: GB from 0.1 GB on, else MB."""
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def duration(seconds: float) -> str:
    """A duration as 1h02m or 3m05s."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def output_folder(out: Path, flag: str, make_parents: bool = False) -> Path:
    """A folder a tool writes into (created later when missing), checked now: not a file, and
    the folder it will be made in (its parent, or with ``make_parents`` the nearest folder above
    it) exists and is writable. Returns that existing folder, where the disk's room is measured."""
    if out.exists() and not out.is_dir():
        raise UsageError(flag, f"{out} is a file; give the package folder to write into")
    if out.exists():
        parent = out
    elif make_parents:
        parent = next(p for p in out.parents if p.exists())  # a relative path ends at "."
        if not parent.is_dir():
            raise UsageError(flag, f"{parent} (above {out}) is a file; give a folder to write into")
    else:
        parent = out.parent
        if not parent.is_dir():
            raise UsageError(flag, f"folder {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):  # also False on a read-only file system
        raise UsageError(flag, f"folder {parent} is not writable; choose another {flag}")
    return parent


def check_room(folder: Path, needed: int, flag: str) -> None:
    """Refuse now, naming ``flag``, when the disk of ``folder`` has less than ``needed`` bytes free."""
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise UsageError(flag, f"needs up to {human_bytes(needed)} and {folder} has {human_bytes(free)} free; "
                               f"make room or choose another {flag}")


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
