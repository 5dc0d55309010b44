"""Load umT5-XXL from the files ComfyUI users already have (``models/text_encoders``).

``umt5_xxl_fp16.safetensors`` / ``umt5_xxl_fp8_e4m3fn_scaled.safetensors`` use the Hugging
Face T5 key names (``shared.weight``, ``encoder.block.N.layer.0.SelfAttention.q.weight``,
``encoder.final_layer_norm.weight``, one ``relative_attention_bias`` per block) and carry the
SentencePiece tokenizer as a uint8 tensor ``spiece_model``.

Two fp8 "scaled" encodings occur, both read here (weight = fp8 weight as float32 * scale):

- ComfyUI before 0.4 / the files on Comfy-Org: an empty marker tensor ``scaled_fp8`` and a
  float32 ``<layer>.scale_weight`` per quantized linear (``<layer>.scale_input`` is an
  activation hint for fp8 matmuls, meaningless once the weight is dequantized).
- Newer ComfyUI: ``<layer>.weight_scale`` plus the layer's format, either in a per-layer
  uint8-JSON tensor ``<layer>.comfy_quant`` or in the header metadata
  ``_quantization_metadata`` (``{"layers": {"<layer>": {"format": "float8_e4m3fn"}}}``).

Tensors are read one at a time from the safetensors memory map on the target device and
dequantized/cast there, so the whole file is never in RAM.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from ..wan.checkpoint_keys import count_blocks
from ..wan.t5 import GEOMETRY_LIMITS, T5Geometry, UMT5Encoder
from .errors import CheckpointError, preview
from .state_dict import check_loaded, materialize
from .pinned_upload import PinnedUploader, make_uploader
from .tensor_source import device_string

TOKENIZER_KEY = "spiece_model"
SCALED_FP8_MARKER = "scaled_fp8"
QUANT_METADATA = "_quantization_metadata"
# Per-tensor fp8 formats whose dequantization is weight * scale.
FP8_FORMATS = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
# Keys a full umT5 (encoder + decoder) file carries that the encoder does not use.
_IGNORED_PREFIXES = ("decoder.", "lm_head.")
_IGNORED_KEYS = {TOKENIZER_KEY, SCALED_FP8_MARKER, "encoder.embed_tokens.weight"}
_SCALE_SUFFIXES = (".scale_weight", ".weight_scale")
_HINT_SUFFIXES = (".scale_input", ".input_scale", ".comfy_quant")

# ComfyUI (HF T5) name -> the pack's (official Wan) name, per block.
_BLOCK_NAMES = {
    "layer.0.layer_norm.weight": "norm1.weight",
    "layer.0.SelfAttention.q.weight": "attn.q.weight",
    "layer.0.SelfAttention.k.weight": "attn.k.weight",
    "layer.0.SelfAttention.v.weight": "attn.v.weight",
    "layer.0.SelfAttention.o.weight": "attn.o.weight",
    "layer.0.SelfAttention.relative_attention_bias.weight": "pos_embedding.embedding.weight",
    "layer.1.layer_norm.weight": "norm2.weight",
    "layer.1.DenseReluDense.wi_0.weight": "ffn.gate.0.weight",  # the GELU branch
    "layer.1.DenseReluDense.wi_1.weight": "ffn.fc1.weight",  # the linear branch
    "layer.1.DenseReluDense.wo.weight": "ffn.fc2.weight",
}
_TOP_NAMES = {"shared.weight": "token_embedding.weight", "encoder.final_layer_norm.weight": "norm.weight"}
_BLOCK_KEY = re.compile(r"^encoder\.block\.(\d+)\.(.+)$")


def pack_key(comfy_key: str) -> str | None:
    """The pack's state-dict key for a ComfyUI umT5 key, or None when it is not a weight."""
    if comfy_key in _TOP_NAMES:
        return _TOP_NAMES[comfy_key]
    m = _BLOCK_KEY.match(comfy_key)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"blocks.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}"
    return None


def comfy_key(pack: str) -> str:
    """The ComfyUI key for a pack key (inverse of ``pack_key``)."""
    for theirs, ours in _TOP_NAMES.items():
        if ours == pack:
            return theirs
    _, index, leaf = pack.split(".", 2)
    theirs = next(k for k, v in _BLOCK_NAMES.items() if v == leaf)
    return f"encoder.block.{index}.{theirs}"


