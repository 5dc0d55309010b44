"""Where the nodes find their files, and how a combo value maps back to a path.

Model combos name a file or folder as ``<kind>/<path inside that kind's folder>``, where
kind is a ComfyUI model folder name: ``lingbot`` (this pack's own ``models/lingbot``),
``text_encoders``, ``vae`` or ``diffusion_models``. The kind prefix keeps names unambiguous
when the same file name exists in two kinds, and a kind may have several roots
(``extra_model_paths.yaml``): the first root holding the path wins, as in ComfyUI.

Camera trajectories (.npy) and pose exports come from ComfyUI's input folder and may not
leave it.
"""
from __future__ import annotations

import heapq
import os
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Iterator

import folder_paths

from ...loaders.errors import CheckpointError
from ...loaders.expert_config import read_expert_config
from ...loaders.layout import BF16_SHARD_PREFIX, CONFIG_FILE, detect_expert_layout
from ...loaders.package import FAST as FAST_FOLDER
from ...loaders.weight_role import WEIGHT_SUFFIXES, weight_role
from ...wan.tokenizer import SENTENCEPIECE_MODEL, TOKENIZER_JSON

LINGBOT_KIND = "lingbot"
T5_KINDS = (LINGBOT_KIND, "text_encoders")
VAE_KINDS = (LINGBOT_KIND, "vae")
TOKENIZER_KINDS = (LINGBOT_KIND, "text_encoders")
EXPERT_KINDS = (LINGBOT_KIND, "diffusion_models")

TOKENIZER_FILES = (TOKENIZER_JSON, SENTENCEPIECE_MODEL)
EXPERT_CONFIG = CONFIG_FILE
# Shards of a bf16 DiT expert, never a T5 or a VAE (even outside a complete expert folder).
EXPERT_WEIGHT_PREFIX = BF16_SHARD_PREFIX
# Model trees can be deep (Hugging Face caches); anything below this is not looked at.
MAX_DEPTH = 6
NO_FILE = "(none)"


def register_model_folder() -> Path:
    """Add ``models/lingbot`` as the ComfyUI model folder kind ``lingbot`` (idempotent).

    A user's extra_model_paths.yaml may already have created the kind with no extensions;
    either way it ends up listing the usual weight extensions in ComfyUI's model browser.
    """
    default = Path(folder_paths.models_dir) / LINGBOT_KIND
    folder_paths.add_model_folder_path(LINGBOT_KIND, str(default), is_default=True)
    paths, extensions = folder_paths.folder_names_and_paths[LINGBOT_KIND]
    folder_paths.folder_names_and_paths[LINGBOT_KIND] = (paths, set(extensions) | set(folder_paths.supported_pt_extensions))
    return default


def kind_roots(kind: str) -> list[Path]:
    """The folders of a ComfyUI model kind, or none when this host does not know the kind."""
    if kind not in folder_paths.folder_names_and_paths:
        return []
    return [Path(p) for p in folder_paths.get_folder_paths(kind)]


def _walk(root: Path) -> Iterator[tuple[Path, list[str], list[str]]]:
    """Like os.walk from ``root`` (following links, skipping hidden folders) down to MAX_DEPTH
    levels; the caller may prune ``dirnames`` as with os.walk.

    Each real folder is visited once: a link back into the tree (models/a/loop -> models)
    would otherwise make the walk exponential in the number of such links. The name it is
    visited under is its own, not a link's: folders reached through fewer links first, and
    a link found higher up before one found lower down, so a folder of links to the
    package's folders (models/lingbot/mirror/high_noise_model -> ../pkg/high_noise_model)
    never hides the package's names, whatever the alphabet says.
    """
    if not root.is_dir():
        return
    seen: set[tuple[int, int]] = set()
    # (links on the way, depth of the last one, order found, folder): links wait their turn here
    entries: list[tuple[int, int, int, Path]] = [(0, 0, 0, root)]
    found = 0
    while entries:
        links, _, _, top = heapq.heappop(entries)
        stack = [top]
        while stack:
            here = stack.pop()
            try:
                stat = os.stat(here)  # follows links: the identity of the real folder
                children = sorted(os.scandir(here), key=lambda entry: entry.name)
            except OSError:
                continue
            if (stat.st_dev, stat.st_ino) in seen:
                continue
            seen.add((stat.st_dev, stat.st_ino))
            depth = len(here.relative_to(root).parts)
            dirnames = [c.name for c in children if _is_folder(c) and not c.name.startswith(".")]
            filenames = [c.name for c in children if not _is_folder(c)]
            if depth >= MAX_DEPTH:
                dirnames = []
            yield here, dirnames, filenames
            for name in reversed(dirnames):  # the stack pops them in name order
                child = here / name
                if child.is_symlink():
                    found += 1
                    heapq.heappush(entries, (links + 1, depth + 1, found, child))
                else:
                    stack.append(child)


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows links
    except OSError:
        return False


