"""Per-run attention backend choice: scoped to the run, auto's rule by GPU generation."""
from __future__ import annotations

import threading

import pytest
import torch

from comfyui_lingbot_world.wan.runtime import attention as attn


@pytest.mark.parametrize("capability,installed,expected", [
    ((9, 0), True, "sdpa"),  # Hopper: SDPA measured faster than sageattention 1.0.6
    ((10, 0), True, "sdpa"),
    ((8, 9), True, "sage"),  # RTX 40
    ((8, 6), True, "sage"),  # RTX 30
    ((8, 6), False, "sdpa"),
    ((8, 0), True, "sdpa"),  # A100: not known faster
    (None, True, "sdpa"),  # CPU
])
def test_auto_rule(capability, installed, expected):
    assert attn.auto_backend(capability, installed) == expected


def test_choice_is_scoped_to_the_block_and_thread(monkeypatch):
    monkeypatch.delenv(attn.ENV_VAR, raising=False)
    attn.reset_backend_choice()
    seen = {}
    with attn.attention_backend("auto"):
        assert attn.backend_name("cpu") == "sdpa"
        other = threading.Thread(target=lambda: seen.setdefault("thread", attn._RUN_CHOICE.get()))
        other.start()
        other.join()
        assert attn._RUN_CHOICE.get() == "auto"
    assert attn._RUN_CHOICE.get() is None
    assert seen["thread"] is None  # another thread (another run) does not see this run's choice


def test_bad_or_impossible_choices_are_refused():
    with pytest.raises(ValueError, match="xformers"):
        with attn.attention_backend("xformers"):
            pass
    q = torch.randn(1, 4, 2, 8)
    with attn.attention_backend("sage"), pytest.raises(RuntimeError, match="needs CUDA"):
        attn.attention(q, q, q)


def test_sdpa_choice_matches_the_default_on_cpu(monkeypatch):
    monkeypatch.delenv(attn.ENV_VAR, raising=False)
    attn.reset_backend_choice()
    q, k, v = (torch.randn(1, 6, 2, 8) for _ in range(3))
    with attn.attention_backend("sdpa"):
        chosen = attn.attention(q, k, v)
    assert torch.equal(chosen, attn.attention(q, k, v))
