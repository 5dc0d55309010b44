"""The experts and shared files of an official bf16 release folder, and which model each
expert is (docs/conventions.md#checkpoint-layouts, #lingbot-world-fast, #act-checkpoint).

Base-Cam and Act: ``high_noise_model/`` and ``low_noise_model/`` (bf16 shards) beside the
T5, the VAE and the tokenizer. Fast: one transformer, ``lingbot_world_fast/``, inside the
Base-Cam folder as the official README places it, or downloaded on its own. All three have
Base's shapes, so the files tell them apart: Fast by its config.json (WanModelFast's fields
``local_attn_size`` and ``sink_size``), Act by the camera layer's shape (read with the
weights, ``loaders/nf4_convert.py``). Where the files cannot tell, the folder name decides
and the expert says so in ``note``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError, preview
from .layout import CONFIG_FILE, LAYOUTS, NF4_META_FILE, detect_expert_layout
from .model_kind import FAST_FIELDS, identify_model
from .package import BASE_ROLES, FAST, T5_FILE, TOKENIZER_FOLDER, VAE_FILE, expert_folder

# The experts' roles, in the order they are converted; a release holds each in its bf16 folder.
ROLES = (*BASE_ROLES, FAST)
SHARED_FILES = (T5_FILE, VAE_FILE, TOKENIZER_FOLDER)


@dataclass(frozen=True)
class ReleaseExpert:
    folder: Path  # a bf16 expert folder (layout B)
    role: str  # "high_noise_model", "low_noise_model" or "lingbot_world_fast"
    note: str = ""  # how the role was decided when config.json did not say


@dataclass(frozen=True)
class Release:
    root: Path
    experts: tuple[ReleaseExpert, ...]
    shared: tuple[Path, ...]  # T5, VAE and tokenizer, those that are there
    missing_shared: tuple[str, ...]  # those that are not (none are looked for beside a lone expert)


def _expert(folder: Path, role: str | None) -> ReleaseExpert:
    """The expert in ``folder``, bf16 only, its role from config.json and ``role`` (the name
    it was found under, None when the folder was given on its own)."""
    layout = LAYOUTS[detect_expert_layout(folder)]
    if layout.stored_kind != "bf16":
        raise CheckpointError(folder, f"is already an {layout.name.upper()} expert (quantized); nothing to convert")
    # The config decides when it says Fast (model_kind, as the Fast DiT Loader reads it);
    # otherwise the name the expert was found under.
    identity = identify_model(folder)
    name = role or folder.name
    if identity.by_config == "fast" and name in BASE_ROLES:
        raise CheckpointError(folder / CONFIG_FILE,
                              f"is LingBot-World Fast's ({identity.config_evidence}), but the folder is {name}/, a Base "
                              f"expert's place; put the Fast transformer in {FAST}/ (or alone), and the Base "
                              "experts' own files here")
    if identity.by_config == "fast":
        return ReleaseExpert(folder, FAST)
    if name in BASE_ROLES:
        return ReleaseExpert(folder, name)
    if name == FAST:
        return ReleaseExpert(folder, FAST, note=f"config.json does not say Fast ({identity.evidence}); "
                                                f"taken as LingBot-World Fast by its folder name {FAST}/")
    raise CheckpointError(folder, f"holds a bf16 expert, but neither its name nor its config.json says which: "
                                  f"{' or '.join(BASE_ROLES)} (Base-Cam, Act) or LingBot-World Fast "
                                  f"(config.json with {', '.join(FAST_FIELDS)}); give the release folder "
                                  "that holds it, or rename it to its official name")


def _is_expert_folder(folder: Path) -> bool:
    names = {p.name for p in folder.iterdir() if p.is_file()}
    # An NF4 folder missing its weights is still one (its own error says what is missing).
    return NF4_META_FILE in names or any(layout.present(names) for layout in LAYOUTS.values())


def find_release(src: str | Path) -> Release:
    """The bf16 experts under ``src`` (a release folder, or one expert folder) and the shared
    files beside them; CheckpointError for anything else, naming what was found."""
    src = Path(src)
    if not src.is_dir():
        raise CheckpointError(src, "is not a folder; give the release folder (lingbot-world-base-cam/ or the like)")
    if _is_expert_folder(src):
        return Release(src, (_expert(src, None),), (), ())
    folders = {role: expert_folder(role, "bf16") for role in ROLES}
    experts = [_expert(src / name, role) for role, name in folders.items() if (src / name).is_dir()]
    base = [e.role for e in experts if e.role in BASE_ROLES]
    if len(base) == 1:
        other = next(r for r in BASE_ROLES if r != base[0])
        raise CheckpointError(src, f"holds {base[0]}/ but not {other}/: a Base-Cam or Act release has both experts; "
                                   "the download is incomplete")
    if not experts:
        found = sorted(p.name + ("/" if p.is_dir() else "") for p in src.iterdir())
        quantized = {name: layout for role in ROLES for layout in LAYOUTS
                     if (name := expert_folder(role, layout)) != folders[role] and (src / name).is_dir()}
        hint = (f"; {', '.join(quantized)} are already quantized ({', '.join(sorted(set(quantized.values())))})"
                if quantized else "")
        wanted = ", ".join(name + "/" for name in folders.values())
        raise CheckpointError(src, f"holds no bf16 expert folder ({wanted}), found "
                                   f"{preview(found, limit=8) if found else 'nothing'}{hint}")
    shared = tuple(src / name for name in SHARED_FILES if (src / name).exists())
    missing = tuple(name for name in SHARED_FILES if not (src / name).exists())
    return Release(src, tuple(experts), shared, missing)