def _name(kind: str, root: Path, path: Path) -> str:
    rel = path.relative_to(root).as_posix()
    return kind if rel == "." else f"{kind}/{rel}"


def _preferred_first(names: Iterable[str], hints: tuple[str, ...]) -> list[str]:
    """Sorted names, those whose last part contains a hint first (the likely default)."""
    def key(name: str) -> tuple[bool, str]:
        leaf = name.rsplit("/", 1)[-1].lower()
        return (not any(h in leaf for h in hints), name.lower())

    return sorted(set(names), key=key)


def is_expert_folder(folder: Path) -> bool:
    if not (folder / EXPERT_CONFIG).is_file():
        return False
    try:
        detect_expert_layout(folder)
    except CheckpointError:
        return False
    return True


def _scan(kinds: Iterable[str], visit: Callable[[str, Path, Path, list[str], list[str]], Iterable[str]]) -> list[str]:
    found: list[str] = []
    for kind in kinds:
        for root in kind_roots(kind):
            for here, dirnames, filenames in _walk(root):
                found.extend(visit(kind, root, here, dirnames, filenames))
    return found


def list_weight_files(kinds: Iterable[str], hints: tuple[str, ...]) -> list[str]:
    """.pth / .safetensors files of the given kinds, skipping files inside expert folders."""
    def visit(kind, root, here, dirnames, filenames):
        if EXPERT_CONFIG in filenames and is_expert_folder(here):
            dirnames[:] = []
            return []
        return [
            _name(kind, root, here / f) for f in filenames
            if f.lower().endswith(WEIGHT_SUFFIXES) and not f.startswith(EXPERT_WEIGHT_PREFIX)
        ]

    return _preferred_first(_scan(kinds, visit), hints)


def list_tokenizer_folders(kinds: Iterable[str] = TOKENIZER_KINDS) -> list[str]:
    """Folders that hold a umT5 tokenizer (tokenizer.json or spiece.model)."""
    def visit(kind, root, here, dirnames, filenames):
        return [_name(kind, root, here)] if any(f in filenames for f in TOKENIZER_FILES) else []

    return _preferred_first(_scan(kinds, visit), ("tokenizer",))


def list_expert_folders(kinds: Iterable[str] = EXPERT_KINDS, hints: tuple[str, ...] = ()) -> list[str]:
    """Folders that hold a DiT expert (or the Fast transformer) of any layout (loaders/layout.py LAYOUTS);
    those whose name holds one of ``hints`` first."""
    def visit(kind, root, here, dirnames, filenames):
        if EXPERT_CONFIG in filenames and is_expert_folder(here):
            dirnames[:] = []  # an expert folder holds no further experts
            return [_name(kind, root, here)]
        return []

    return _preferred_first(_scan(kinds, visit), hints)


def list_fast_folders() -> list[str]:
    """The Fast DiT Loader's list: every transformer folder, those named as the official Fast
    release first (a Base expert given to it is refused with what its files say)."""
    return list_expert_folders(EXPERT_KINDS, (FAST_FOLDER,))


# --------------------------------------------------------------------------- T5 or VAE?


def _of_role(names: list[str], unwanted: str) -> list[str]:
    """Drop the files known to be the other model (a VAE in the T5 list and the reverse),
    judged by ``loaders.weight_role`` from the files' tensor names."""
    kept = []
    for name in names:
        kind, rel = _split(name, "file")
        path = next((r.joinpath(*rel.parts) for r in kind_roots(kind) if r.joinpath(*rel.parts).is_file()), None)
        if path is None or weight_role(path) != unwanted:
            kept.append(name)
    return kept


def list_t5_files() -> list[str]:
    return _of_role(list_weight_files(T5_KINDS, ("t5",)), "vae")


