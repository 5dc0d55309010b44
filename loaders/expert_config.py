"""What model a DiT expert folder holds, from config.json and its weights' headers alone:
the geometry and the control it reads (Base-Cam's Plücker rays or Act's ray directions +
W/A/S/D keys, told by the shape of patch_embedding_wancamctrl.weight; docs/conventions.md#act-checkpoint).
Nothing is loaded: the nodes and the CLI know which checkpoint they drive before any run."""
from __future__ import annotations

from pathlib import Path

from ..wan.config import CONTROL_NAMES, CONTROL_WEIGHT, DiTConfig
from .errors import CheckpointError
from .layout import layout_of


def read_expert_config(folder: str | Path) -> DiTConfig:
    """The ``DiTConfig`` of an expert folder of any layout, ``control_type`` included."""
    folder = Path(folder)
    return layout_of(folder).read_config(folder)


def read_expert_pair(high: str | Path, low: str | Path,
                     names: tuple[str, str] = ("the high-noise expert", "the low-noise expert")) -> DiTConfig:
    """The config both experts share; CheckpointError naming ``low`` when they are not one
    model (another control type, or another geometry). ``names`` say how messages call them
    (the DiT Loader's widgets, say)."""
    high, low = Path(high), Path(low)
    high_config, low_config = read_expert_config(high), read_expert_config(low)
    if high_config.control_type != low_config.control_type:
        raise CheckpointError(
            low,
            f"{names[1]} is {_a(CONTROL_NAMES[low_config.control_type])} expert ({CONTROL_WEIGHT} takes "
            f"{low_config.camera_in_features} features) but {names[0]} ({high}) is "
            f"{_a(CONTROL_NAMES[high_config.control_type])} expert ({high_config.camera_in_features}); both experts "
            "must come from the same model",
        )
    if high_config != low_config:
        raise CheckpointError(
            low,
            f"{names[1]} has another geometry than {names[0]} ({high}): {low_config} vs {high_config}; both experts "
            "must come from the same model",
        )
    return high_config


def _a(name: str) -> str:
    return f"an {name}" if name[0] in "AEIOU" else f"a {name}"
