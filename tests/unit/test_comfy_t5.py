"""ComfyUI's umT5 files (umt5_xxl_fp16 / fp8_e4m3fn_scaled .safetensors): loader, tokenizer
inside the file, cache keys and refusals (tiny geometry, CPU).

Tolerances: a bf16 file loads bit-exactly like the .pth with the same weights. An fp8 file
loads bit-exactly like its dequantized reference (fp8 value as float32 times the scale, then
cast to the compute dtype); its embeddings differ from the unquantized encoder's by fp8
rounding only (relative Frobenius error below 10%).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from comfyui_lingbot_world.loaders.comfy_t5 import comfy_key, load_comfy_t5, pack_key
from comfyui_lingbot_world.loaders.errors import CheckpointError
from comfyui_lingbot_world.tools.synthetic.t5 import (
    COMFY_T5_FILES,
    comfy_t5_tensors,
    train_sentencepiece,
    write_comfy_t5,
    write_t5_checkpoint,
)
from comfyui_lingbot_world.tools.synthetic.vae import write_vae_checkpoint
from comfyui_lingbot_world.loaders.t5_loader import load_t5
from comfyui_lingbot_world.pipeline import text as text_stage
from comfyui_lingbot_world.pipeline.text import load_tokenizer
from comfyui_lingbot_world.tools import make_checkpoint
from comfyui_lingbot_world.wan.t5 import T5_TINY, T5Geometry, UMT5Encoder, encode_prompts
from comfyui_lingbot_world.wan.tokenizer import UMT5Tokenizer
from comfyui_lingbot_world.wan.vae import VAE_TINY

SEED = 5
PROMPTS = ["a red car drives along the river at sunset", "blurry"]
FP8_REL_TOL = 0.10


@pytest.fixture(scope="module")
def spiece() -> bytes:
    return train_sentencepiece(T5_TINY.vocab_size)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, spiece: bytes) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("comfy_t5")
    out = {"pth": write_t5_checkpoint(root / "official.pth", T5_TINY, seed=SEED)}
    for fmt, name in COMFY_T5_FILES.items():
        out[fmt] = write_comfy_t5(root / name, T5_TINY, seed=SEED, fmt=fmt, tokenizer=spiece)
    return out


def tensors_of(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def rewrite(src: Path, dst: Path, edit) -> Path:
    tensors = tensors_of(src)
    metadata = edit(tensors)
    save_file(tensors, str(dst), metadata=metadata)
    return dst


def drop(key: str):
    """An edit for ``rewrite`` that deletes one tensor."""
    def edit(tensors):
        del tensors[key]
    return edit


def embed(encoder: UMT5Encoder, tokenizer) -> list[torch.Tensor]:
    return encode_prompts(encoder, tokenizer, PROMPTS, "cpu")


# ------------------------------------------------------------------------------ key names


def test_every_pack_key_has_a_comfy_name_and_back() -> None:
    with torch.device("meta"):
        keys = list(UMT5Encoder(T5_TINY).state_dict())
    names = [comfy_key(k) for k in keys]
    assert len(set(names)) == len(keys)
    assert [pack_key(n) for n in names] == keys
    assert "shared.weight" in names and "encoder.final_layer_norm.weight" in names
    assert "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight" in names
    assert pack_key("encoder.block.0.layer.1.DenseReluDense.wi_0.weight") == "blocks.0.ffn.gate.0.weight"
    assert pack_key("spiece_model") is None


# ------------------------------------------------------------------------------ equality


def test_bf16_file_equals_official_pth(files: dict[str, Path], spiece: bytes) -> None:
    reference = load_t5(files["pth"], "cpu", torch.bfloat16)
    loaded = load_t5(files["bf16"], "cpu", torch.bfloat16)  # dispatches on .safetensors
    assert loaded.geometry == reference.geometry == T5_TINY
    ref_sd, got_sd = reference.state_dict(), loaded.state_dict()
    assert ref_sd.keys() == got_sd.keys()
    for key in ref_sd:
        assert got_sd[key].dtype == torch.bfloat16, key
        assert torch.equal(ref_sd[key], got_sd[key]), key
    tokenizer = UMT5Tokenizer.from_sentencepiece_bytes(spiece, "test")
    for a, b in zip(embed(reference, tokenizer), embed(loaded, tokenizer)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fmt", ["fp8_scaled", "fp8_comfy_quant"])
def test_fp8_file_equals_dequantized_reference(files: dict[str, Path], spiece: bytes, fmt: str) -> None:
    raw = tensors_of(files[fmt])
    if fmt == "fp8_scaled":
        assert raw["scaled_fp8"].dtype == torch.float8_e4m3fn
    loaded = load_comfy_t5(files[fmt], "cpu", torch.bfloat16)
    checked = 0
    for key, tensor in loaded.state_dict().items():
        name = comfy_key(key)
        layer = name[: -len(".weight")]
        scale = raw.get(f"{layer}.scale_weight", raw.get(f"{layer}.weight_scale"))
        if scale is None:
            expected = raw[name].to(torch.bfloat16)
        else:
            assert raw[name].dtype == torch.float8_e4m3fn, name
            expected = (raw[name].float() * scale.float()).to(torch.bfloat16)
            checked += 1
        assert torch.equal(tensor, expected), name
    assert checked == 7 * T5_TINY.num_layers  # q, k, v, o, wi_0, wi_1, wo per block

    # Against the unquantized weights: only fp8 rounding apart.
    tokenizer = UMT5Tokenizer.from_sentencepiece_bytes(spiece, "test")
    reference = load_t5(files["pth"], "cpu", torch.float32)
    fp8 = load_comfy_t5(files[fmt], "cpu", torch.float32)
    for a, b in zip(embed(reference, tokenizer), embed(fp8, tokenizer)):
        rel = float((a - b).norm() / a.norm())
        assert 0 < rel < FP8_REL_TOL, rel


def test_quantization_metadata_in_header(files: dict[str, Path], tmp_path: Path) -> None:
    """Newer ComfyUI may keep the per-layer formats in the header instead of comfy_quant tensors."""
    def edit(tensors):
        layers = {}
        for key in [k for k in tensors if k.endswith(".comfy_quant")]:
            layers[key[: -len(".comfy_quant")]] = json.loads(tensors.pop(key).numpy().tobytes())
        return {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": layers})}

    moved = rewrite(files["fp8_comfy_quant"], tmp_path / "header.safetensors", edit)
    a = load_comfy_t5(files["fp8_comfy_quant"], "cpu").state_dict()
    b = load_comfy_t5(moved, "cpu").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_compute_dtype_follows_request(files: dict[str, Path]) -> None:
    encoder = load_comfy_t5(files["fp8_scaled"], "cpu", torch.float16)
    assert {t.dtype for t in encoder.state_dict().values()} == {torch.float16}


# ------------------------------------------------------------------------------ tokenizer


def test_tokenizer_from_file_matches_sentencepiece_and_folder(files: dict[str, Path], spiece: bytes,
                                                              tmp_path: Path) -> None:
    import sentencepiece

    from_file = load_tokenizer(files["fp8_scaled"], None)
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "spiece.model").write_bytes(spiece)
    from_folder = load_tokenizer(files["pth"], tmp_path / "tok")
    ids, mask = from_file(PROMPTS, max_len=32)
    ids2, mask2 = from_folder(PROMPTS, max_len=32)
    assert torch.equal(ids, ids2) and torch.equal(mask, mask2)
    sp = sentencepiece.SentencePieceProcessor(model_proto=spiece)
    first = sp.encode(PROMPTS[0]) + [1]  # umT5: the pieces then </s>, pad 0 after
    assert ids[0, : len(first)].tolist() == first and int(mask[0].sum()) == len(first)
    assert sp.pad_id() == 0 and sp.eos_id() == 1 and sp.get_piece_size() <= T5_TINY.vocab_size


def test_tokenizer_from_file_errors(files: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"official\.pth.*holds no tokenizer.*tokenizer folder"):
        load_tokenizer(files["pth"], None)
    stripped = rewrite(files["bf16"], tmp_path / "no_tok.safetensors", drop("spiece_model"))
    with pytest.raises(CheckpointError, match=r"no_tok\.safetensors.*'spiece_model'"):
        load_tokenizer(stripped, None)
    broken = rewrite(files["bf16"], tmp_path / "bad_tok.safetensors",
                     lambda t: t.update(spiece_model=torch.zeros(16, dtype=torch.uint8)))
    with pytest.raises(ValueError, match=r"bad_tok\.safetensors:spiece_model.*SentencePiece"):
        load_tokenizer(broken, None)


def test_encode_text_with_tokenizer_from_file_and_cache_keys(files: dict[str, Path], spiece: bytes,
                                                            tmp_path: Path) -> None:
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "spiece.model").write_bytes(spiece)
    cache = tmp_path / "cache"
    first = text_stage.encode_text(files["bf16"], None, PROMPTS[0], PROMPTS[1], "cpu", cache_dir=cache)
    assert not first.from_cache
    assert text_stage.encode_text(files["bf16"], None, PROMPTS[0], PROMPTS[1], "cpu", cache_dir=cache).from_cache
    # Same encoder file, tokenizer from a folder: a different key, never the entry above.
    folder = text_stage.encode_text(files["bf16"], tmp_path / "tok", PROMPTS[0], PROMPTS[1], "cpu", cache_dir=cache)
    assert not folder.from_cache
    assert torch.equal(first.positive, folder.positive)  # same tokenizer bytes, same embedding
    # Another encoder file (fp8): another key again.
    fp8 = text_stage.encode_text(files["fp8_scaled"], None, PROMPTS[0], PROMPTS[1], "cpu", cache_dir=cache)
    assert not fp8.from_cache and not torch.equal(first.positive, fp8.positive)
    assert len(list(cache.glob("*.safetensors"))) == 6


# ------------------------------------------------------------------------------ refusals


def test_missing_key_is_named(files: dict[str, Path], tmp_path: Path) -> None:
    key = "encoder.block.1.layer.1.DenseReluDense.wo.weight"
    bad = rewrite(files["bf16"], tmp_path / "missing.safetensors", drop(key))
    with pytest.raises(CheckpointError, match=rf"missing\.safetensors: .*missing tensor.*{key}"):
        load_t5(bad, "cpu")


def test_wrong_shape_is_named(files: dict[str, Path], tmp_path: Path) -> None:
    key = "encoder.block.1.layer.0.SelfAttention.k.weight"
    bad = rewrite(files["bf16"], tmp_path / "shape.safetensors",
                  lambda t: t.update({key: torch.zeros(16, 32, dtype=torch.bfloat16)}))
    with pytest.raises(CheckpointError, match=rf"shape\.safetensors: tensor '{key}' has shape \(16, 32\)"):
        load_t5(bad, "cpu")


def test_vae_safetensors_is_refused(tmp_path: Path) -> None:
    vae = write_vae_checkpoint(tmp_path / "wan_2.1_vae.safetensors", VAE_TINY)
    with pytest.raises(CheckpointError, match=r"wan_2\.1_vae\.safetensors: has no tensor 'shared\.weight'.*not a umT5"):
        load_t5(vae, "cpu")


def test_t5_v1_1_is_refused(files: dict[str, Path], tmp_path: Path) -> None:
    """Flux/SD3's t5xxl keeps one position table in block 0 only."""
    key = "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"
    bad = rewrite(files["bf16"], tmp_path / "t5xxl_fp16.safetensors", drop(key))
    with pytest.raises(CheckpointError, match=rf"t5xxl_fp16\.safetensors: has no tensor '{key}'.*T5 v1\.1.*not umT5"):
        load_t5(bad, "cpu")


