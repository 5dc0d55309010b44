"""loaders/safetensors_writer.py: a .safetensors file written one tensor at a time equals
save_file's bytes for the same tensors, and safetensors itself reads back what was written."""
from __future__ import annotations

import json
import random
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save, save_file

from comfyui_lingbot_world.loaders.safetensors_writer import DTYPE_NAMES, Entry, SafetensorsWriter, file_order


def _tensors() -> dict[str, torch.Tensor]:
    """Every dtype the writer knows, odd shapes (scalar, empty) and names whose order is not
    obvious ("a" < "a-b" < "a.b", non-ASCII)."""
    generator = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    names = [f"blocks.{i}.{part}" for i in (0, 1, 10, 2) for part in ("q.weight", "q.weight.absmax", "norm")]
    names += ["a", "a-b", "a.b", "é", "Z", "patch_embedding.weight"]
    dtypes = list(DTYPE_NAMES)
    tensors = {}
    for index, name in enumerate(names):
        dtype = dtypes[index % len(dtypes)]
        shape = rng.choice([(3,), (2, 5), (), (0, 4), (7, 1, 3), (33,)])
        values = torch.randn(shape, generator=generator) * 40
        tensors[name] = values > 0 if dtype == torch.bool else values.to(dtype)
    return tensors


def _write(path, tensors, metadata, order=None, entries=None) -> SafetensorsWriter:
    entries = entries or [Entry(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()]
    writer = SafetensorsWriter(path, entries, metadata)
    for name in order or tensors:
        writer.write(name, tensors[name])
    writer.close()
    return writer


def _split(data: bytes) -> tuple[bytes, bytes]:
    n = struct.unpack("<Q", data[:8])[0]
    return data[8:8 + n], data[8 + n:]


@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt"}], ids=["no-metadata", "empty", "format-pt"])
def test_same_bytes_as_save_file_whatever_the_write_order(tmp_path, metadata):
    tensors = _tensors()
    assert set(t.dtype for t in tensors.values()) == set(DTYPE_NAMES)
    save_file(tensors, str(tmp_path / "reference.safetensors"), metadata=metadata)
    order = list(tensors)
    random.Random(1).shuffle(order)
    writer = _write(tmp_path / "streamed.safetensors", tensors, metadata, order)
    writer.verify()
    assert (tmp_path / "streamed.safetensors").read_bytes() == (tmp_path / "reference.safetensors").read_bytes()


def test_file_order_is_save_files():
    tensors = _tensors()
    entries = [Entry(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()]
    header, _ = _split(save(tensors))
    assert [e.name for e in file_order(entries)] == list(json.loads(header))


def test_sizes_known_only_when_written_get_a_padded_header(tmp_path):
    """Entries without a shape: the header is sized for their bound and padded with spaces;
    the data is save_file's, and safetensors reads every tensor back."""
    tensors = {
        "x.weight": torch.arange(40, dtype=torch.uint8).reshape(20, 2),
        "x.state": torch.tensor(list(b'{"json": 0.123}'), dtype=torch.uint8),
        "y.weight": torch.arange(6, dtype=torch.uint8),
        "y.state": torch.tensor(list(b'{"json": 1e-05}'), dtype=torch.uint8),
        "x.scale": torch.randn(4),
    }
    entries = [Entry(k, v.dtype, None if k.endswith("state") else tuple(v.shape), 999) for k, v in tensors.items()]
    # From the first open entry in file order (x.state) on, the file order is the write order.
    order = ["x.scale", "x.state", "x.weight", "y.state", "y.weight"]
    writer = _write(tmp_path / "open.safetensors", tensors, {"format": "pt"}, order, entries)
    writer.verify()
    save_file(tensors, str(tmp_path / "reference.safetensors"), metadata={"format": "pt"})
    header, data = _split((tmp_path / "open.safetensors").read_bytes())
    ref_header, ref_data = _split((tmp_path / "reference.safetensors").read_bytes())
    assert data == ref_data
    assert header.rstrip(b" ") == ref_header.rstrip(b" ") and len(header) > len(ref_header)
    assert (8 + len(header)) % 8 == 0
    with safe_open(str(tmp_path / "open.safetensors"), framework="pt") as handle:
        for key, value in tensors.items():
            assert torch.equal(handle.get_tensor(key), value)


def test_out_of_order_after_an_open_entry_is_refused(tmp_path):
    entries = [Entry("a.state", torch.uint8, None, 10), Entry("b.weight", torch.uint8, (4,))]
    writer = SafetensorsWriter(tmp_path / "f.safetensors", entries)
    with pytest.raises(ValueError, match="'b.weight' came before 'a.state'"):
        writer.write("b.weight", torch.zeros(4, dtype=torch.uint8))
    writer.abort()


@pytest.mark.parametrize(
    "name, tensor, message",
    [
        ("w", torch.zeros(3, dtype=torch.float32), r"'w' is torch.float32 \(3,\), the plan says torch.bfloat16 \(4,\)"),
        ("w", torch.zeros(5, dtype=torch.bfloat16), r"the plan says torch.bfloat16 \(4,\)"),
        ("s", torch.zeros(11, dtype=torch.uint8), "at most 10 elements"),
        ("nope", torch.zeros(1), "'nope' is not in the file's plan"),
        ("w", torch.zeros(8, dtype=torch.bfloat16)[::2], "contiguous CPU tensor"),
    ],
    ids=["dtype", "shape", "over-bound", "unknown", "strided"],
)
def test_a_tensor_unlike_its_plan_is_refused(tmp_path, name, tensor, message):
    entries = [Entry("w", torch.bfloat16, (4,)), Entry("s", torch.uint8, None, 10)]
    writer = SafetensorsWriter(tmp_path / "f.safetensors", entries)
    with pytest.raises((ValueError, KeyError), match=message):
        writer.write(name, tensor)
    writer.abort()


def test_close_refuses_a_missing_tensor_and_a_second_write(tmp_path):
    entries = [Entry("a", torch.float32, (2,)), Entry("b", torch.float32, (2,))]
    writer = SafetensorsWriter(tmp_path / "f.safetensors", entries)
    writer.write("a", torch.ones(2))
    with pytest.raises(ValueError, match="already written"):
        writer.write("a", torch.ones(2))
    with pytest.raises(ValueError, match="1 tensor\\(s\\) never written, e.g. 'b'"):
        writer.close()


def test_verify_catches_bytes_that_changed_on_disk(tmp_path):
    tensors = {"a": torch.arange(64, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16)}
    path = tmp_path / "f.safetensors"
    writer = _write(path, tensors, None)
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF  # one byte of the data region
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not read back as written.*other bytes"):
        writer.verify()