def list_vae_files() -> list[str]:
    return _of_role(list_weight_files(VAE_KINDS, ("vae",)), "t5")


def _leaf(name: str) -> str:
    return name.rsplit("/", 1)[-1].lower()


def default_expert_pair(folders: list[str], control_of: Callable[[str], str | None] | None = None,
                        wanted: str = "cam") -> tuple[str | None, str | None]:
    """The DiT Loader's defaults: a high_noise folder and the low_noise folder of the same package.

    A high_noise folder whose low_noise twin (same parent, same name otherwise) is listed
    wins; without twins, any high_noise and low_noise folders; else the first folder. With
    ``control_of`` (a folder's control type, "cam" or "act", None when unreadable), a pair of
    the ``wanted`` control comes first: the camera nodes' defaults (a preset camera) drive
    Base-Cam, so an Act package listed before it (alphabetically) is not the fresh node's pick.
    """
    if not folders:
        return None, None
    by_name = {f.lower(): f for f in folders}
    highs = [f for f in folders if "high_noise" in _leaf(f)]
    twins = []
    for high in highs:
        twin = by_name.get(high.lower()[: len(high) - len(_leaf(high))] + _leaf(high).replace("high_noise", "low_noise"))
        if twin is not None:
            twins.append((high, twin))
    if control_of is not None and len(twins) > 1:
        for high, twin in twins:
            if control_of(high) == wanted:
                return high, twin
    if twins:
        return twins[0]
    lows = [f for f in folders if "low_noise" in _leaf(f)]
    high = highs[0] if highs else folders[0]
    return high, lows[0] if lows else high


def expert_control(name: str) -> str | None:
    """The control type ("cam": Base-Cam, "act": Act) of the expert folder a combo value names,
    read off config.json and the weights' headers (nothing loaded); None when unreadable."""
    try:
        return read_expert_config(resolve_model_path(name, EXPERT_KINDS, "expert", want_dir=True)).control_type
    except (CheckpointError, ValueError, OSError):
        return None


def default_package() -> str | None:
    """The package folder a fresh node's pickers default to, one rule for every picker: the
    folder that holds the DiT Loader's default high-noise expert (Base-Cam first), e.g.
    ``lingbot/lingbot-world-base-cam-nf4``; None without a packaged expert."""
    high, _ = default_expert_pair(list_expert_folders(), expert_control)
    return high.rsplit("/", 1)[0] if high is not None and high.count("/") > 1 else None


def default_in_package(names: list[str]) -> str | None:
    """A fresh picker's default among ``names``: the first inside ``default_package()`` (so
    T5, tokenizer and VAE come from the package whose experts the DiT Loader picks), else the
    first name; None when there is none."""
    package = default_package() if names else None
    inside = [n for n in names if package is not None and n.startswith(package + "/")]
    return (inside or names or [None])[0]


def default_fast_folder(folders: list[str]) -> str | None:
    """The Fast DiT Loader's default: a folder named as the official Fast release
    (``lingbot_world_fast*``; the first in the list's order), else the first folder."""
    fast = [f for f in folders if _leaf(f).startswith(FAST_FOLDER)]
    return (fast or folders or [None])[0]


def _split(name: str, field: str) -> tuple[str, PurePosixPath]:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{field}: no file chosen")
    kind, _, rest = name.replace("\\", "/").partition("/")
    rel = PurePosixPath(rest)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"{field}: {name!r} must be a path inside a model folder, without '..'")
    return kind, rel


def resolve_model_path(name: str, kinds: Iterable[str], field: str, want_dir: bool) -> Path:
    """The file (or folder) a combo value names; ValueError naming the input when absent.

    Symlinks are followed on purpose: model folders are often links to another drive.
    """
    kinds = tuple(kinds)
    kind, rel = _split(name, field)
    if kind not in kinds:
        raise ValueError(f"{field}: {name!r} is not in a {' or '.join(kinds)} model folder")
    roots = kind_roots(kind)
    for root in roots:
        candidate = root.joinpath(*rel.parts)
        if (candidate.is_dir() if want_dir else candidate.is_file()):
            return candidate
    searched = ", ".join(str(r) for r in roots) or f"(ComfyUI has no '{kind}' model folder)"
    what = "folder" if want_dir else "file"
    raise ValueError(f"{field}: {what} {name!r} not found; looked in {searched}")


