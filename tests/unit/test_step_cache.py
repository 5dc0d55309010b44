"""Step caching (EasyCache rule) and CFG truncation: the mechanism, on scripted models."""
from __future__ import annotations

import pytest
import torch

from stand_in_dit import TinyDiT

from comfyui_lingbot_world.pipeline.image import I2VCondition
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, expert_for, initial_noise, sample
from comfyui_lingbot_world.pipeline.step_cache import EasyCacheRule, StepPolicy, StepStats, truncated_steps
from comfyui_lingbot_world.pipeline.text import TextEmbeddings
from comfyui_lingbot_world.wan.scheduler import make_sampler


class ScriptedExpert:
    """branches(): conditional output full(10 + 2 * i) and unconditional full(-i) for an input full(i)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool]] = []

    def branches(self, latent, timestep, uncond, batch_cfg):
        i = float(latent.flatten()[0])
        self.calls.append((round(i), uncond))
        cond = torch.full_like(latent, 10 + 2 * i)
        return cond, (torch.full_like(latent, -i) if uncond else None)

    def velocity(self, latent, timestep, guide, batch_cfg):
        cond, un = self.branches(latent, timestep, True, batch_cfg)
        return (un + guide * (cond - un)).float()


def test_rule_skips_exactly_the_predicted_steps():
    # |dx| = 1 per step, k = 2, last output 10 + 2j: predicted change 2 / (10 + 2j) per step.
    rule = EasyCacheRule(threshold=0.25, warmup=2)
    computed = []
    for i in range(10):
        x = torch.full((4, 3), float(i))
        if rule.decide(x, i, last_in_expert=i == 9):
            computed.append(i)
            rule.computed(x, torch.full((4, 3), 10.0 + 2 * i))
    # 0,1 warm-up; 2: 2/12 skip; 3: 4/12 >= .25 compute; 4: 2/16 skip; 5: .25 compute;
    # 6: .1, 7: .2 skip; 8: .3 compute; 9: last step computed.
    assert computed == [0, 1, 3, 5, 8, 9]


def test_policy_reuses_each_branch_transformation_and_counts():
    expert, stats = ScriptedExpert(), StepStats()
    policy = StepPolicy(10, cache_threshold=0.25, cache_warmup=2, stats=stats)
    guide = 3.0
    for i in range(10):
        x = torch.full((4, 3), float(i))
        v = policy.velocity(expert, x, 1000.0 - i, guide, i, i, i == 9)
        if i == 2:  # skipped: x + (output - input) of step 1, per branch
            cond, un = 2 + (12 - 1), 2 + (-1 - 1)
            assert torch.equal(v, torch.full((4, 3), un + guide * (cond - un)))
    assert stats.computed_steps == [0, 1, 3, 5, 8, 9]
    assert stats.cached_steps == [2, 4, 6, 7]
    assert [c[0] for c in expert.calls] == [0, 1, 3, 5, 8, 9]
    assert stats.forwards == 12 and stats.skipped_forwards == 8 and stats.truncated_forwards == 0
    # Every judged step's predicted change, as worked out in the rule test above.
    expected = [(2, 2 / 12), (3, 2 / 12), (4, 2 / 16), (5, 2 / 16), (6, 2 / 20), (7, 2 / 20), (8, 2 / 20)]
    assert [i for i, _ in stats.predicted_changes] == [i for i, _ in expected]
    assert [c for _, c in stats.predicted_changes] == pytest.approx([c for _, c in expected])


def test_policy_reset_at_expert_switch_warms_up_again():
    expert = ScriptedExpert()
    policy = StepPolicy(8, cache_threshold=10.0, cache_warmup=2)
    names = ["high"] * 4 + ["low"] * 4
    in_expert = 0
    for i, name in enumerate(names):
        if i and names[i - 1] != name:
            policy.expert_changed()
            in_expert = 0
        last = i + 1 == len(names) or names[i + 1] != name
        policy.velocity(expert, torch.full((2,), float(i)), 0.0, 5.0, i, in_expert, last)
        in_expert += 1
    # Per expert: 2 warm-up, one skipped (huge threshold), last step computed.
    assert policy.stats.computed_steps == [0, 1, 3, 4, 5, 7]
    assert policy.stats.cached_steps == [2, 6]


@pytest.mark.parametrize("steps,fraction,dropped", [(8, 0.25, 2), (10, 0.5, 5), (7, 0.0, 0), (4, 1.0, 4)])
def test_cfg_truncation_drops_exactly_the_last_unconditional_branches(steps, fraction, dropped):
    expert = ScriptedExpert()
    policy = StepPolicy(steps, cfg_truncate=fraction)
    for i in range(steps):
        v = policy.velocity(expert, torch.full((2,), float(i)), 0.0, 4.0, i, i, i == steps - 1)
        if i >= steps - dropped:  # the conditional prediction alone
            assert torch.equal(v, torch.full((2,), 10.0 + 2 * i))
    assert truncated_steps(steps, fraction) == dropped
    assert [u for _, u in expert.calls] == [True] * (steps - dropped) + [False] * dropped
    assert policy.stats.forwards == 2 * steps - dropped
    assert policy.stats.truncated_forwards == dropped


def test_guide_one_counts_one_forward_per_step():
    expert = ScriptedExpert()
    policy = StepPolicy(3)
    for i in range(3):
        policy.velocity(expert, torch.zeros(2), 0.0, 1.0, i, i, i == 2)
    assert policy.stats.forwards == 3 and [u for _, u in expert.calls] == [False] * 3


def test_bad_fast_settings_are_refused():
    with pytest.raises(ValueError, match="cfg_truncate"):
        SamplingParams(cfg_truncate=1.5)
    with pytest.raises(ValueError, match="cache_threshold"):
        SamplingParams(cache_threshold=-0.1)
    with pytest.raises(ValueError, match="attention"):
        SamplingParams(attention="xformers")


# --------------------------------------------------------------------------- through sample()

class TinyExperts:
    def __init__(self) -> None:
        self.models = {"high": TinyDiT(1), "low": TinyDiT(2)}

    def acquire(self, name):
        return self.models[name]

    def release(self, name):
        pass


def _inputs():
    g = torch.Generator().manual_seed(5)
    text = TextEmbeddings(positive=torch.randn(6, 8, generator=g), negative=torch.randn(6, 8, generator=g),
                          from_cache=False)
    condition = I2VCondition(y=torch.randn(20, 3, 4, 6, generator=g), frames=9, height=32, width=48)
    return text, condition


def _exact_reference(experts, text, condition, params, device="cpu"):
    """The sampler's loop as it was before fast mode, written out."""
    sampler = make_sampler(params.sampler, params.steps, params.shift)
    latent = initial_noise(condition, params.seed).to(device)
    positive, negative, y = text.positive.to(device), text.negative.to(device), condition.y[None].to(device)
    for index, t in enumerate(sampler.timesteps.tolist()):
        name = expert_for(t, params.boundary)
        model = experts.acquire(name)
        guide = params.cfg_high if name == "high" else params.cfg_low
        x, tt = latent[None], torch.tensor([t], device=device)
        with torch.inference_mode():
            both = model(x.expand(2, -1, -1, -1, -1), tt.expand(2), [positive, negative],
                         y=y.expand(2, -1, -1, -1, -1))
            v = (both[1] + guide * (both[0] - both[1])).float()
        latent = sampler.step(v, index, latent)
    return latent.float().cpu()


