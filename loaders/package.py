"""Find the files of a LingBot-World package (layout A or B, docs/conventions.md#checkpoint-layouts) under one
root folder."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError, preview

# Expert folders, NF4 (layout A) first: when both are there the NF4 copy is the one that fits.
HIGH_NOISE_FOLDERS = ("high_noise_model_bnb_nf4", "high_noise_model")
LOW_NOISE_FOLDERS = ("low_noise_model_bnb_nf4", "low_noise_model")
# LingBot-World Fast's one transformer (the official README puts it inside the Base-Cam folder).
FAST_FOLDERS = ("lingbot_world_fast_bnb_nf4", "lingbot_world_fast")
T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
VAE_FILE = "Wan2.1_VAE.pth"
TOKENIZER_FOLDER = "tokenizer"


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

    high = _first_folder(root, HIGH_NOISE_FOLDERS)
    low = _first_folder(root, LOW_NOISE_FOLDERS)
    t5, vae, tokenizer = root / T5_FILE, root / VAE_FILE, root / TOKENIZER_FOLDER
    missing = []
    if high is None:
        missing.append(f"high-noise expert folder ({' or '.join(n + '/' for n in HIGH_NOISE_FOLDERS)})")
    if low is None:
        missing.append(f"low-noise expert folder ({' or '.join(n + '/' for n in LOW_NOISE_FOLDERS)})")
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
