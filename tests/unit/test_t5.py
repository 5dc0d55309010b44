"""umT5 encoder, tokenizer, .pth loader and synthetic writers (tiny geometry, CPU)."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from comfyui_lingbot_world.loaders.errors import CheckpointError
from comfyui_lingbot_world.tools.synthetic.t5 import write_t5_checkpoint, write_tokenizer
from comfyui_lingbot_world.loaders.t5_loader import load_t5
from comfyui_lingbot_world.wan import config as dit_config
from comfyui_lingbot_world.wan.t5 import (
    T5_TINY,
    UMT5_XXL,
    T5Geometry,
    UMT5Encoder,
    encode_prompts,
    relative_position_buckets,
)
from comfyui_lingbot_world.wan.tokenizer import PromptTruncatedWarning, TokenizerError, UMT5Tokenizer

# The official file's keys for one block, as the reference encoder (shared_pos=False) names them.
OFFICIAL_BLOCK_KEYS = {
    "norm1.weight",
    "attn.q.weight",
    "attn.k.weight",
    "attn.v.weight",
    "attn.o.weight",
    "norm2.weight",
    "ffn.gate.0.weight",
    "ffn.fc1.weight",
    "ffn.fc2.weight",
    "pos_embedding.embedding.weight",
}


def official_keys(layers: int) -> set[str]:
    keys = {"token_embedding.weight", "norm.weight"}
    return keys | {f"blocks.{i}.{k}" for i in range(layers) for k in OFFICIAL_BLOCK_KEYS}


def random_encoder(geometry: T5Geometry = T5_TINY, seed: int = 0) -> UMT5Encoder:
    """Weights large enough that position bias, logit scale and norm weights all matter."""
    torch.manual_seed(seed)
    encoder = UMT5Encoder(geometry).eval()
    with torch.no_grad():
        for key, p in encoder.named_parameters():
            if key.endswith(("norm.weight", "norm1.weight", "norm2.weight")):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "embedding" in key:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, 0.4)
    return encoder


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


@pytest.fixture(scope="module")
def t5_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_t5_checkpoint(tmp_path_factory.mktemp("t5") / "models_t5_umt5-xxl-enc-bf16.pth", T5_TINY, seed=3)


# ---------------------------------------------------------------- geometry and construction


def test_presets() -> None:
    assert T5_TINY.dim == dit_config.TINY.text_dim
    assert (UMT5_XXL.vocab_size, UMT5_XXL.dim, UMT5_XXL.dim_ffn, UMT5_XXL.num_heads) == (256384, 4096, 10240, 64)
    assert (UMT5_XXL.num_layers, UMT5_XXL.num_buckets, UMT5_XXL.head_dim) == (24, 32, 64)


def test_meta_build_of_xxl_allocates_nothing_and_has_official_keys() -> None:
    with torch.device("meta"):
        encoder = UMT5Encoder(UMT5_XXL)
    sd = encoder.state_dict()
    assert all(t.is_meta for t in sd.values())
    assert set(sd) == official_keys(24)
    assert sd["token_embedding.weight"].shape == (256384, 4096)
    assert sd["blocks.23.pos_embedding.embedding.weight"].shape == (32, 64)
    assert sd["blocks.0.ffn.fc2.weight"].shape == (4096, 10240)
    assert sum(t.numel() for t in sd.values()) * 2 / 1e9 == pytest.approx(11.4, abs=0.1)  # bf16 bytes
    assert T5Geometry.from_state_dict(sd) == UMT5_XXL


def test_geometry_read_from_shapes() -> None:
    odd = T5Geometry(vocab_size=300, dim=24, dim_attn=16, dim_ffn=40, num_heads=2, num_layers=3, num_buckets=16)
    with torch.device("meta"):
        assert T5Geometry.from_state_dict(UMT5Encoder(odd).state_dict()) == odd
        sd = UMT5Encoder(T5_TINY).state_dict()
    assert T5Geometry.from_state_dict(sd) == T5_TINY
    del sd["blocks.0.pos_embedding.embedding.weight"]
    with pytest.raises(ValueError, match="blocks.0.pos_embedding.embedding.weight"):
        T5Geometry.from_state_dict(sd)


# ---------------------------------------------------------------- the math, against transformers


def to_hf(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    names = {
        "norm1.weight": "layer.0.layer_norm.weight",
        "attn.q.weight": "layer.0.SelfAttention.q.weight",
        "attn.k.weight": "layer.0.SelfAttention.k.weight",
        "attn.v.weight": "layer.0.SelfAttention.v.weight",
        "attn.o.weight": "layer.0.SelfAttention.o.weight",
        "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
        "norm2.weight": "layer.1.layer_norm.weight",
        "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",  # the GELU branch
        "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight",  # the linear branch
        "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
    }
    out = {
        "shared.weight": sd["token_embedding.weight"],
        "encoder.embed_tokens.weight": sd["token_embedding.weight"],
        "encoder.final_layer_norm.weight": sd["norm.weight"],
    }
    for key, value in sd.items():
        if key.startswith("blocks."):
            _, index, leaf = key.split(".", 2)
            out[f"encoder.block.{index}.{names[leaf]}"] = value
    return out


def hf_encoder(sd: dict[str, torch.Tensor], g: T5Geometry):
    from transformers import UMT5Config, UMT5EncoderModel

    cfg = UMT5Config(
        vocab_size=g.vocab_size,
        d_model=g.dim,
        d_kv=g.head_dim,
        d_ff=g.dim_ffn,
        num_layers=g.num_layers,
        num_heads=g.num_heads,
        relative_attention_num_buckets=g.num_buckets,
        relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
        layer_norm_epsilon=1e-6,
    )
    assert cfg.is_gated_act
    model = UMT5EncoderModel(cfg).eval()
    missing, unexpected = model.load_state_dict(to_hf(sd), strict=True)
    assert not missing and not unexpected
    return model


def test_matches_transformers_umt5_encoder() -> None:
    encoder = random_encoder()
    hf = hf_encoder(encoder.state_dict(), T5_TINY)
    gen = torch.Generator().manual_seed(1)
    length = 40  # beyond the 8 exact buckets per side: log-spaced buckets are exercised
    ids = torch.randint(3, T5_TINY.vocab_size, (3, length), generator=gen)
    mask = torch.ones(3, length, dtype=torch.long)
    mask[1, 25:] = 0
    mask[2, 7:] = 0
    ids[mask == 0] = 0
    with torch.no_grad():
        ours = encoder(ids, mask)
        ref = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    assert ours.dtype == torch.float32 and ours.shape == (3, length, T5_TINY.dim)
    keep = mask.bool()
    err = (ours[keep] - ref[keep]).norm() / ref[keep].norm()
    assert err < 1e-4, f"relative error {err:.2e}"


def test_relative_buckets_match_transformers_at_long_range() -> None:
    from transformers import UMT5Config
    from transformers.models.umt5.modeling_umt5 import UMT5Attention

    cfg = UMT5Config(d_model=8, d_kv=2, num_heads=4, relative_attention_num_buckets=32)
    hf_attn = UMT5Attention(cfg, has_relative_attention_bias=True)
    pos = torch.arange(300)
    expected = hf_attn._relative_position_bucket(pos[None, :] - pos[:, None])
    assert torch.equal(relative_position_buckets(300, 32), expected)


def test_half_precision_forward() -> None:
    encoder = random_encoder()
    ids = torch.randint(3, T5_TINY.vocab_size, (2, 12))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        full = encoder(ids, mask)
        half = encoder.to(torch.bfloat16)(ids, mask)
    assert half.dtype == torch.bfloat16 and torch.isfinite(half).all()
    assert (half.float() - full).norm() / full.norm() < 0.05


# ---------------------------------------------------------------- loader


def test_loader_round_trip(t5_file: Path) -> None:
    stored = torch.load(t5_file, map_location="cpu", weights_only=True)
    assert set(stored) == official_keys(T5_TINY.num_layers)
    assert all(t.dtype == torch.bfloat16 for t in stored.values())

    loaded = load_t5(t5_file, "cpu", torch.float32)
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())
    assert loaded.geometry == T5_TINY and loaded.dtype == torch.float32
    reference = UMT5Encoder(T5_TINY).eval()
    reference.load_state_dict({k: v.float() for k, v in stored.items()})
    ids = torch.randint(3, T5_TINY.vocab_size, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    with torch.no_grad():
        out = loaded(ids, mask)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, reference(ids, mask), rtol=0, atol=0)

    as_bf16 = load_t5(t5_file, "cpu")
    assert as_bf16.dtype == torch.bfloat16
    assert torch.equal(as_bf16.blocks[1].attn.q.weight, stored["blocks.1.attn.q.weight"])


def test_loader_accepts_wrapped_state_dict(t5_file: Path, tmp_path: Path) -> None:
    wrapped = tmp_path / "wrapped.pth"
    torch.save({"state_dict": torch.load(t5_file, weights_only=True)}, wrapped)
    assert load_t5(wrapped, "cpu").geometry == T5_TINY


def test_synthetic_checkpoint_is_deterministic(tmp_path: Path) -> None:
    a = torch.load(write_t5_checkpoint(tmp_path / "a.pth", T5_TINY, seed=5), weights_only=True)
    b = torch.load(write_t5_checkpoint(tmp_path / "b.pth", T5_TINY, seed=5), weights_only=True)
    c = torch.load(write_t5_checkpoint(tmp_path / "c.pth", T5_TINY, seed=6), weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["blocks.0.attn.k.weight"], c["blocks.0.attn.k.weight"])
    assert torch.equal(a["norm.weight"], torch.ones(T5_TINY.dim, dtype=torch.bfloat16))
    assert not list(tmp_path.glob("*.partial"))


def test_loader_error_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.pth"
    with pytest.raises(CheckpointError, match="not found") as info:
        load_t5(path, "cpu")
    assert str(path) in str(info.value)


def test_loader_error_truncated_file(t5_file: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.pth"
    data = t5_file.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated, corrupt") as info:
        load_t5(cut, "cpu")
    assert str(cut) in str(info.value)


def test_loader_error_renamed_key(t5_file: Path, tmp_path: Path) -> None:
    sd = torch.load(t5_file, weights_only=True)
    sd["blocks.1.attn.query.weight"] = sd.pop("blocks.1.attn.q.weight")
    bad = tmp_path / "renamed.pth"
    torch.save(sd, bad)
    with pytest.raises(CheckpointError) as info:
        load_t5(bad, "cpu")
    message = str(info.value)
    assert str(bad) in message
    assert "missing key(s): blocks.1.attn.q.weight" in message
    assert "unexpected key(s): blocks.1.attn.query.weight" in message


def test_loader_error_shape_mismatch(t5_file: Path, tmp_path: Path) -> None:
    sd = torch.load(t5_file, weights_only=True)
    sd["blocks.1.ffn.fc2.weight"] = sd["blocks.1.ffn.fc2.weight"][:, :10].clone()
    bad = tmp_path / "shape.pth"
    torch.save(sd, bad)
    with pytest.raises(CheckpointError) as info:
        load_t5(bad, "cpu")
    message = str(info.value)
    assert str(bad) in message and "blocks.1.ffn.fc2.weight" in message and "(32, 10)" in message


def test_loader_error_not_an_encoder_or_not_tensors(tmp_path: Path) -> None:
    other = tmp_path / "vae.pth"
    torch.save({"encoder.conv1.weight": torch.zeros(2)}, other)
    with pytest.raises(CheckpointError, match="token_embedding.weight") as info:
        load_t5(other, "cpu")
    assert str(other) in str(info.value)

    pickled = tmp_path / "objects.pth"
    torch.save({"config": Path("x")}, pickled)  # a Python object the weights-only loader refuses
    with pytest.raises(CheckpointError, match="other than tensors") as info:
        load_t5(pickled, "cpu")
    assert str(pickled) in str(info.value)


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_eos_padding_and_mask(tokenizer_dir: Path) -> None:
    tok = UMT5Tokenizer(tokenizer_dir)
    assert tok.vocab_size == T5_TINY.vocab_size
    ids, mask = tok(["the dog runs", ""], max_len=10)
    assert ids.dtype == torch.long and ids.shape == mask.shape == (2, 10)
    assert mask[0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    assert ids[0, 3] == tok.eos_id == 1 and (ids[0, 4:] == tok.pad_id).all() and tok.pad_id == 0
    assert ids[1].tolist() == [1] + [0] * 9 and mask[1].sum() == 1  # an empty prompt is just </s>


def test_tokenizer_matches_transformers(tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    texts = ["A red car drives down the road at sunset.", "camera moves forward, 42 trees!"]
    ids, mask = UMT5Tokenizer(tokenizer_dir)(texts, max_len=32)
    ref = AutoTokenizer.from_pretrained(str(tokenizer_dir))(
        texts, padding="max_length", truncation=True, max_length=32, return_tensors="pt"
    )
    assert torch.equal(ids, ref.input_ids) and torch.equal(mask, ref.attention_mask)


def test_real_t5_tokenizer_json_matches_transformers() -> None:
    """ComfyUI ships a real T5 tokenizer.json (same format as umT5's): check our reading of it."""
    from comfy_host import comfy_root
    from transformers import AutoTokenizer

    root = comfy_root()
    folder = Path(root or ".") / "comfy" / "text_encoders" / "t5_tokenizer"
    if root is None or not (folder / "tokenizer.json").is_file():
        pytest.skip(f"no T5 tokenizer at {folder}")
    texts = ["A red car drives down the road at sunset.", "Ünïcode text, 東京, and </s> inside"]
    ids, mask = UMT5Tokenizer(folder)(texts, max_len=24)
    ref = AutoTokenizer.from_pretrained(str(folder))(
        texts, padding="max_length", truncation=True, max_length=24, return_tensors="pt"
    )
    assert torch.equal(ids, ref.input_ids) and torch.equal(mask, ref.attention_mask)


def test_tokenizer_cleans_whitespace_and_html(tokenizer_dir: Path) -> None:
    tok = UMT5Tokenizer(tokenizer_dir)
    messy, _ = tok(["  the\tdog \n\n runs &amp;amp; jumps  "], max_len=16)
    clean, _ = tok(["the dog runs & jumps"], max_len=16)
    assert torch.equal(messy, clean)


def test_tokenizer_truncates_with_warning(tokenizer_dir: Path) -> None:
    tok = UMT5Tokenizer(tokenizer_dir)
    fits = " ".join(["dog"] * 511)  # 511 words + </s> = exactly 512
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ids, mask = tok([fits])
    assert mask.sum() == 512 and ids[0, -1] == tok.eos_id

    long = "sunset over the " + " ".join(["dog"] * 600)
    with pytest.warns(PromptTruncatedWarning, match=r"'sunset over the dog.*' has 604 tokens") as caught:
        ids, mask = tok([long, "the cat"])
    assert "512" in str(caught[0].message)
    assert ids.shape == (2, 512) and mask[0].all() and ids[0, -1] == tok.eos_id
    assert mask[1].sum() == 3


def test_sentencepiece_fallback(tmp_path: Path) -> None:
    import sentencepiece

    corpus = ["the quick brown fox jumps over the lazy dog", "a red car drives down the road at sunset"] * 40
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_prefix=str(tmp_path / "spiece"), vocab_size=40, hard_vocab_limit=False,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2,
    )
    tok = UMT5Tokenizer(tmp_path)
    ids, mask = tok(["the  red fox"], max_len=12)
    n = int(mask.sum())
    assert ids[0, n - 1] == 1 and (ids[0, n:] == 0).all()
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spiece.model"))
    assert sp.decode(ids[0, : n - 1].tolist()) == "the red fox"
    assert tok.vocab_size == sp.get_piece_size()

    write_tokenizer(tmp_path)  # tokenizer.json, when present, wins over spiece.model
    assert UMT5Tokenizer(tmp_path).vocab_size == T5_TINY.vocab_size


