"""Find the files of a LingBot-World package (docs/conventions.md#checkpoint-layouts) under one
root folder.

A package names each expert's folder by its role (``high_noise_model``, ``low_noise_model``;
``lingbot_world_fast``) and its layout's ``folder_suffix`` (``loaders/layout.py`` ``LAYOUTS``):
``high_noise_model_bnb_nf4/`` (NF4), ``high_noise_model_fp8/`` (fp8), ``high_noise_model/``
(bf16, the official release's name). A new layout's row names its folders here too.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError, preview
from .layout import LAYOUTS

# The official folder names of the experts' roles (the bf16 release's).
HIGH_NOISE = "high_noise_model"
LOW_NOISE = "low_noise_model"
BASE_ROLES = (HIGH_NOISE, LOW_NOISE)
# LingBot-World Fast's one transformer (the official README puts it inside the Base-Cam folder).
FAST = "lingbot_world_fast"
T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
VAE_FILE = "Wan2.1_VAE.pth"
TOKENIZER_FOLDER = "tokenizer"


def expert_folder(role: str, layout: str) -> str:
    """The folder a package holds ``role``'s expert in when stored as ``layout``."""
    return role + LAYOUTS[layout].folder_suffix


def expert_folders(role: str) -> tuple[str, ...]:
    """Every folder name ``role``'s expert may have, in ``LAYOUTS``' order: the smallest first,
    which is the one a package that holds several is read from."""
    return tuple(expert_folder(role, layout) for layout in LAYOUTS)


@dataclass(frozen=True)
class PackagePaths:
    high: Path  # high-noise expert folder
    low: Path  # low-noise expert folder
    t5: Path  # umT5-XXL encoder state dict (.pth)
    vae: Path  # Wan2.1 VAE state dict (.pth)
    tokenizer: Path  # google/umt5-xxl tokenizer folder


def _first_folder(root: Path, names: tuple[str, ...]) -> Path | None:
    for name in names:
        if (root / name).is_dir():
            return root / name
    return None


def find_package(root: str | Path) -> PackagePaths:
    """Paths of both experts, T5, VAE and tokenizer; CheckpointError listing whatever is missing.

    Only presence is checked here; each loader validates the content of its own files.
    """
    root = Path(root)
    if not root.exists():
        raise CheckpointError(root, "package folder does not exist")
    if not root.is_dir():
        raise CheckpointError(root, f"is a file; pass the package folder that holds it ({root.parent})")
    names = {p.name for p in root.iterdir() if p.is_file()}
    layout = next((row.name for row in LAYOUTS.values() if row.present(names)), None)
    if layout is not None:
        raise CheckpointError(root, f"is the folder of one expert ({layout}); give the package folder above it "
                                    f"({root.parent}), which holds both experts, the text encoder, the VAE and the "
                                    "tokenizer")

    high = _first_folder(root, expert_folders(HIGH_NOISE))
    low = _first_folder(root, expert_folders(LOW_NOISE))
    t5, vae, tokenizer = root / T5_FILE, root / VAE_FILE, root / TOKENIZER_FOLDER
    missing = []
    for role, folder, what in ((HIGH_NOISE, high, "high-noise"), (LOW_NOISE, low, "low-noise")):
        if folder is None:
            options = [name + "/" for name in expert_folders(role)]
            missing.append(f"{what} expert folder ({', '.join(options[:-1])} or {options[-1]})")
    if not t5.is_file():
        missing.append(f"text encoder {T5_FILE}")
    if not vae.is_file():
        missing.append(f"VAE {VAE_FILE}")
    if not tokenizer.is_dir() or not any(tokenizer.iterdir()):
        missing.append(f"tokenizer folder {TOKENIZER_FOLDER}/ (google/umt5-xxl tokenizer files)")
    if missing:
        found = [p.name + ("/" if p.is_dir() else "") for p in root.iterdir()]
        raise CheckpointError(
            root,
            "is not a complete LingBot-World package; missing: " + "; ".join(missing)
            + f". Found: {preview(found, limit=8) if found else 'nothing (the folder is empty)'}",
        )
    assert high is not None and low is not None
    return PackagePaths(high=high, low=low, t5=t5, vae=vae, tokenizer=tokenizer)
