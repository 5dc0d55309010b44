"""Themed (hostile inputs, pipeline and loader level): no silent or process-killing failure.

Each hostile input gives an error naming the file or field (or, for the prompt cache, a
warning and an uncached run); a Cancel acts within one transformer block, VAE chunk or T5
layer. The node-level pieces (symlink loops in the listings, the status route) are in
test_fail_safe_nodes.py. Index, by section:

5. non-finite values: NaN/inf sampling settings, NaN weights, an extreme focal length, a
   non-finite text embedding or VAE output stop with the step, expert or stage named.
6. bounded geometry: a huge num_layers, a block count that contradicts the weights, a
   stride-0 .pth and sizes that cannot fit are refused before anything is allocated.
7. prompt cache: write failures warn and leave nothing; a failing cache never stops the
   text stage; entries are used only for their key and when sound.
8. cancel: acts within one block (sampling), one layer (T5), one chunk (VAE encode/decode).
10. failed builds: a half-built model is freed before the error is seen.
11. the smaller ones: deeply nested JSON, lone surrogates, complex-valued poses.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from comfyui_lingbot_world.loaders.errors import CheckpointError
from comfyui_lingbot_world.loaders.json_file import read_json_object
from comfyui_lingbot_world.loaders.nf4 import load_nf4_expert, read_quantization_meta
from comfyui_lingbot_world.loaders.package import find_package
from comfyui_lingbot_world.tools.synthetic.dit import make_synthetic_expert
from comfyui_lingbot_world.loaders.t5_loader import read_torch_state_dict
from comfyui_lingbot_world.loaders.tensor_source import TorchFileSource
from comfyui_lingbot_world.loaders.trajectory import read_npy
from comfyui_lingbot_world.loaders.vae_loader import load_vae
from comfyui_lingbot_world.pipeline import decode as decode_stage
from comfyui_lingbot_world.pipeline import image as image_stage
from comfyui_lingbot_world.pipeline import text as text_stage
from comfyui_lingbot_world.pipeline.camera import CameraCondition
from comfyui_lingbot_world.pipeline.guards import NonFiniteError, check_text
from comfyui_lingbot_world.pipeline.memory import build_or_release, check_video_fits
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, sample
from comfyui_lingbot_world.pipeline.text import TextEmbeddings
from comfyui_lingbot_world.pipeline.text_cache import EmbeddingCache
from comfyui_lingbot_world.wan.camera import CameraError, build_camera, validate_trajectory
from comfyui_lingbot_world.wan.config import TINY

H, W = 32, 48


@pytest.fixture(scope="module")
def files(package):
    return find_package(package)


@pytest.fixture
def picture() -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8))


# --------------------------------------------------------------------------- 5. non-finite


@pytest.mark.parametrize("field", ["shift", "cfg_high", "cfg_low", "boundary"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_sampling_params_are_refused(field, value):
    with pytest.raises(ValueError, match=rf"{field}\)? must be a finite number"):
        SamplingParams(**{field: value})


class _Source:
    """ExpertSource over ready modules (no disk)."""

    def __init__(self, **models: torch.nn.Module) -> None:
        self.models = models

    def acquire(self, name: str) -> torch.nn.Module:
        return self.models[name]

    def release(self, name: str) -> None:
        pass


def _inputs(frames: int = 5, text_dim: int = TINY.text_dim):
    f_lat = (frames - 1) // 4 + 1
    cond = image_stage.I2VCondition(y=torch.randn(20, f_lat, H // 8, W // 8), frames=frames, height=H, width=W)
    text = TextEmbeddings(positive=torch.randn(3, text_dim), negative=torch.randn(2, text_dim), from_cache=False)
    return text, cond


def _experts(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    config = dataclasses.replace(TINY, num_layers=4)
    return (make_synthetic_expert(config, seed, dtype=torch.float32),
            make_synthetic_expert(config, seed + 1, dtype=torch.float32))


def test_nan_weights_stop_sampling_at_the_step_naming_the_expert():
    high, low = _experts()
    with torch.no_grad():
        low.head.head.weight.fill_(float("nan"))
    text, cond = _inputs()
    params = SamplingParams(steps=6, shift=5.0, boundary=0.9)
    with pytest.raises(NonFiniteError, match=r"at step (\d) of 6 \(low-noise expert.*NaN or inf weights in the low-noise"):
        sample(_Source(high=high, low=low), text, cond, None, params)


def test_extreme_focal_length_stops_sampling_with_the_camera_hint():
    high, low = _experts()
    text, cond = _inputs()
    poses = np.tile(np.eye(4), (5, 1, 1))
    poses[:, 2, 3] = np.arange(5) * 0.1
    plucker, frames = build_camera(poses, np.array([1e-300, 1e-300, 416.0, 240.0]), 5, H, W, dtype=torch.float32)
    camera = CameraCondition(plucker=plucker, frames=frames, height=H, width=W, poses=poses)
    with pytest.raises(NonFiniteError, match=r"step 1 of 3 \(high-noise expert.*extreme focal length"):
        sample(_Source(high=high, low=low), text, cond, camera, SamplingParams(steps=3, shift=5.0))


def test_non_finite_text_embedding_is_refused(files, monkeypatch):
    real = text_stage.load_t5

    def poisoned(*args, **kwargs):
        encoder = real(*args, **kwargs)
        with torch.no_grad():
            next(encoder.parameters()).fill_(float("inf"))
        return encoder

    monkeypatch.setattr(text_stage, "load_t5", poisoned)
    with pytest.raises(NonFiniteError, match="prompt embedding from models_t5_umt5-xxl-enc-bf16.pth.*text encoder"):
        text_stage.encode_text(files.t5, files.tokenizer, "a fox", "", "cpu")


def test_non_finite_vae_output_is_refused(files, picture, monkeypatch):
    real = image_stage.load_vae

    def poisoned(*args, **kwargs):
        vae = real(*args, **kwargs)
        with torch.no_grad():
            vae.conv1.bias.fill_(float("nan"))
            vae.conv2.bias.fill_(float("nan"))
        return vae

    monkeypatch.setattr(image_stage, "load_vae", poisoned)
    monkeypatch.setattr(decode_stage, "load_vae", poisoned)
    with pytest.raises(NonFiniteError, match="VAE latent of the first frame"):
        image_stage.encode_image(files.vae, picture, 5, H, W, "cpu")
    with pytest.raises(NonFiniteError, match="decoded video"):
        decode_stage.decode(files.vae, torch.zeros(16, 2, H // 8, W // 8), "cpu")
    with pytest.raises(NonFiniteError, match="latent to decode"):
        decode_stage.decode(files.vae, torch.full((16, 2, H // 8, W // 8), float("nan")), "cpu")


# --------------------------------------------------------------------------- 6. bounded geometry


@pytest.mark.parametrize("value", [10**30, 100000])
def test_huge_num_layers_is_refused_at_once(package, tmp_path, value):
    folder = tmp_path / "expert"
    shutil.copytree(package / "high_noise_model_bnb_nf4", folder)
    config = json.loads((folder / "config.json").read_text())
    config["num_layers"] = value
    (folder / "config.json").write_text(json.dumps(config))
    started = time.monotonic()
    with pytest.raises(CheckpointError, match=r"config.json: field 'num_layers' = .* more than 1024"):
        load_nf4_expert(folder, "cpu")
    assert time.monotonic() - started < 5.0


def test_block_count_is_checked_before_the_model_is_built(package, tmp_path, monkeypatch):
    from comfyui_lingbot_world.loaders import nf4

    folder = tmp_path / "expert"
    shutil.copytree(package / "high_noise_model_bnb_nf4", folder)
    config = json.loads((folder / "config.json").read_text())
    config["num_layers"] = 1000
    (folder / "config.json").write_text(json.dumps(config))

    def must_not_build(*_a, **_k):
        raise AssertionError("the model was built before config.json was compared with the weights")

    monkeypatch.setattr(nf4, "build_on_meta", must_not_build)
    with pytest.raises(CheckpointError, match="num_layers=1000 but .* holds 2 transformer block"):
        load_nf4_expert(folder, "cpu")


def test_stride_zero_pth_is_refused_before_allocating(tmp_path):
    path = tmp_path / "Wan2.1_VAE.pth"
    torch.save({"decoder.head.2.weight": torch.zeros(1).expand(2**29)}, path)  # 2 GiB declared
    assert path.stat().st_size < 100_000
    for read in (read_torch_state_dict, lambda p: TorchFileSource(p, "cpu"), lambda p: load_vae(p, "cpu")):
        with pytest.raises(CheckpointError, match=r"Wan2.1_VAE.pth: tensor decoder.head.2.weight declares shape \(536870912,\)"):
            read(path)


def test_sizes_that_cannot_fit_are_refused_before_allocating(files, picture):
    with pytest.raises(ValueError, match=r"4096x4096x1601 needs about 60\d\.\d GiB of RAM"):
        check_video_fits(1601, 4096, 4096, ram_bytes=64 * 2**30)
    check_video_fits(81, 480, 832, ram_bytes=64 * 2**30)
    with pytest.raises(ValueError, match="reduce width, height or frames"):
        image_stage.encode_image(files.vae, picture, 1601, 4096, 4096, "cpu")


# --------------------------------------------------------------------------- 7. prompt cache


def _cache(tmp_path: Path, files, folder: Path | None = None) -> EmbeddingCache:
    return EmbeddingCache(folder or tmp_path / "cache", files.t5, files.tokenizer)


def test_cache_write_failures_warn_and_leave_nothing(files, tmp_path, caplog, monkeypatch):
    emb = torch.randn(4, 32, dtype=torch.bfloat16)
    blocker = tmp_path / "is_a_file"
    blocker.write_text("x")
    with caplog.at_level(logging.WARNING):
        assert _cache(tmp_path, files, blocker).put("a", emb) is False
    assert "running uncached" in caplog.text

    from comfyui_lingbot_world.pipeline import text_cache

    def disk_full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(text_cache, "save_file", disk_full)
    cache = _cache(tmp_path, files)
    assert cache.put("a", emb) is False
    assert list(cache.folder.iterdir()) == []  # no .tmp leftovers


def test_cache_failure_never_stops_the_text_stage(files, tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("not a folder")
    out = text_stage.encode_text(files.t5, files.tokenizer, "a fox", "", "cpu", cache_dir=blocker)
    assert out.positive.dim() == 2 and not out.from_cache


def test_cache_entries_are_used_only_for_their_key_and_when_sound(files, tmp_path):
    cache = _cache(tmp_path, files)
    good = torch.randn(4, 32).to(torch.bfloat16)
    assert cache.put("fox", good) and cache.put("owl", torch.randn(3, 32).to(torch.bfloat16))
    assert torch.equal(cache.get("fox"), good)
    # another key's entry copied over this one: a miss
    shutil.copy(cache._path(cache._key("owl")), cache._path(cache._key("fox")))
    assert cache.get("fox") is None
    for bad in (torch.full((4, 32), float("nan")).to(torch.bfloat16),  # non-finite
                torch.randn(4, 32),                                     # float32, not bf16
                torch.randn(2, 3, 32).to(torch.bfloat16),               # 3-D
                torch.randn(600, 32).to(torch.bfloat16)):               # longer than 512 tokens
        assert cache.put("fox", bad)
        assert cache.get("fox") is None
    assert cache.put("fox", good) and torch.equal(cache.get("fox"), good)  # rewritten
    assert not [p for p in cache.folder.iterdir() if p.suffix != ".safetensors"]


# --------------------------------------------------------------------------- 8. cancel


class Cancelled(Exception):
    pass


DELAY = 0.4  # seconds added to every block / chunk / layer


class SlowLayers:
    """Makes layers slow (a sleep after each one runs: a forward post-hook, so the pack's
    own check before the next layer sees the Cancel as soon as the current layer is done)
    and records when each finished, to know how long one layer takes."""

    def __init__(self) -> None:
        self.done: list[float] = []

    def hook(self, *_):
        time.sleep(DELAY)
        self.done.append(time.monotonic())

    def slow(self, layers) -> None:
        for layer in layers:
            layer.register_forward_hook(self.hook)

    def one_layer_time(self) -> float:
        gaps = [b - a for a, b in zip(self.done, self.done[1:])]
        return max(gaps) if gaps else 2 * DELAY


def _cancel_latency(run, slow: SlowLayers, cancel_after: float) -> float:
    """Run ``run(cancel)``, press Cancel once ``cancel_after`` s have passed and at least two
    layers ran; returns the seconds from the press to the error."""
    pressed = threading.Event()
    when: list[float] = []

    def cancel():
        if pressed.is_set():
            raise Cancelled()

    def press():
        deadline = time.monotonic() + 60
        while len(slow.done) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(DELAY / 2)  # in the middle of a layer
        when.append(time.monotonic())
        pressed.set()

    timer = threading.Timer(cancel_after, press)
    timer.start()
    try:
        with pytest.raises(Cancelled):
            run(cancel)
    finally:
        timer.cancel()
    return time.monotonic() - when[0]


def _assert_within_one_layer(latency: float, slow: SlowLayers, what: str) -> None:
    one = slow.one_layer_time()
    assert one >= DELAY
    # One layer's time, with slack for a busy test machine; without the per-layer check the
    # whole stage (several layers) would have run to its end.
    assert latency <= 1.5 * one + 0.4, f"Cancel took {latency:.2f} s; one {what} takes {one:.2f} s"


def test_cancel_in_sampling_acts_within_one_block():
    high, low = _experts()
    text, cond = _inputs()
    slow = SlowLayers()
    slow.slow(list(high.blocks) + list(low.blocks))
    latency = _cancel_latency(
        lambda cancel: sample(_Source(high=high, low=low), text, cond, None, SamplingParams(steps=4, shift=5.0),
                              check_interrupt=cancel), slow, cancel_after=0.0)
    _assert_within_one_layer(latency, slow, "transformer block")
    assert len(slow.done) < 4  # the first step's 4 blocks did not all run


def _slowed_loader(module, name: str, part, slow: SlowLayers):
    real = getattr(module, name)

    def slowed(*args, **kwargs):
        model = real(*args, **kwargs)
        slow.slow(part(model))
        return model

    return slowed


def test_cancel_in_text_encode_acts_within_one_layer(files, monkeypatch, tmp_path):
    from comfyui_lingbot_world.tools.synthetic.t5 import write_t5_checkpoint
    from comfyui_lingbot_world.wan.t5 import T5_TINY

    t5 = write_t5_checkpoint(tmp_path / "t5.pth", dataclasses.replace(T5_TINY, num_layers=8))
    slow = SlowLayers()
    monkeypatch.setattr(text_stage, "load_t5", _slowed_loader(text_stage, "load_t5", lambda e: e.blocks, slow))
    latency = _cancel_latency(
        lambda cancel: text_stage.encode_text(t5, files.tokenizer, "a fox", "", "cpu", check_interrupt=cancel),
        slow, cancel_after=0.0)
    assert len(slow.done) < 8
    _assert_within_one_layer(latency, slow, "T5 layer")


def test_cancel_in_vae_encode_acts_within_one_chunk(files, picture, monkeypatch):
    slow = SlowLayers()
    monkeypatch.setattr(image_stage, "load_vae", _slowed_loader(image_stage, "load_vae", lambda v: [v.encoder], slow))
    latency = _cancel_latency(
        lambda cancel: image_stage.encode_image(files.vae, picture, 21, H, W, "cpu", check_interrupt=cancel),
        slow, cancel_after=0.0)
    _assert_within_one_layer(latency, slow, "VAE chunk")
    assert len(slow.done) < 6  # 21 frames: 6 chunks


@pytest.mark.parametrize("tile", [None, 2])
def test_cancel_in_vae_decode_acts_within_one_chunk(files, monkeypatch, tile):
    slow = SlowLayers()
    monkeypatch.setattr(decode_stage, "load_vae", _slowed_loader(decode_stage, "load_vae", lambda v: [v.decoder], slow))
    latent = torch.zeros(16, 6, H // 8, W // 8)
    latency = _cancel_latency(
        lambda cancel: decode_stage.decode(files.vae, latent, "cpu", tile=tile, check_interrupt=cancel),
        slow, cancel_after=0.0)
    _assert_within_one_layer(latency, slow, "VAE chunk")


# --------------------------------------------------------------------------- 10. failed builds


def test_a_failed_build_is_freed_before_the_error_is_seen():
    import weakref

    built: list[weakref.ref] = []

    def half_built_then_fails():
        model = torch.nn.Linear(256, 256)
        built.append(weakref.ref(model))
        raise OSError("the shard ends early")

    try:
        build_or_release(half_built_then_fails)
    except OSError as exc:
        error = exc  # the error (and its traceback) is still held here, as ComfyUI holds it
        assert built[0]() is None, "the half-built model is still alive while the error is held"
    assert "shard ends early" in str(error)


# --------------------------------------------------------------------------- 11. the smaller ones


@pytest.mark.parametrize("name", ["config.json", "quantization_meta.json"])
def test_deeply_nested_json_names_the_file(tmp_path, name):
    path = tmp_path / name
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match=f"{name}: is nested too deeply"):
        read_json_object(path, "needed")
    if name == "quantization_meta.json":
        with pytest.raises(CheckpointError, match="nested too deeply"):
            read_quantization_meta(tmp_path)


def test_lone_surrogate_names_the_field():
    assert check_text("a \u00e9 \U0001F600", "prompt") == "a \u00e9 \U0001F600"
    assert check_text(None, "negative_prompt") == ""
    with pytest.raises(ValueError, match=r"prompt: character 4 is a lone surrogate \(U\+D83D\)"):
        check_text("fox \ud83d", "prompt")


def test_complex_poses_are_refused_naming_the_file(tmp_path):
    path = tmp_path / "poses.npy"
    np.save(path, np.tile(np.eye(4), (5, 1, 1)).astype(np.complex128))
    with pytest.raises(CheckpointError, match=r"poses.npy: poses holds complex numbers"):
        read_npy(path, "poses")
    with pytest.raises(CameraError, match="poses: holds complex numbers"):
        validate_trajectory(np.tile(np.eye(4), (5, 1, 1)) + 0j, np.ones(4))