def is_comfy_t5_file(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".safetensors"


class ComfyT5File:
    """An open ComfyUI umT5 safetensors file: keys and shapes from the header, tensors on demand."""

    def __init__(self, path: str | Path, device: torch.device | str = "cpu") -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise CheckpointError(self.path, "file not found")
        if not self.path.is_file():
            raise CheckpointError(self.path, "is a folder; expected a umT5 .safetensors file")
        self.device = device_string(device)
        # Weights bound for CUDA go through pinned staging (faster than safetensors' own CUDA
        # copy); fp8 ones are dequantized there afterwards, as before.
        self._uploader: PinnedUploader | None = make_uploader(self.device)
        try:
            self._handle = safe_open(str(self.path), framework="pt", device="cpu")
            self.metadata = self._handle.metadata() or {}
        except Exception as exc:  # SafetensorError for a bad header or a short file
            raise CheckpointError(
                self.path, f"cannot be opened as safetensors ({exc}); the file is truncated or corrupt"
            ) from exc
        self.keys = set(self._handle.keys())
        self._layer_formats = self._read_quant_metadata()

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handle.get_slice(key).get_shape())

    def read(self, key: str) -> torch.Tensor:
        """Tensor ``key`` on the file's device."""
        tensor = self.read_host(key)
        if self._uploader is not None:
            return self._uploader.upload(tensor)
        return tensor.to(self.device)

    def read_host(self, key: str) -> torch.Tensor:
        """Tensor ``key`` on the CPU, backed by the memory map (metadata, the tokenizer)."""
        try:
            return self._handle.get_tensor(key)
        except Exception as exc:
            raise CheckpointError(
                self.path, f"cannot read tensor {key!r} ({exc}); the file may be truncated or corrupt"
            ) from exc

    def close(self) -> None:
        """Wait for queued uploads and drop the staging buffers (the file stays readable)."""
        if self._uploader is not None:
            self._uploader.close()
            self._uploader = None

    def _read_quant_metadata(self) -> dict[str, str]:
        raw = self.metadata.get(QUANT_METADATA)
        if raw is None:
            return {}
        try:
            layers = json.loads(raw)["layers"]
            return {layer: conf.get("format") for layer, conf in layers.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(self.path, f"header metadata {QUANT_METADATA!r} is not valid JSON with 'layers' ({exc})") from exc

    def layer_format(self, layer: str) -> str | None:
        """The quantization format ComfyUI recorded for ``layer`` (None: plain weight)."""
        if f"{layer}.comfy_quant" in self.keys:
            raw = self.read_host(f"{layer}.comfy_quant").numpy().tobytes()
            try:
                return json.loads(raw).get("format")
            except (ValueError, AttributeError) as exc:
                raise CheckpointError(self.path, f"tensor {layer}.comfy_quant is not a JSON object ({exc})") from exc
        return self._layer_formats.get(layer)

    def scale_key(self, layer: str) -> str | None:
        for suffix in _SCALE_SUFFIXES:
            if f"{layer}{suffix}" in self.keys:
                return f"{layer}{suffix}"
        return None

    def tokenizer_bytes(self) -> bytes:
        """The SentencePiece model stored in the file; CheckpointError when there is none."""
        if TOKENIZER_KEY not in self.keys:
            raise CheckpointError(
                self.path,
                f"holds no tokenizer (tensor {TOKENIZER_KEY!r}); choose a tokenizer folder (google/umt5-xxl files) instead",
            )
        return self.read_host(TOKENIZER_KEY).numpy().tobytes()


def read_geometry(file: ComfyT5File) -> T5Geometry:
    """Geometry from header shapes alone; CheckpointError naming the key that does not fit."""
    path = file.path

    def shape(key: str, ndim: int) -> tuple[int, ...]:
        if key not in file.keys:
            found = preview(file.keys) if file.keys else "no tensors at all"
            raise CheckpointError(
                path, f"has no tensor {key!r}: this is not a umT5 text encoder in ComfyUI's layout (found: {found})"
            )
        found_shape = file.shape(key)
        if len(found_shape) != ndim:
            raise CheckpointError(path, f"tensor {key!r} has shape {found_shape}, expected {ndim} dimensions")
        return found_shape

    vocab_size, dim = shape("shared.weight", 2)
    dim_attn, _ = shape("encoder.block.0.layer.0.SelfAttention.q.weight", 2)
    dim_ffn, _ = shape("encoder.block.0.layer.1.DenseReluDense.wi_1.weight", 2)
    num_buckets, num_heads = shape("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", 2)
    has_block_1 = any(key.startswith("encoder.block.1.") for key in file.keys)
    if has_block_1 and "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight" not in file.keys:
        raise CheckpointError(
            path,
            "has no tensor 'encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight': this is a T5 "
            "v1.1 encoder (e.g. t5xxl for Flux/SD3, one position table shared by all blocks), not umT5-XXL; "
            "choose umt5_xxl_fp16.safetensors or umt5_xxl_fp8_e4m3fn_scaled.safetensors",
        )
    try:
        # From the header keys, before anything is built: blocks 0..N-1 without a gap, N bounded.
        # (Each block's tensors are then checked by _check_keys, on the meta-built encoder,
        # before any is read: fp8 files add scale tensors per layer.)
        num_layers = count_blocks(file.keys, "encoder.block.", GEOMETRY_LIMITS["num_layers"])
        return T5Geometry(vocab_size, dim, dim_attn, dim_ffn, num_heads, num_layers, num_buckets)
    except ValueError as exc:
        raise CheckpointError(path, str(exc)) from exc


def _check_keys(file: ComfyT5File, expected: dict[str, torch.Tensor]) -> None:
    """Every weight present with the model's shape; anything unknown refused, by ComfyUI name."""
    path = file.path
    wanted = {comfy_key(k): k for k in expected}
    missing = sorted(set(wanted) - file.keys)
    if missing:
        raise CheckpointError(path, f"does not match umT5: {len(missing)} missing tensor(s): {preview(missing)}")
    for theirs, ours in wanted.items():
        found = file.shape(theirs)
        if found != tuple(expected[ours].shape):
            raise CheckpointError(
                path, f"tensor {theirs!r} has shape {found}, the encoder read from this file expects "
                f"{tuple(expected[ours].shape)}"
            )
    known_layers = {k[: -len(".weight")] for k in wanted}
    unknown = []
    for key in file.keys - set(wanted) - _IGNORED_KEYS:
        if key.startswith(_IGNORED_PREFIXES):
            continue
        suffix = next((s for s in _SCALE_SUFFIXES + _HINT_SUFFIXES if key.endswith(s)), None)
        if suffix is not None and key[: -len(suffix)] in known_layers:
            continue
        unknown.append(key)
    if unknown:
        raise CheckpointError(path, f"holds tensor(s) that are not part of a umT5 encoder: {preview(unknown)}")


def read_weight(file: ComfyT5File, key: str, dtype: torch.dtype) -> torch.Tensor:
    """Tensor ``key`` on the file's device in ``dtype``; fp8 weights are multiplied by their scale."""
    layer = key[: -len(".weight")]
    fmt = file.layer_format(layer)
    scale_key = file.scale_key(layer)
    weight = file.read(key)
    if fmt is not None and fmt not in FP8_FORMATS:
        raise CheckpointError(
            file.path, f"tensor {key!r} is quantized as {fmt!r}; only {', '.join(FP8_FORMATS)} (per-tensor scale) "
            "are read: use umt5_xxl_fp16.safetensors or umt5_xxl_fp8_e4m3fn_scaled.safetensors",
        )
    if scale_key is None:
        if fmt is not None:
            raise CheckpointError(file.path, f"tensor {key!r} is marked {fmt!r} but has no {layer}.weight_scale")
        return weight.to(dtype=dtype)
    if weight.dtype not in FP8_FORMATS.values():
        if weight.dtype == torch.uint8 and fmt in FP8_FORMATS:  # fp8 bytes stored as uint8
            weight = weight.view(FP8_FORMATS[fmt])
        else:
            raise CheckpointError(file.path, f"tensor {key!r} has dtype {weight.dtype} but a scale {scale_key!r}; expected fp8")
    scale = file.read(scale_key).to(torch.float32)
    if scale.numel() == 1:
        scale = scale.reshape(())
    elif scale.numel() == weight.shape[0]:  # one scale per output row
        scale = scale.reshape(-1, *([1] * (weight.dim() - 1)))
    else:
        raise CheckpointError(
            file.path, f"tensor {scale_key!r} has shape {tuple(scale.shape)}; expected one value or one per row of {key!r}"
        )
    return (weight.to(torch.float32) * scale).to(dtype)


def load_comfy_t5(path: str | Path, device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> UMT5Encoder:
    """Build the encoder on the meta device, then fill it from the file tensor by tensor on ``device``."""
    file = ComfyT5File(path, device)
    try:
        geometry = read_geometry(file)
        with torch.device("meta"):
            encoder = UMT5Encoder(geometry)
        expected = dict(encoder.state_dict(keep_vars=True))
        _check_keys(file, expected)
        materialize(
            encoder, file.path, expected.keys(), lambda key: read_weight(file, comfy_key(key), dtype), device,
            dtype_for=lambda key, tensor: dtype,
        )
    finally:
        file.close()
    check_loaded(encoder, file.path)
    return encoder.eval().requires_grad_(False)
