"""Synthetic umT5 files for tests and CI: a small tokenizer folder and random-weight encoders.

The files have the official formats and key names, so the real loaders read them unchanged.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import string
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

import torch

from ...loaders.new_file import new_file, write_json
from ...wan.geometry import MAX_TOKENS
from ...wan.t5 import T5_TINY, T5Geometry, UMT5Encoder, initial_std

# umT5's special ids; the pieces of a synthetic vocabulary follow them.
SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
WORD_START = "\u2581"  # SentencePiece's word-start marker

_COMMON_WORDS = """
the a an and or of to in on at by for with from into over under up down out off near far
is are was were be been being has have had do does did not no yes this that these those
it its he she they we you i my your his her their our me him them us
one two three four five six seven eight nine ten many few some all every each other
big small large tiny long short tall wide narrow high low old new young bright dark light
red green blue yellow white black gray grey orange purple pink brown golden silver
man woman person people child boy girl dog cat bird horse fish car road street city house
tree trees forest river lake sea ocean water sky cloud clouds sun moon star stars snow rain
mountain mountains hill field grass flower flowers stone rock sand beach desert island
walk walks walking run runs running fly flies flying move moves moving turn turns look
camera view scene shot frame video image photo style light shadow motion slowly quickly
left right forward backward around through across along behind front side top bottom
day night morning evening sunset sunrise winter summer spring autumn fire smoke wind
quality blurry static still overall worst best detailed realistic cinematic
""".split()


def _pieces(vocab_size: int) -> list[tuple[str, float]]:
    """Special tokens, single characters (so any ASCII text encodes), words, then filler."""
    # Unigram picks the segmentation with the highest total score: words beat spelling.
    core: list[tuple[str, float]] = [(token, 0.0) for token in SPECIAL_TOKENS]
    core.append((WORD_START, -6.0))
    core += [(ch, -10.0) for ch in string.ascii_letters + string.digits + string.punctuation]
    seen = {piece for piece, _ in core}
    for rank, word in enumerate(dict.fromkeys(_COMMON_WORDS)):
        core.append((WORD_START + word, -4.0 - 0.001 * rank))
        seen.add(WORD_START + word)
    if vocab_size < len(core):
        raise ValueError(f"vocab_size={vocab_size} is below the {len(core)} pieces every synthetic tokenizer needs")
    # Filler: short letter strings, in a fixed order, until the vocabulary is full.
    filler: list[tuple[str, float]] = []
    for length in itertools.count(2):
        for letters in itertools.product(string.ascii_lowercase, repeat=length):
            if len(core) + len(filler) == vocab_size:
                return core + filler
            piece = WORD_START + "".join(letters)
            if piece not in seen:
                filler.append((piece, -8.0 - 0.0001 * len(filler)))
    raise AssertionError("unreachable")


def write_tokenizer(folder: Path, vocab_size: int | None = None) -> Path:
    """Write a deterministic T5-style tokenizer folder; returns ``folder``.

    ``vocab_size`` defaults to ``T5_TINY.vocab_size`` so the tokenizer fits the tiny encoder.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab_size = T5_TINY.vocab_size if vocab_size is None else vocab_size
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.Unigram(_pieces(vocab_size), unk_id=UNK_ID, byte_fallback=False))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=WORD_START, prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement=WORD_START, prepend_scheme="always")
    # What the Hugging Face T5 tokenizer does with add_special_tokens=True: append </s>.
    tok.post_processor = processors.TemplateProcessing(
        single=["$A", "</s>"], pair=["$A", "</s>", "$B", "</s>"], special_tokens=[("</s>", EOS_ID)]
    )
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS])
    with new_file(folder / "tokenizer.json") as partial:  # each file new: never into a linked release file
        tok.save(str(partial))

    specials = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
    flags = {"special": True, "normalized": False, "lstrip": False, "rstrip": False, "single_word": False}
    config = {
        **specials,
        "tokenizer_class": "T5Tokenizer",
        "model_max_length": MAX_TOKENS,
        "extra_ids": 0,
        "added_tokens_decoder": {
            str(i): {"content": t, **flags} for i, t in enumerate(SPECIAL_TOKENS)
        },
    }
    write_json(folder / "tokenizer_config.json", config)
    write_json(folder / "special_tokens_map.json", specials)
    return folder


# Elements per independently seeded piece of a tensor. Fixed, so the file depends on the
# seed alone and not on how many threads drew it.
_CHUNK = 1 << 24


