"""Recognise an expert folder (NF4 layout A, bf16 layout B, fp8 layout C) and read its config.json.

Both checks run before any weight is touched, so a wrong folder fails in milliseconds with
a message that says what was expected and what was found instead.

``LAYOUTS`` is the table of checkpoint layouts (the place to add one): per layout, how its
folder is recognised, the weight kind its linears are stored in, how it loads, opens (one
tensor at a time), reads its config with the control weight's shape, and what its weights
occupy once loaded. The rows point at their modules by name (``loaders/nf4.py``,
``loaders/bf16.py``, ``loaders/fp8.py``), which import this one for the file names.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from ..wan.config import DiTConfig
from .errors import CheckpointError, preview
from .json_file import read_json_object
from .new_file import write_json

ExpertLayout = Literal["nf4", "bf16", "fp8"]

CONFIG_FILE = "config.json"
# Layout A (community NF4 package).
NF4_META_FILE = "quantization_meta.json"
NF4_WEIGHTS_FILE = "model.safetensors"
NF4_LEGACY_WEIGHTS_FILE = "model.pt"
# Layout B (official bf16, diffusers-style shards).
BF16_SHARD_PREFIX = "diffusion_pytorch_model"  # every file of a bf16 expert starts with it
BF16_INDEX_FILE = f"{BF16_SHARD_PREFIX}.safetensors.index.json"
BF16_SINGLE_FILE = f"{BF16_SHARD_PREFIX}.safetensors"
# Layout C (fp8 package, written by ``python . quantize --format fp8``): one safetensors file,
# every linear as ``<layer>.weight`` (float8_e4m3fn) + ``<layer>.weight_scale`` (float32, one per
# output channel), the rest bf16.
FP8_WEIGHTS_FILE = "model_fp8.safetensors"

_EXPECTED = (
    f"an NF4 expert ({NF4_META_FILE} + {NF4_WEIGHTS_FILE} or {NF4_LEGACY_WEIGHTS_FILE}), an fp8 expert "
    f"({FP8_WEIGHTS_FILE}) or a bf16 expert ({BF16_INDEX_FILE} + its shards, or a single {BF16_SINGLE_FILE})"
)


def _implemented_in(module: str, name: str) -> Callable[..., Any]:
    """``loaders.<module>.<name>``, imported on first call (those modules import this one)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(f"{__package__}.{module}"), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = f"{module}.{name}"
    return call


@dataclass(frozen=True)
class Layout:
    """One checkpoint layout of a DiT expert folder."""

    name: str
    stored_kind: str  # the weight kind (wan/runtime/dense.py GEMM_KINDS) its linears are stored in
    folder_suffix: str  # how a package names its folders ("high_noise_model" + suffix)
    present: Callable[[set[str]], bool]  # the folder's file names say this layout
    # load(folder, device, kind=None, blocks_on_gpu=None) -> LingBotDiT; ``kind``: the weight
    # kind the linears are held in once loaded (None: as stored).
    load: Callable[..., Any]
    open: Callable[[Path, Any], Any]  # open(folder, device) -> TensorSource (a context manager)
    read_config: Callable[[Path], DiTConfig]  # config.json with control_type told by the weights
    # host_weight_bytes(folder, {key: (out, in)}, kind) -> bytes of those linear weights kept in
    # pinned RAM under block swap, held as ``kind`` (None: as stored)
    host_weight_bytes: Callable[[Path, Mapping[str, tuple[int, int]], str | None], int]
    # linear_weight_bytes(source, key) -> bytes the stored linear weight occupies in its file
    linear_weight_bytes: Callable[[Any, str], int]


def _nf4_present(names: set[str]) -> bool:
    return NF4_META_FILE in names and (NF4_WEIGHTS_FILE in names or NF4_LEGACY_WEIGHTS_FILE in names)


# In detection order: a folder that holds several kinds of weights is read as the first
# (the smallest of them).
LAYOUTS: dict[str, Layout] = {
    "nf4": Layout("nf4", "nf4", "_bnb_nf4", _nf4_present, _implemented_in("nf4", "load_nf4_expert"),
                  _implemented_in("nf4", "open_nf4_weights"), _implemented_in("nf4", "read_nf4_config"),
                  _implemented_in("nf4", "nf4_host_weight_bytes"), _implemented_in("nf4", "nf4_linear_weight_bytes")),
    "fp8": Layout("fp8", "fp8", "_fp8", lambda names: FP8_WEIGHTS_FILE in names,
                  _implemented_in("fp8", "load_fp8_expert"), _implemented_in("fp8", "open_fp8_weights"),
                  _implemented_in("fp8", "read_fp8_config"), _implemented_in("fp8", "fp8_host_weight_bytes"),
                  _implemented_in("fp8", "fp8_linear_weight_bytes")),
    "bf16": Layout("bf16", "bf16", "", lambda names: BF16_INDEX_FILE in names or BF16_SINGLE_FILE in names,
                   _implemented_in("bf16", "load_bf16_expert"), _implemented_in("bf16", "open_bf16_source"),
                   _implemented_in("bf16", "read_bf16_config"), _implemented_in("bf16", "bf16_host_weight_bytes"),
                   _implemented_in("bf16", "bf16_linear_weight_bytes")),
}


def _require_folder(folder: Path) -> None:
    if not folder.exists():
        raise CheckpointError(folder, f"folder does not exist; expected {_EXPECTED}")
    if not folder.is_dir():
        raise CheckpointError(
            folder, f"is a file, not a folder; pass the folder that holds it ({folder.parent}), which should hold {_EXPECTED}"
        )