def test_unknown_key_and_unsupported_quant_format_are_named(files: dict[str, Path], tmp_path: Path) -> None:
    extra = rewrite(files["bf16"], tmp_path / "extra.safetensors",
                    lambda t: t.update({"text_projection.weight": torch.zeros(4, 4)}))
    with pytest.raises(CheckpointError, match=r"extra\.safetensors: .*not part of a umT5 encoder: text_projection\.weight"):
        load_t5(extra, "cpu")
    layer = "encoder.block.0.layer.0.SelfAttention.q"
    nvfp4 = rewrite(files["fp8_comfy_quant"], tmp_path / "nvfp4.safetensors", lambda t: t.update(
        {f"{layer}.comfy_quant": torch.tensor(list(b'{"format": "nvfp4"}'), dtype=torch.uint8)}))
    with pytest.raises(CheckpointError, match=rf"nvfp4\.safetensors: tensor '{layer}\.weight' is quantized as 'nvfp4'"):
        load_t5(nvfp4, "cpu")


def test_scale_without_fp8_and_truncated_file(files: dict[str, Path], tmp_path: Path) -> None:
    layer = "encoder.block.0.layer.0.SelfAttention.v"
    odd = rewrite(files["bf16"], tmp_path / "odd.safetensors",
                  lambda t: t.update({f"{layer}.scale_weight": torch.tensor(2.0)}))
    with pytest.raises(CheckpointError, match=rf"odd\.safetensors: tensor '{layer}\.weight' has dtype torch\.bfloat16 but a scale"):
        load_t5(odd, "cpu")
    data = files["bf16"].read_bytes()
    short = tmp_path / "short.safetensors"
    short.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"short\.safetensors: .*(truncated|corrupt)"):
        load_t5(short, "cpu")