def write_t5_checkpoint(path: Path, geometry: T5Geometry, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write a random-weight encoder as a plain ``torch.save`` state dict with the official keys.

    Values follow the umT5 initial scales (``wan.t5.initial_std``), drawn directly in
    ``dtype`` (no float32 copy) in parallel chunks, so the peak memory is about the file size
    and umT5-XXL takes seconds to draw. The file is written beside ``path`` and renamed, so
    an interrupted write never leaves a half file under the final name.
    """
    path = Path(path)
    tensors = draw_t5_weights(geometry, seed, dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    with new_file(path) as partial:
        torch.save(tensors, partial)
    return path


def draw_t5_weights(geometry: T5Geometry, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """The random weights of ``write_t5_checkpoint`` by official key (same seed, same values)."""
    with torch.device("meta"):
        shapes = UMT5Encoder(geometry).state_dict()
    tensors: dict[str, torch.Tensor] = {}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for key, meta in shapes.items():
            tensor = torch.empty(meta.shape, dtype=dtype)
            std = initial_std(key, geometry)
            if std is None:
                tensor.fill_(1.0)
            else:
                _draw_normal(tensor, std, f"{seed}/{key}", pool)
            tensors[key] = tensor
    return tensors


# --------------------------------------------------------------------- ComfyUI's umT5 files

# Formats of ``write_comfy_t5``: the names of the files ComfyUI users have, bf16 standing in
# for fp16 (exact against the bf16 .pth). fp8_scaled is the Comfy-Org file's encoding
# (marker ``scaled_fp8`` + ``<layer>.scale_weight``); fp8_comfy_quant the newer one
# (``<layer>.weight_scale`` + ``<layer>.comfy_quant``).
COMFY_T5_FILES = {
    "bf16": "umt5_xxl_bf16.safetensors",
    "fp8_scaled": "umt5_xxl_fp8_e4m3fn_scaled.safetensors",
    "fp8_comfy_quant": "umt5_xxl_fp8_e4m3fn_comfy_quant.safetensors",
}
FP8_MAX = 448.0  # largest finite float8_e4m3fn
# The corpus the tiny SentencePiece model is trained on: sentences of _COMMON_WORDS.
_CORPUS_SENTENCES = 2000


def _corpus() -> list[str]:
    words = list(dict.fromkeys(_COMMON_WORDS))
    # a fixed walk through the word list: deterministic, and every word occurs many times
    return [" ".join(words[(i * 7 + j * 13) % len(words)] for j in range(3 + i % 9)) for i in range(_CORPUS_SENTENCES)]


def train_sentencepiece(vocab_size: int = 512) -> bytes:
    """A real (small) umT5-style SentencePiece model, trained now: pad 0, eos 1, unk 2, no bos.

    The vocabulary may come out smaller than ``vocab_size`` (the corpus is small); it never
    exceeds it, so the ids fit an encoder of that vocabulary.
    """
    import io

    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus()), model_writer=model, model_type="unigram",
        vocab_size=vocab_size, hard_vocab_limit=False, character_coverage=1.0,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, num_threads=1, shuffle_input_sentence=False,
        minloglevel=2,
    )
    return model.getvalue()


def _is_linear(official_key: str) -> bool:
    return official_key.endswith(("attn.q.weight", "attn.k.weight", "attn.v.weight", "attn.o.weight",
                                  "ffn.gate.0.weight", "ffn.fc1.weight", "ffn.fc2.weight"))


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor scaled float8_e4m3fn: (fp8 weight, float32 scale) with weight ~ fp8 * scale."""
    w = weight.float()
    scale = (w.abs().amax() / FP8_MAX).clamp(min=1e-12)
    return (w / scale).to(torch.float8_e4m3fn), scale.reshape(())


def comfy_t5_tensors(geometry: T5Geometry, seed: int = 0, fmt: str = "bf16",
                     tokenizer: bytes | None = None) -> dict[str, torch.Tensor]:
    """``draw_t5_weights`` under ComfyUI's key names, in format ``fmt`` (see COMFY_T5_FILES)."""
    from ...loaders.comfy_t5 import SCALED_FP8_MARKER, TOKENIZER_KEY, comfy_key

    if fmt not in COMFY_T5_FILES:
        raise ValueError(f"format {fmt!r}: choose one of {', '.join(COMFY_T5_FILES)}")
    out: dict[str, torch.Tensor] = {}
    for key, tensor in draw_t5_weights(geometry, seed).items():
        name = comfy_key(key)
        if fmt == "bf16" or not _is_linear(key):
            out[name] = tensor
            continue
        layer = name[: -len(".weight")]
        out[name], scale = quantize_fp8(tensor)
        if fmt == "fp8_scaled":
            out[f"{layer}.scale_weight"] = scale
        else:
            out[f"{layer}.weight_scale"] = scale
            conf = json.dumps({"format": "float8_e4m3fn"}).encode()
            out[f"{layer}.comfy_quant"] = torch.tensor(list(conf), dtype=torch.uint8)
    if fmt == "fp8_scaled":
        out[SCALED_FP8_MARKER] = torch.empty(0, dtype=torch.float8_e4m3fn)
    if tokenizer is None:
        tokenizer = train_sentencepiece(min(geometry.vocab_size, 512))
    out[TOKENIZER_KEY] = torch.frombuffer(bytearray(tokenizer), dtype=torch.uint8)
    return out


def write_comfy_t5(path: Path, geometry: T5Geometry, seed: int = 0, fmt: str = "bf16",
                   tokenizer: bytes | None = None) -> Path:
    """Write a random-weight umT5 in ComfyUI's layout (HF key names, ``spiece_model`` inside).

    The weights equal ``write_t5_checkpoint``'s for the same seed (bf16; fp8 formats hold
    them quantized). Written beside ``path`` and renamed, as the .pth writer does.
    """
    from safetensors.torch import save_file

    path = Path(path)
    tensors = comfy_t5_tensors(geometry, seed, fmt, tokenizer)
    path.parent.mkdir(parents=True, exist_ok=True)
    with new_file(path) as partial:
        save_file(tensors, str(partial), metadata={"format": "pt"})
    return path


def _draw_normal(tensor: torch.Tensor, std: float, label: str, pool: Executor) -> None:
    flat = tensor.view(-1)

    def draw(start: int) -> None:
        digest = hashlib.sha256(f"{label}/{start}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        flat[start : start + _CHUNK].normal_(0.0, std, generator=generator)

    list(pool.map(draw, range(0, flat.numel(), _CHUNK)))  # list(): re-raise any worker error
