"""Which LingBot-World transformer a folder holds: LingBot-World Fast or a Base expert.

The Fast transformer has a Base expert's shapes and tensor names, so the weights cannot
tell them apart; what the files say can (docs/conventions.md#lingbot-world-fast):

1. config.json (decides when it speaks). diffusers writes the class that saved the model
   as ``_class_name`` and the class's init fields: ``WanModelFast`` for the official Fast
   release, with ``local_attn_size`` and ``sink_size`` among its fields (a Base expert's
   ``WanModel`` has neither); ``WanModel`` for a Base expert.
2. The folder's name: the official README puts Fast in ``lingbot_world_fast/`` inside the
   Base-Cam folder (the package tool's NF4 copy is ``lingbot_world_fast_bnb_nf4/``); Base
   experts sit in ``high_noise_model*`` / ``low_noise_model*``.

When config.json and the name disagree, config.json decides (a renamed folder does not
change the weights) and the evidence says so. Neither: "unknown", and the caller loads it as
the model its node is for, saying so.

A config.json in diffusers' own naming (``in_channels``, ``num_attention_heads``: the
diffusers-layout copies such as ``robbyant/lingbot-world-fast-diffusers``) describes tensors
stored under other names than the official ones, which this pack does not read.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from ..wan.config import A14B, DiTConfig
from .errors import CheckpointError
from .json_file import read_json_object
from .layout import CONFIG_FILE
from .package import BASE_ROLES, FAST

ModelKind = Literal["fast", "base", "unknown"]

FAST_CLASS = "WanModelFast"  # wan/modules/model_fast.py upstream
BASE_CLASS = "WanModel"
# Init fields of the Fast class that diffusers writes into config.json (upstream defaults:
# the full cache). A Base expert's config has neither.
FAST_FIELDS = {"local_attn_size": -1, "sink_size": 0}
# Field names of diffusers' Wan transformer configs, never of the official ones.
DIFFUSERS_FIELDS = ("in_channels", "num_attention_heads", "attention_head_dim")
# What the official Fast config.json holds besides `_class_name` (the upstream class's
# register_to_config fields; patch_size, qk_norm, cross_attn_norm and text_dim are in its
# ignore_for_config, so a reader fills them with the A14B values).
_FAST_OFFICIAL_FIELDS = ("model_type", "control_type", "text_len", "in_dim", "dim", "ffn_dim", "freq_dim",
                         "out_dim", "num_heads", "num_layers", "local_attn_size", "sink_size", "eps")

NAMES = {"fast": "LingBot-World Fast", "base": "a LingBot-World Base expert"}
LOADERS = {"fast": "LingBot-World Fast DiT Loader", "base": "LingBot-World NF4 DiT Loader (also bf16)"}


@dataclass(frozen=True)
class ModelIdentity:
    folder: Path
    kind: ModelKind
    evidence: str  # what the files say, for messages
    diffusers_layout: bool = False  # tensors under diffusers' names (not readable here)
    by_config: ModelKind = "unknown"  # what config.json alone says (the folder name aside)
    config_evidence: str = ""  # what config.json holds that told it


def _folder_kind(name: str) -> ModelKind:
    name = name.lower()
    if name.startswith(FAST):
        return "fast"
    if name.startswith(BASE_ROLES):
        return "base"
    return "unknown"


def _config_kind(data: Mapping[str, Any]) -> tuple[ModelKind, str]:
    class_name = data.get("_class_name")
    fields = [f for f in FAST_FIELDS if f in data]
    said = []
    if isinstance(class_name, str):
        said.append(f"_class_name {class_name!r}")
    if fields:
        said.append(f"has {' and '.join(fields)}")
    if class_name == FAST_CLASS or fields or (isinstance(class_name, str) and "causal" in class_name.lower()):
        return "fast", ", ".join(said)
    if class_name == BASE_CLASS:
        return "base", f"{said[0]}, no {' or '.join(FAST_FIELDS)}"
    return "unknown", ", ".join(said) or f"no _class_name, {' or '.join(FAST_FIELDS)}"


def identify_model(folder: str | Path) -> ModelIdentity:
    """What ``folder``'s config.json and name say it holds (see the module docstring).

    CheckpointError when config.json is missing or unreadable."""
    folder = Path(folder)
    data = read_json_object(folder / CONFIG_FILE, "every transformer folder needs its config.json")
    by_config, said = _config_kind(data)
    by_name = _folder_kind(folder.name)
    diffusers = [f for f in DIFFUSERS_FIELDS if f in data]
    config_text = f"{CONFIG_FILE}: {said}"
    if by_config != "unknown":
        kind, evidence = by_config, config_text
        if by_name not in ("unknown", by_config):
            evidence += f" (the folder name {folder.name!r} suggests the other model; {CONFIG_FILE} decides)"
    elif by_name != "unknown":
        kind, evidence = by_name, f"the folder name {folder.name!r} ({config_text})"
    else:
        kind, evidence = "unknown", f"{config_text}; the folder name {folder.name!r} says nothing either"
    if diffusers:
        evidence += f"; {CONFIG_FILE} uses diffusers' field names ({', '.join(diffusers)})"
    return ModelIdentity(folder, kind, evidence, diffusers_layout=bool(diffusers), by_config=by_config,
                         config_evidence=said)


def require_model(folder: str | Path, wanted: Literal["fast", "base"], field: str) -> ModelIdentity:
    """The folder's identity, after refusing the other model or a diffusers-layout copy.

    "unknown" passes: the caller loads it as ``wanted`` and says so (``assumed_message``).
    CheckpointError naming the folder, the input ``field`` and the evidence otherwise."""
    identity = identify_model(folder)
    if identity.diffusers_layout:
        raise CheckpointError(identity.folder, (
            f"{field}: this is a diffusers-layout copy ({identity.evidence}): its tensors are stored under "
            "diffusers' names, which this pack does not read. Use the official folder instead: "
            "robbyant/lingbot-world-fast for Fast (lingbot_world_fast/), or the Base-Cam experts"))
    other = "base" if wanted == "fast" else "fast"
    if identity.kind == other:
        raise CheckpointError(identity.folder, (
            f"{field}: holds {NAMES[other]}, not {NAMES[wanted]} ({identity.evidence}); load this folder with "
            f"the {LOADERS[other]}"))
    return identity


def assumed_message(identity: ModelIdentity, wanted: Literal["fast", "base"], field: str) -> str:
    """The line said when the files cannot tell: which model the folder is loaded as."""
    return (f"{field}: the files of {identity.folder} do not say which model they hold ({identity.evidence}); "
            f"loading them as {NAMES[wanted]}")


def describe(identity: ModelIdentity) -> str:
    """One line on what the folder was recognised as, and why."""
    if identity.kind == "unknown":
        return f"{identity.folder.name}: not told by its files ({identity.evidence})"
    return f"{identity.folder.name}: {NAMES[identity.kind]} ({identity.evidence})"


def config_fields(folder: str | Path) -> dict[str, Any]:
    """config.json of ``folder`` as stored (for a copy in another layout that must keep the
    evidence above, e.g. an NF4 package of the Fast transformer)."""
    return read_json_object(Path(folder) / CONFIG_FILE, "every transformer folder needs its config.json")


def fast_config_fields(config: DiTConfig) -> dict[str, Any]:
    """The config.json of the official Fast release for a transformer of ``config``: its
    class, the Fast fields at their upstream defaults and the geometry fields the official
    file holds; a field the official file leaves out is written only where ``config``
    differs from A14B (a reader fills the missing ones with A14B's, e.g. the tiny text_dim)."""
    geometry = config.to_dict()
    data: dict[str, Any] = {"_class_name": FAST_CLASS}
    for name in _FAST_OFFICIAL_FIELDS:
        if name in FAST_FIELDS:
            data[name] = FAST_FIELDS[name]
        elif name == "control_type":
            data[name] = config.control_type
        else:
            data[name] = geometry[name]
    base = A14B.to_dict()
    for name, value in geometry.items():
        if name not in data and value != base[name]:
            data[name] = value
    return data


__all__ = ["BASE_CLASS", "FAST_CLASS", "FAST_FIELDS", "ModelIdentity",
           "ModelKind", "assumed_message", "config_fields", "describe", "fast_config_fields", "identify_model",
           "require_model"]