# ------------------------------------------------------------------------------ writer


def test_writer_layout_and_make_checkpoint_part(tmp_path: Path) -> None:
    tensors = comfy_t5_tensors(T5_TINY, seed=1, fmt="fp8_scaled", tokenizer=b"not used here")
    assert tensors["spiece_model"].dtype == torch.uint8
    assert tensors["encoder.block.0.layer.0.SelfAttention.q.scale_weight"].dtype == torch.float32
    assert tensors["shared.weight"].dtype == torch.bfloat16
    code = make_checkpoint.main(["--preset", "tiny", "--layout", "nf4", "--out", str(tmp_path), "--seed", "3",
                                 "--parts", "t5,comfy_t5", "--comfy-t5", "bf16"])
    assert code == 0
    official = load_t5(tmp_path / "models_t5_umt5-xxl-enc-bf16.pth", "cpu").state_dict()
    comfy = load_t5(tmp_path / COMFY_T5_FILES["bf16"], "cpu").state_dict()
    assert all(torch.equal(official[k], comfy[k]) for k in official)
    assert load_tokenizer(tmp_path / COMFY_T5_FILES["bf16"], None).vocab_size <= T5_TINY.vocab_size


# ------------------------------------------------------------------------------ memory

# 8 blocks of 1024 / ffn 2816 and a 32000-token table: ~101 M fp8 linear weights, ~33 M bf16.
MEMORY_GEOMETRY = T5Geometry(vocab_size=32000, dim=1024, dim_attn=1024, dim_ffn=2816, num_heads=16,
                             num_layers=8, num_buckets=32)
