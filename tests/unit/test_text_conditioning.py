"""pipeline/text_conditioning.py: core CONDITIONING (CLIP Text Encode with umT5) to the pack's
prompt embeddings, padding cut off."""
from __future__ import annotations

import pytest
import torch

from node_runs import core_conditioning
from comfyui_lingbot_world.pipeline.text_conditioning import text_from_conditioning


def test_text_from_conditioning_trims_the_padding():
    pos, neg = torch.randn(7, 32), torch.randn(3, 32)
    for mask in (False, True):
        text = text_from_conditioning(core_conditioning(pos, mask=mask), core_conditioning(neg, mask=mask))
        assert torch.equal(text.positive, pos) and torch.equal(text.negative, neg)
    unpadded = text_from_conditioning(core_conditioning(pos, pad_to=0), core_conditioning(neg, pad_to=0))
    assert torch.equal(unpadded.positive, pos)
    with pytest.raises(ValueError, match="negative: connect"):
        text_from_conditioning(core_conditioning(pos), None)
    with pytest.raises(ValueError, match="positive: holds 2 conditionings"):
        text_from_conditioning(core_conditioning(pos) * 2, core_conditioning(neg))
    with pytest.raises(ValueError, match="negative: expected a CONDITIONING"):
        text_from_conditioning(core_conditioning(pos), "blurry")
