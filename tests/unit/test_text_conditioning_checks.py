"""A core CONDITIONING is checked where it becomes the pack's embeddings:
an empty one no longer runs silently, a NaN one is not blamed on the expert file."""
from __future__ import annotations

import pytest
import torch

from comfyui_lingbot_world.pipeline.guards import NonFiniteError
from comfyui_lingbot_world.pipeline.text_conditioning import text_from_conditioning


def conditioning(embedding: torch.Tensor) -> list:
    return [[embedding, {"pooled_output": None}]]


GOOD = conditioning(torch.randn(1, 12, 32))


@pytest.mark.parametrize("field", ["positive", "negative"])
@pytest.mark.parametrize("shape", [(1, 0, 32), (1, 12, 0)], ids=["no-tokens", "no-features"])
def test_empty_conditioning_is_refused_naming_its_input(field, shape):
    inputs = {"positive": GOOD, "negative": GOOD, field: conditioning(torch.zeros(shape))}
    with pytest.raises(ValueError, match=rf"^{field}: the CONDITIONING is empty"):
        text_from_conditioning(**inputs)


@pytest.mark.parametrize("field", ["positive", "negative"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_conditioning_is_blamed_on_the_text_encoder_not_the_expert(field, bad):
    embedding = torch.randn(1, 12, 32)
    embedding[0, 3, 5] = bad
    inputs = {"positive": GOOD, "negative": GOOD, field: conditioning(embedding)}
    with pytest.raises(NonFiniteError, match=rf"^{field}: the CONDITIONING .*text encoder") as caught:
        text_from_conditioning(**inputs)
    assert "expert" not in str(caught.value)


def test_all_zero_positive_is_refused_and_all_zero_negative_kept():
    zeros = conditioning(torch.zeros(1, 512, 32))
    with pytest.raises(ValueError, match="positive: the CONDITIONING is all zeros"):
        text_from_conditioning(zeros, GOOD)
    text = text_from_conditioning(GOOD, zeros)  # Conditioning Zero Out as the negative: no negative prompt
    assert text.negative.shape == (1, 32) and not text.negative.any()