# --------------------------------------------------------------------------- input folder


def input_root() -> Path:
    return Path(folder_paths.get_input_directory())


def list_input_files(suffix: str) -> list[str]:
    """Files with ``suffix`` in ComfyUI's input folder and its subfolders (posix names)."""
    root = input_root()
    found = [
        (here / f).relative_to(root).as_posix()
        for here, _, filenames in _walk(root)
        for f in filenames
        if f.lower().endswith(suffix)
    ]
    return sorted(found, key=str.lower)


def _resolve_in(root: Path, where: str, name: str, field: str, suffix: str, choose: str) -> Path:
    """The ``suffix`` file a combo value ``name`` names inside ``root`` (``where`` names the
    folder in messages); refuses an empty choice (``choose`` says what to do), anything
    outside ``root``, another suffix and a missing file."""
    if not isinstance(name, str) or not name.strip() or name == NO_FILE:
        raise ValueError(f"{field}: {choose}")
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"{field}: {name!r} is outside {where}")
    if path.suffix.lower() != suffix:
        raise ValueError(f"{field}: {name!r} is not a {suffix} file")
    if not path.is_file():
        raise ValueError(f"{field}: {name!r} not found in {where}")
    return path


def resolve_input_file(name: str, field: str, suffix: str) -> Path:
    """The input-folder file a combo value names; refuses anything outside the input folder."""
    root = input_root().resolve()
    return _resolve_in(root, f"ComfyUI's input folder {root}", name, field, suffix,
                       f"choose a {suffix} file from ComfyUI's input folder")


def list_pose_exports() -> list[str]:
    """Pose exports in ComfyUI's input folder: ViPE output folders (with pose/), folders and
    files named poses.npy, .npz files and .csv camera logs (posix names relative to the input
    folder)."""
    root = input_root()
    found = []
    for here, dirnames, filenames in _walk(root):
        rel = here.relative_to(root).as_posix()
        if rel != "." and ("pose" in dirnames or "poses.npy" in filenames):
            found.append(rel)
        for name in filenames:
            if name.lower().endswith((".npz", ".csv")) or name == "poses.npy":
                found.append(name if rel == "." else f"{rel}/{name}")
    return sorted(found, key=str.lower)


def resolve_pose_export(name: str) -> Path:
    """The input-folder file or folder a pose_export value names (never outside it)."""
    if not isinstance(name, str) or not name.strip() or name == NO_FILE:
        raise ValueError("pose_export: choose a ViPE output folder, an .npz, a poses.npy or a .csv camera log from "
                         "ComfyUI's input folder")
    root = input_root().resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"pose_export: {name!r} is outside ComfyUI's input folder {root}")
    if not path.exists():
        raise ValueError(f"pose_export: {name!r} not found in ComfyUI's input folder {root}")
    return path


# --------------------------------------------------------------------------- output folder: Play logs

PLAY_LOG_SUFFIX = ".json"


def output_root() -> Path:
    return Path(folder_paths.get_output_directory())


def list_play_logs() -> list[str]:
    """The action logs of Play sessions in ComfyUI's output folder: the .json files beside an
    .mp4 of the same name (the Play node saves both), posix names relative to the folder,
    newest first."""
    root = output_root()
    found = []
    for here, _, filenames in _walk(root):
        names = set(filenames)
        for name in filenames:
            if name.lower().endswith(PLAY_LOG_SUFFIX) and name[:-len(PLAY_LOG_SUFFIX)] + ".mp4" in names:
                path = here / name
                try:
                    stamp = path.stat().st_mtime_ns
                except OSError:
                    continue
                found.append((stamp, path.relative_to(root).as_posix()))
    return [name for _, name in sorted(found, key=lambda item: (-item[0], item[1].lower()))]


def resolve_play_log(name: str, field: str = "log") -> Path:
    """The output-folder .json a log combo value names; refuses anything outside the output folder."""
    return _resolve_in(output_root().resolve(), "ComfyUI's output folder", name, field, PLAY_LOG_SUFFIX,
                       "choose the action log of a LingBot-World Play session (the .json beside its video in "
                       "ComfyUI's output folder); run the Play template first")


def file_stamp(path: Path) -> str:
    """Changes whenever the file's content is likely to have changed (for IS_CHANGED)."""
    stat = path.stat()
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
