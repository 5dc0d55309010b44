"""Flow-matching samplers against the reference schedule and diffusers' UniPC."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from comfyui_lingbot_world.wan.scheduler import (
    SAMPLERS,
    FlowEulerSampler,
    FlowUniPCSampler,
    flow_sigmas,
    flow_timesteps,
    make_sampler,
)

CASES = [(40, 10.0), (70, 10.0), (4, 5.0), (1, 3.0), (2, 3.0), (12, 1.0)]


def reference_unshifted(steps: int, train: int = 1000) -> np.ndarray:
    """The reference's construction, restated: a float32 training table of sigmas
    1 - linspace(1, 1/T, T) reversed, whose ends bound an inference linspace."""
    alphas = np.linspace(1.0, 1.0 / train, train)[::-1].copy()
    table = (1.0 - alphas).astype(np.float32)
    top, bottom = float(table[0]), float(table[-1])
    return np.linspace(top, bottom, steps + 1)[:-1]


def shifted(sigmas: np.ndarray, shift: float) -> np.ndarray:
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def fake_flow(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """A deterministic, nonlinear stand-in for the DiT."""
    return torch.tanh(1.3 * x) + 0.5 * torch.sin(3.0 * x + float(t) / 300.0) - 0.2 * x


def diffusers_unipc(steps: int, shift: float):
    diffusers = pytest.importorskip("diffusers")
    sched = diffusers.UniPCMultistepScheduler(
        num_train_timesteps=1000,
        solver_order=2,
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        flow_shift=shift,
        solver_type="bh2",
        predict_x0=True,
        lower_order_final=True,
        final_sigmas_type="zero",
    )
    # diffusers' own flow schedule starts at sigma 1 and stops at 1/T; the reference
    # (and we) run linspace(float32(1 - 1/T), 0) instead, so hand diffusers those sigmas.
    sched.set_timesteps(sigmas=reference_unshifted(steps))
    sched.set_begin_index(0)
    return sched


@pytest.mark.parametrize("steps,shift", CASES)
def test_schedule_matches_reference_construction(steps: int, shift: float) -> None:
    expect = shifted(reference_unshifted(steps), shift)
    sig = flow_sigmas(steps, shift)
    assert sig.dtype == torch.float32 and sig.shape == (steps + 1,)
    assert torch.equal(sig, torch.from_numpy(np.append(expect, 0.0).astype(np.float32)))
    ts = flow_timesteps(steps, shift)
    assert ts.dtype == torch.float32 and ts.shape == (steps,)
    # The reference passes int64 timesteps (truncated) to the model.
    assert torch.equal(ts, torch.from_numpy((expect * 1000).astype(np.int64)).float())
    assert torch.all(sig[:-1] > sig[1:]) and sig[-1] == 0


def test_schedule_known_values() -> None:
    sig = flow_sigmas(70, 10.0)
    # first sigma: 10·0.999 / (1 + 9·0.999) with 0.999 rounded to float32
    assert sig[0].item() == pytest.approx(9.99 / 9.991, abs=1e-6)
    assert flow_timesteps(70, 10.0)[:2].tolist() == [999.0, 998.0]
    assert flow_sigmas(4, 1.0).tolist() == pytest.approx([0.999, 0.74925, 0.4995, 0.24975, 0.0], abs=1e-6)


@pytest.mark.parametrize("steps,shift", CASES)
def test_unipc_matches_diffusers(steps: int, shift: float) -> None:
    ref = diffusers_unipc(steps, shift)
    ours = FlowUniPCSampler(steps, shift)
    assert torch.equal(ref.sigmas.float(), ours.sigmas)
    assert torch.equal(ref.timesteps.float(), ours.timesteps)

    gen = torch.Generator().manual_seed(1234)
    start = torch.randn(1, 16, 3, 6, 5, generator=gen)
    x_ref, x_ours = start.clone(), start.clone()
    for i, t in enumerate(ref.timesteps):
        x_ref = ref.step(fake_flow(x_ref, t), t, x_ref, return_dict=False)[0]
        x_ours = ours.step(fake_flow(x_ours, ours.timesteps[i]), i, x_ours)
    assert x_ours.dtype == torch.float32
    assert torch.isfinite(x_ours).all()
    torch.testing.assert_close(x_ours, x_ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", SAMPLERS)
def test_exact_flow_recovers_data(name: str) -> None:
    """On a straight path x_σ = (1-σ)·x0 + σ·n the exact flow is v = n - x0; both samplers
    must land on x0 (Euler because v is constant, UniPC because x0 estimates agree)."""
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, 4, 4, generator=gen)
    noise = torch.randn(2, 4, 4, generator=gen)
    sampler = make_sampler(name, 9, 5.0)
    sig0 = sampler.sigmas[0].item()
    x = (1 - sig0) * x0 + sig0 * noise
    for i in range(len(sampler.timesteps)):
        x = sampler.step(noise - x0, i, x)
    torch.testing.assert_close(x, x0, atol=1e-5, rtol=1e-5)


def test_euler_single_step_formula() -> None:
    sampler = FlowEulerSampler(4, 3.0)
    x = torch.ones(3)
    v = torch.tensor([1.0, -2.0, 0.5])
    sig = sampler.sigmas
    out = sampler.step(v, 0, x)
    torch.testing.assert_close(out, x + (sig[1] - sig[0]) * v)
    out2 = sampler.step(v, 1, out)
    torch.testing.assert_close(out2, out + (sig[2] - sig[1]) * v)


def test_unipc_restarts_at_index_zero_and_rejects_skips() -> None:
    sampler = FlowUniPCSampler(6, 5.0)
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(3))

    def run() -> torch.Tensor:
        y = x.clone()
        for i in range(6):
            y = sampler.step(fake_flow(y, sampler.timesteps[i]), i, y)
        return y

    first = run()
    torch.testing.assert_close(run(), first, atol=0, rtol=0)  # index 0 starts afresh
    sampler.step(torch.zeros_like(x), 0, x)
    with pytest.raises(ValueError, match="expected index 1, got 3"):
        sampler.step(torch.zeros_like(x), 3, x)
    with pytest.raises(IndexError, match="outside 0..5"):
        sampler.step(torch.zeros_like(x), 6, x)


def test_works_in_float32_from_bf16_inputs() -> None:
    sampler = FlowUniPCSampler(3, 5.0)
    x = torch.randn(4, 4).to(torch.bfloat16)
    out = sampler.step(torch.randn(4, 4).to(torch.bfloat16), 0, x)
    assert out.dtype == torch.float32 and out.device == x.device


def test_make_sampler_names() -> None:
    assert isinstance(make_sampler("unipc", 5, 3.0), FlowUniPCSampler)
    assert isinstance(make_sampler("Euler", 5, 3.0), FlowEulerSampler)
    with pytest.raises(ValueError, match="'dpm\\+\\+'.*unipc, euler"):
        make_sampler("dpm++", 5, 3.0)


@pytest.mark.parametrize("steps,shift,field", [(0, 5.0, "steps"), (10, 0.0, "shift"), (10, float("nan"), "shift")])
def test_bad_schedule_arguments(steps: int, shift: float, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        FlowUniPCSampler(steps, shift)


# --------------------------------------------------------------------------- the history follows the latent

def test_unipc_history_follows_the_sample_to_another_device():
    """expert_per_gpu moves the latent to GPU 1 at the boundary (issue 26: the history stayed
    on GPU 0 and `_correct` mixed devices). "meta" stands for the second device: mixing it with
    CPU tensors raises the same device error, so the step fails unless the state moved."""
    sampler = FlowUniPCSampler(6, 5.0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, generator=g)
    for index in range(2):  # two steps on the first device: the order-2 history is full
        x = sampler.step(torch.randn(2, 3, 4, generator=g), index, x)
    assert sampler.state_tensors() and all(t.device.type == "cpu" for t in sampler.state_tensors())
    moved = sampler.step(torch.empty(2, 3, 4, device="meta"), 2, x.to("meta"))
    assert moved.device.type == "meta"
    assert len(sampler.state_tensors()) == 3 and all(t.device.type == "meta" for t in sampler.state_tensors())


def test_sampler_to_moves_every_state_tensor():
    sampler = FlowUniPCSampler(5, 3.0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, generator=g)
    for index in range(2):
        x = sampler.step(torch.randn(4, generator=g), index, x)
    shapes = [t.shape for t in sampler.state_tensors()]
    assert sampler.to("meta") is sampler
    assert [t.shape for t in sampler.state_tensors()] == shapes
    assert all(t.device.type == "meta" for t in sampler.state_tensors())
    assert FlowEulerSampler(4, 3.0).to("meta").state_tensors() == []