_MEMORY_CHILD = r"""
import json, sys, threading, time
sys.path.insert(0, sys.argv[1])
from _standalone import import_pack
import_pack()
import torch
from comfyui_lingbot_world.loaders.comfy_t5 import load_comfy_t5

def anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024

peak = [0]
done = threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], anon())
        time.sleep(0.005)

before = anon()
peak[0] = before
thread = threading.Thread(target=sample, daemon=True)
thread.start()
encoder = load_comfy_t5(sys.argv[2], "cpu", torch.bfloat16)
done.set(); thread.join()
print(json.dumps({"before": before, "peak": max(peak[0], anon())}))
"""


def test_fp8_file_is_streamed_not_read_whole(tmp_path: Path, spiece: bytes) -> None:
    """Anonymous memory while loading stays near the bf16 model itself: the fp8 file (and a
    float32 copy of it) is never held whole; each tensor is dequantized as it is read."""
    import subprocess
    import sys

    path = write_comfy_t5(tmp_path / "medium_fp8.safetensors", MEMORY_GEOMETRY, fmt="fp8_scaled", tokenizer=spiece)
    with torch.device("meta"):
        model_bytes = sum(t.numel() * 2 for t in UMT5Encoder(MEMORY_GEOMETRY).state_dict().values())
    file_bytes = path.stat().st_size
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, str(root), str(path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    numbers = json.loads(result.stdout.strip().splitlines()[-1])
    increase = numbers["peak"] - numbers["before"]
    print(f"\nfile {file_bytes / 1e6:.0f} MB, bf16 model {model_bytes / 1e6:.0f} MB, "
          f"RssAnon +{increase / 1e6:.0f} MB peak while loading")
    # Seen: about model + 35 MB (one tensor's float32 transients, allocator slack). Reading the
    # file whole first would add file_bytes (~170 MB) on top of the model.
    assert increase < model_bytes + file_bytes // 2, (numbers, model_bytes, file_bytes)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["bf16", "fp8_scaled"])
def test_cuda_load_equals_cpu_load(files: dict[str, Path], fmt: str, monkeypatch) -> None:
    """Tensors go from the memory map through pinned staging to the GPU and are dequantized there."""
    from comfyui_lingbot_world.loaders.pinned_upload import PinnedUploader

    uploads = []
    upload = PinnedUploader.upload
    monkeypatch.setattr(PinnedUploader, "upload", lambda self, t: uploads.append(t.dtype) or upload(self, t))
    cpu = load_comfy_t5(files[fmt], "cpu", torch.bfloat16).state_dict()
    assert uploads == []
    gpu = load_comfy_t5(files[fmt], "cuda", torch.bfloat16).state_dict()
    assert len(uploads) >= len(gpu)
    for key, tensor in gpu.items():
        assert tensor.is_cuda, key
        assert torch.equal(tensor.cpu(), cpu[key]), key