def detect_expert_layout(folder: str | Path) -> ExpertLayout:
    """``"nf4"`` for layout A, ``"bf16"`` for layout B, ``"fp8"`` for layout C; CheckpointError
    for anything else.

    A folder that holds several kinds of weights is read as the first row of ``LAYOUTS``
    that it holds (NF4, then fp8, then bf16: the smallest).
    """
    folder = Path(folder)
    _require_folder(folder)
    names = {p.name for p in folder.iterdir()}
    for layout in LAYOUTS.values():
        if layout.present(names):
            return layout.name  # type: ignore[return-value]
    found = preview(names, limit=8) if names else "nothing (the folder is empty)"
    hint = ""
    if NF4_META_FILE in names:
        hint = f"; {NF4_META_FILE} is there but neither {NF4_WEIGHTS_FILE} nor {NF4_LEGACY_WEIGHTS_FILE}"
    elif NF4_WEIGHTS_FILE in names or NF4_LEGACY_WEIGHTS_FILE in names:
        hint = f"; the NF4 weights are there but {NF4_META_FILE} is missing"
    raise CheckpointError(folder, f"is not an expert folder: expected {_EXPECTED}, found {found}{hint}")


def layout_of(folder: str | Path) -> Layout:
    """The ``LAYOUTS`` row of an expert folder (CheckpointError when it is none of them)."""
    return LAYOUTS[detect_expert_layout(folder)]


def require_layout(folder: str | Path, wanted: ExpertLayout) -> Path:
    """The folder as a Path, after checking that it holds an expert of layout ``wanted``."""
    folder = Path(folder)
    found = detect_expert_layout(folder)
    if found != wanted:
        other = f"load_{found}_expert"
        raise CheckpointError(folder, f"holds a {found} expert, not an {wanted} one; read it with {other}")
    return folder


# --- config.json --------------------------------------------------------------------------

_POSITIVE_INT_FIELDS = (
    "text_len", "in_dim", "dim", "ffn_dim", "freq_dim", "text_dim", "out_dim", "num_heads", "num_layers",
)
_BOOL_FIELDS = ("qk_norm", "cross_attn_norm")
# LingBot-World experts are image-to-video models; the other Wan kinds have other inputs.
_SUPPORTED_MODEL_TYPES = ("i2v",)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Upper bounds far above any Wan/LingBot model (A14B: 40 layers, dim 5120, ffn 13824),
# checked before anything is built: a config.json saying num_layers = 10**30 would
# otherwise have the model skeleton built block by block until memory runs out.
MAX_NUM_LAYERS = 1024
_FIELD_LIMITS = {
    "text_len": 8192, "in_dim": 4096, "dim": 65536, "ffn_dim": 262144, "freq_dim": 65536,
    "text_dim": 65536, "out_dim": 4096, "num_heads": 1024, "num_layers": MAX_NUM_LAYERS,
}
_PATCH_LIMIT = 64


def _check_config_values(path: Path, data: dict[str, Any]) -> None:
    def bad(field: str, why: str) -> CheckpointError:
        shown = repr(data[field])
        shown = shown if len(shown) <= 40 else f"{shown[:20]}...({len(shown)} characters)"
        return CheckpointError(path, f"field {field!r} = {shown} is invalid: {why}")

    for field in _POSITIVE_INT_FIELDS:
        if field in data and (not _is_int(data[field]) or data[field] <= 0):
            raise bad(field, "expected a positive integer")
        if field in data and data[field] > _FIELD_LIMITS[field]:
            raise bad(field, f"more than {_FIELD_LIMITS[field]}, far beyond any LingBot-World/Wan model "
                      "(A14B: num_layers 40, dim 5120); the config.json is corrupt or not this model's")
    for field in _BOOL_FIELDS:
        if field in data and not isinstance(data[field], bool):
            raise bad(field, "expected true or false")
    if "model_type" in data and data["model_type"] not in _SUPPORTED_MODEL_TYPES:
        raise bad("model_type", f"LingBot-World experts are {', '.join(_SUPPORTED_MODEL_TYPES)} models")
    if "patch_size" in data:
        value = data["patch_size"]
        if not isinstance(value, list) or len(value) != 3 or not all(_is_int(v) and 0 < v <= _PATCH_LIMIT for v in value):
            raise bad("patch_size", f"expected three positive integers up to {_PATCH_LIMIT}")
    if "window_size" in data:
        value = data["window_size"]
        if not isinstance(value, list) or len(value) != 2 or not all(_is_int(v) for v in value):
            raise bad("window_size", "expected two integers")
    if "eps" in data:
        value = data["eps"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < 1) or math.isnan(value):
            raise bad("eps", "expected a small positive number")


def read_config(folder: str | Path) -> DiTConfig:
    """The DiT geometry from ``<folder>/config.json`` (fields missing from it keep A14B defaults)."""
    path = Path(folder) / CONFIG_FILE
    data = read_json_object(path, "every expert folder needs its config.json")
    _check_config_values(path, data)
    try:
        return DiTConfig.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(path, f"describes an impossible model: {exc}") from exc


def write_config(folder: str | Path, config: DiTConfig, fields: Mapping[str, Any] | None = None) -> Path:
    """Write ``config.json`` with every DiTConfig field (plus the class name diffusers records),
    or ``fields`` as given: another model's file (``loaders.model_kind.fast_config_fields``) or a
    source folder's own, kept by a copy in another layout."""
    path = Path(folder) / CONFIG_FILE
    data = dict(fields) if fields is not None else {"_class_name": "WanModel", **config.to_dict()}
    return write_json(path, data)