def test_all_off_is_bit_identical_to_the_exact_sampler():
    text, condition = _inputs()
    params = SamplingParams(steps=6, shift=5.0, seed=3, boundary=0.9)
    stats = StepStats()
    got = sample(TinyExperts(), text, condition, None, params, stats=stats)
    assert torch.equal(got, _exact_reference(TinyExperts(), text, condition, params))
    assert stats.forwards == 12 and stats.skipped_forwards == 0


def test_sample_with_cache_and_truncation_computes_fewer_forwards():
    text, condition = _inputs()
    experts = TinyExperts()
    stats = StepStats()
    params = SamplingParams(steps=12, shift=5.0, seed=3, boundary=0.9, cache_threshold=0.5, cache_warmup=2,
                            cfg_truncate=0.25)
    latent = sample(experts, text, condition, None, params, stats=stats)
    assert torch.isfinite(latent).all()
    computed = sum(m.calls for m in experts.models.values())
    assert stats.forwards == computed
    assert stats.forwards + stats.skipped_forwards + stats.truncated_forwards == 24
    assert stats.skipped_forwards > 0 and stats.truncated_forwards == 3



@pytest.mark.gpu
def test_all_off_is_bit_identical_on_cuda(package):
    """The real DiT of a tiny package (CUDA kernels) through sample() vs the exact loop."""
    from comfyui_lingbot_world.loaders.package import find_package
    from comfyui_lingbot_world.pipeline.experts import DiskExperts

    files = find_package(package)
    _, condition = _inputs()
    g = torch.Generator().manual_seed(1)
    text = TextEmbeddings(positive=torch.randn(6, 32, generator=g), negative=torch.randn(5, 32, generator=g),
                          from_cache=False)
    params = SamplingParams(steps=4, shift=5.0, seed=3)
    got = sample(DiskExperts(files.high, files.low, "cuda"), text, condition, None, params)
    want = _exact_reference(DiskExperts(files.high, files.low, "cuda"), text, condition, params, "cuda")
    assert torch.equal(got, want)