def test_tokenizer_errors_name_folder_and_files(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_tokenizer"
    with pytest.raises(TokenizerError, match="does not exist") as info:
        UMT5Tokenizer(missing)
    assert str(missing) in str(info.value) and "tokenizer.json" in str(info.value)

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TokenizerError) as info:
        UMT5Tokenizer(empty)
    assert str(empty) in str(info.value)
    assert "tokenizer.json" in str(info.value) and "spiece.model" in str(info.value)

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot be read") as info:
        UMT5Tokenizer(broken)
    assert str(broken / "tokenizer.json") in str(info.value)


def test_synthetic_tokenizer_is_deterministic_and_sized(tmp_path: Path) -> None:
    a, b = write_tokenizer(tmp_path / "a"), write_tokenizer(tmp_path / "b")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert UMT5Tokenizer(write_tokenizer(tmp_path / "big", vocab_size=1000)).vocab_size == 1000
    with pytest.raises(ValueError, match="vocab_size=10"):
        write_tokenizer(tmp_path / "small", vocab_size=10)


# ---------------------------------------------------------------- encode_prompts


def test_encode_prompts_trims_to_true_length(tokenizer_dir: Path) -> None:
    tok = UMT5Tokenizer(tokenizer_dir)
    encoder = random_encoder()
    prompts = ["a dog runs on the beach at sunset", "cat", ""]
    out = encode_prompts(encoder, tok, prompts, "cpu")
    _, mask = tok(prompts)
    lengths = mask.sum(dim=1).tolist()
    assert [e.shape for e in out] == [(n, T5_TINY.dim) for n in lengths]
    # Equal to running the fully padded 512-token batch, then cutting the padding off.
    ids, mask = tok(prompts, max_len=512)
    with torch.no_grad():
        full = encoder(ids, mask)
    for e, f, n in zip(out, full, lengths):
        torch.testing.assert_close(e, f[:n], rtol=1e-5, atol=1e-5)
        assert e.untyped_storage().nbytes() == e.numel() * e.element_size()  # not a view of the batch

    small = random_encoder(T5Geometry(50, dim=32, dim_attn=32, dim_ffn=64, num_heads=4, num_layers=1, num_buckets=32))
    with pytest.raises(ValueError, match="vocabulary of 50"):
        encode_prompts(small, tok, ["sunset over the mountains"], "cpu")
