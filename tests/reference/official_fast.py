"""A test-only restatement of the official LingBot-World Fast generation, in plain torch.

Written for the fidelity tests from a reading of upstream commit 9660e94
(``wan/image2video_fast.py`` ``WanI2VFast.generate``, ``wan/modules/model_fast.py``
``WanModelFast``, ``wan/utils/fm_solvers_unipc.py``); nothing of it is copied or imported,
and none of the pack's model, cache or sampler code is used. It keeps the official
structure on purpose, so that it is a different computation of the same thing:

* the schedule object: a float32 training sigma table, ``set_timesteps(1000, shift)``,
  flow → x0 through ``argmin |timesteps − t|`` in float64, re-noise through the
  ``index_for_timestep`` rule (second match);
* one generator: the whole video's noise first, then one draw per re-noise;
* y and the camera tensor built for the whole video, then split into chunks;
* a per-layer cache dict {k, v, global_end_index, local_end_index} sized in tokens, written
  by every forward at the chunk's token range, read as ``[max(0, end − max_attention), end)``,
  with the official roll (sink kept, oldest evicted) when ``local_attn_size`` is set and the
  cache is smaller than the video;
* RoPE by complex multiplication in float64 with the frame axis starting at
  ``current_start // frame_seqlen``; per-token time embedding; text K/V cached on first use;
* one extra forward at t = 0 per chunk, the last chunk included.

Weights come as a state dict with the official key names (the pack's model's state dict).
Float32 throughout; for tiny CPU geometries only.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------- the schedule


class OfficialFlowSchedule:
    """The parts of the official FlowUniPC scheduler that generate_fast uses."""

    def __init__(self, num_train_timesteps: int = 1000) -> None:
        self.num_train_timesteps = num_train_timesteps
        alphas = np.linspace(1, 1 / num_train_timesteps, num_train_timesteps)[::-1].copy()
        table = torch.from_numpy(1.0 - alphas).to(torch.float32)  # built with shift 1: unchanged
        self.sigma_max = table[0].item()
        self.sigma_min = table[-1].item()

    def set_timesteps(self, steps: int, shift: float) -> None:
        sigmas = np.linspace(self.sigma_max, self.sigma_min, steps + 1).copy()[:-1]
        sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
        self.timesteps = torch.from_numpy(sigmas * self.num_train_timesteps).to(torch.int64)
        self.sigmas = torch.from_numpy(np.concatenate([sigmas, [0.0]]).astype(np.float32))

    def flow_to_x0(self, flow: torch.Tensor, xt: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        dtype = flow.dtype
        flow, xt, sigmas, timesteps = (v.double() for v in (flow, xt, self.sigmas, self.timesteps))
        index = torch.argmin((timesteps - timestep).abs())
        return (xt - sigmas[index] * flow).to(dtype)

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        sigmas = self.sigmas.to(dtype=x0.dtype)
        matches = (self.timesteps == timestep).nonzero()
        index = matches[1 if len(matches) > 1 else 0].item()
        sigma = sigmas[index]
        return (1 - sigma) * x0 + sigma * noise


# --------------------------------------------------------------------------- the model


def _linear(sd: dict, name: str, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, sd[f"{name}.weight"], sd.get(f"{name}.bias"))


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).type_as(x) * weight


def _layer_norm(x: torch.Tensor, eps: float, weight=None, bias=None) -> torch.Tensor:
    return F.layer_norm(x.float(), (x.shape[-1],), weight, bias, eps).type_as(x)


def _sinusoid(dim: int, position: torch.Tensor) -> torch.Tensor:
    half = dim // 2
    position = position.to(torch.float64)
    angle = torch.outer(position, torch.pow(10000, -torch.arange(half).to(position).div(half)))
    return torch.cat([torch.cos(angle), torch.sin(angle)], dim=1)


def _rope_table(max_len: int, dim: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = torch.outer(torch.arange(max_len), 1.0 / torch.pow(theta, torch.arange(0, dim, 2).to(torch.float64).div(dim)))
    return torch.polar(torch.ones_like(freqs), freqs)


def rope_freqs(head_dim: int, max_len: int = 1024) -> torch.Tensor:
    d = head_dim
    return torch.cat([_rope_table(max_len, d - 4 * (d // 6)), _rope_table(max_len, 2 * (d // 6)),
                      _rope_table(max_len, 2 * (d // 6))], dim=1)


def _rope(x: torch.Tensor, grid: tuple[int, int, int], freqs: torch.Tensor, start_frame: int) -> torch.Tensor:
    """x [1, L, heads, head_dim]: rotate with the frame axis starting at ``start_frame``."""
    n, c = x.shape[2], x.shape[3] // 2
    f, h, w = grid
    parts = freqs.split([c - 2 * (c // 3), c // 3, c // 3], dim=1)
    table = torch.cat([parts[0][start_frame:start_frame + f].view(f, 1, 1, -1).expand(f, h, w, -1),
                       parts[1][:h].view(1, h, 1, -1).expand(f, h, w, -1),
                       parts[2][:w].view(1, 1, w, -1).expand(f, h, w, -1)], dim=-1).reshape(f * h * w, 1, -1)
    rotated = torch.view_as_complex(x[0].to(torch.float64).reshape(f * h * w, n, -1, 2)) * table
    return torch.view_as_real(rotated).flatten(2)[None].type_as(x)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Softmax attention written out: [1, Lq, n, d] x [1, Lk, n, d] -> [1, Lq, n, d]."""
    scores = torch.einsum("bqnd,bknd->bnqk", q, k) / math.sqrt(q.shape[-1])
    return torch.einsum("bnqk,bknd->bqnd", scores.softmax(dim=-1), v)


class OfficialFastModel:
    """WanModelFast's forward with kv_cache / crossattn_cache, over a state dict."""

    def __init__(self, state_dict: dict, config, local_attn_size: int = -1, sink_size: int = 0) -> None:
        self.sd = {k: v.detach().float() for k, v in state_dict.items()}
        self.cfg = config
        self.heads, self.head_dim = config.num_heads, config.dim // config.num_heads
        self.freqs = rope_freqs(self.head_dim)
        self.local_attn_size, self.sink_size = local_attn_size, sink_size
        self.attended_frames: list[list[int]] = []  # per self-attention call of layer 0: frame of each key

    # -- caches
    def new_caches(self, kv_tokens: int) -> tuple[list[dict], list[dict]]:
        shape = (1, kv_tokens, self.heads, self.head_dim)
        self_kv = [{"k": torch.zeros(shape), "v": torch.zeros(shape), "global_end_index": 0,
                    "local_end_index": 0, "frames": torch.full((kv_tokens,), -1)}
                   for _ in range(self.cfg.num_layers)]
        cross = [{"is_init": False} for _ in range(self.cfg.num_layers)]
        return self_kv, cross

    # -- attention
    def _self_attention(self, prefix: str, x: torch.Tensor, grid, cache: dict, current_start: int,
                        max_attention: int, layer: int) -> torch.Tensor:
        sd, n, d = self.sd, self.heads, self.head_dim
        length = x.shape[1]
        q = _rms_norm(_linear(sd, f"{prefix}.q", x), sd[f"{prefix}.norm_q.weight"], self.cfg.eps).view(1, length, n, d)
        k = _rms_norm(_linear(sd, f"{prefix}.k", x), sd[f"{prefix}.norm_k.weight"], self.cfg.eps).view(1, length, n, d)
        v = _linear(sd, f"{prefix}.v", x).view(1, length, n, d)
        frame_seqlen = grid[1] * grid[2]
        start_frame = current_start // frame_seqlen
        q, k = _rope(q, grid, self.freqs, start_frame), _rope(k, grid, self.freqs, start_frame)
        current_end = current_start + length
        size = cache["k"].shape[1]
        sink_tokens = self.sink_size * frame_seqlen
        local_end, global_end = cache["local_end_index"], cache["global_end_index"]
        new_frames = torch.arange(current_start, current_end) // frame_seqlen
        if self.local_attn_size != -1 and current_end > global_end and length + local_end > size:
            evicted = length + local_end - size
            kept = local_end - evicted - sink_tokens
            for key in ("k", "v", "frames"):
                buf = cache[key]
                if key == "frames":
                    buf[sink_tokens:sink_tokens + kept] = buf[sink_tokens + evicted:sink_tokens + evicted + kept].clone()
                else:
                    buf[:, sink_tokens:sink_tokens + kept] = \
                        buf[:, sink_tokens + evicted:sink_tokens + evicted + kept].clone()
            local_end = local_end + current_end - global_end - evicted
        else:
            local_end = local_end + current_end - global_end
        local_start = local_end - length
        cache["k"][:, local_start:local_end] = k
        cache["v"][:, local_start:local_end] = v
        cache["frames"][local_start:local_end] = new_frames
        lo = max(0, local_end - max_attention)
        if layer == 0:
            self.attended_frames.append(sorted(set(cache["frames"][lo:local_end].tolist())))
        out = _attention(q, cache["k"][:, lo:local_end], cache["v"][:, lo:local_end])
        cache["global_end_index"], cache["local_end_index"] = current_end, local_end
        return _linear(sd, f"{prefix}.o", out.flatten(2))

    def _cross_attention(self, prefix: str, x: torch.Tensor, context: torch.Tensor, cache: dict) -> torch.Tensor:
        sd, n, d = self.sd, self.heads, self.head_dim
        q = _rms_norm(_linear(sd, f"{prefix}.q", x), sd[f"{prefix}.norm_q.weight"], self.cfg.eps).view(1, -1, n, d)
        if not cache["is_init"]:
            cache["is_init"] = True
            cache["k"] = _rms_norm(_linear(sd, f"{prefix}.k", context), sd[f"{prefix}.norm_k.weight"],
                                   self.cfg.eps).view(1, -1, n, d)
            cache["v"] = _linear(sd, f"{prefix}.v", context).view(1, -1, n, d)
        return _linear(sd, f"{prefix}.o", _attention(q, cache["k"], cache["v"]).flatten(2))

    # -- forward
    def __call__(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor, y: torch.Tensor,
                 plucker: torch.Tensor | None, kv_cache: list[dict], cross_cache: list[dict], current_start: int,
                 max_attention: int) -> torch.Tensor:
        sd, cfg = self.sd, self.cfg
        pt, ph, pw = cfg.patch_size
        u = F.conv3d(torch.cat([x, y])[None], sd["patch_embedding.weight"], sd["patch_embedding.bias"],
                     stride=cfg.patch_size)
        grid = tuple(u.shape[2:])
        tokens = u.flatten(2).transpose(1, 2)
        length = tokens.shape[1]
        t = t.expand(1, length)
        e = _linear(sd, "time_embedding.2", F.silu(_linear(sd, "time_embedding.0",
                                                           _sinusoid(cfg.freq_dim, t.flatten()).float())))[None]
        e0 = _linear(sd, "time_projection.1", F.silu(e)).unflatten(2, (6, cfg.dim))
        padded = torch.cat([context, context.new_zeros(cfg.text_len - context.shape[0], context.shape[1])])[None]
        text = _linear(sd, "text_embedding.2", F.gelu(_linear(sd, "text_embedding.0", padded), approximate="tanh"))
        cam = None
        if plucker is not None:
            c, f, h, w = plucker.shape[1], plucker.shape[2] // pt, plucker.shape[3] // ph, plucker.shape[4] // pw
            cam = (plucker.reshape(1, c, f, pt, h, ph, w, pw).permute(0, 2, 4, 6, 1, 3, 5, 7)
                   .reshape(1, f * h * w, c * pt * ph * pw))
            cam = _linear(sd, "patch_embedding_wancamctrl", cam)
            cam = cam + _linear(sd, "c2ws_hidden_states_layer2", F.silu(_linear(sd, "c2ws_hidden_states_layer1", cam)))
        xs = tokens
        for i in range(cfg.num_layers):
            b = f"blocks.{i}"
            mod = (sd[f"{b}.modulation"].unsqueeze(0) + e0).chunk(6, dim=2)
            mod = [m.squeeze(2) for m in mod]
            h_in = _layer_norm(xs, cfg.eps).float() * (1 + mod[1]) + mod[0]
            xs = xs + self._self_attention(f"{b}.self_attn", h_in, grid, kv_cache[i], current_start,
                                           max_attention, i) * mod[2]
            if cam is not None:
                hidden = _linear(sd, f"{b}.cam_injector_layer2", F.silu(_linear(sd, f"{b}.cam_injector_layer1", cam))) + cam
                xs = (1.0 + _linear(sd, f"{b}.cam_scale_layer", hidden)) * xs + _linear(sd, f"{b}.cam_shift_layer", hidden)
            normed = _layer_norm(xs, cfg.eps, sd[f"{b}.norm3.weight"], sd[f"{b}.norm3.bias"])
            xs = xs + self._cross_attention(f"{b}.cross_attn", normed, text, cross_cache[i])
            h_ffn = _layer_norm(xs, cfg.eps).float() * (1 + mod[4]) + mod[3]
            ffn = _linear(sd, f"{b}.ffn.2", F.gelu(_linear(sd, f"{b}.ffn.0", h_ffn), approximate="tanh"))
            xs = xs + ffn * mod[5]
        head_mod = (sd["head.modulation"].unsqueeze(0) + e.unsqueeze(2)).chunk(2, dim=2)
        out = _linear(sd, "head.head", _layer_norm(xs, cfg.eps) * (1 + head_mod[1].squeeze(2)) + head_mod[0].squeeze(2))
        f, h, w = grid
        out = out[0].view(f, h, w, pt, ph, pw, cfg.out_dim)
        out = torch.einsum("fhwpqrc->cfphqwr", out).reshape(cfg.out_dim, f * pt, h * ph, w * pw)
        return out.float()


# --------------------------------------------------------------------------- generate_fast


def generate_fast(model: OfficialFastModel, context: torch.Tensor, y: torch.Tensor, plucker: torch.Tensor | None,
                  seed: int, shift: float = 10.0, chunk_size: int = 3,
                  timesteps_index: tuple[int, ...] = (0, 179, 358, 679), kv_frames: int | None = None,
                  max_attention_frames: int | None = None) -> tuple[torch.Tensor, dict]:
    """The official loop. y [20, F_lat, h, w] and plucker [1, C, F_lat, h, w] are built for the
    whole video and split here. ``kv_frames``: the cache's size in latent frames (official:
    the whole video). Returns (latent [16, F_lat, h, w], trace)."""
    lat_f, lat_h, lat_w = y.shape[1], y.shape[2], y.shape[3]
    assert lat_f % chunk_size == 0
    generator = torch.Generator(device="cpu").manual_seed(seed)
    noise = torch.randn(16, lat_f, lat_h, lat_w, dtype=torch.float32, generator=generator)
    scheduler = OfficialFlowSchedule()
    scheduler.set_timesteps(1000, shift=shift)
    timesteps = scheduler.timesteps[list(timesteps_index)]
    frame_seqlen = lat_h * lat_w // 4
    kv_tokens = frame_seqlen * (lat_f if kv_frames is None else kv_frames)
    max_attention = kv_tokens if max_attention_frames is None else max_attention_frames * frame_seqlen
    kv_cache, cross_cache = model.new_caches(kv_tokens)
    latents, conditions = noise.split(chunk_size, dim=1), y.split(chunk_size, dim=1)
    cameras = plucker.split(chunk_size, dim=2) if plucker is not None else [None] * len(latents)
    trace = {"timesteps": timesteps.tolist(), "forwards": 0}
    chunks = []
    for chunk_id in range(len(latents)):
        current = latents[chunk_id]
        kwargs = dict(context=context, y=conditions[chunk_id], plucker=cameras[chunk_id], kv_cache=kv_cache,
                      cross_cache=cross_cache, current_start=chunk_id * chunk_size * frame_seqlen,
                      max_attention=max_attention)
        x0 = None
        for index in range(len(timesteps)):
            t = timesteps[index:index + 1]
            flow = model(current, t, **kwargs)
            trace["forwards"] += 1
            x0 = scheduler.flow_to_x0(flow, current, timesteps[index])
            if index < len(timesteps) - 1:
                eps = torch.randn(x0.shape, generator=generator, dtype=x0.dtype)
                current = scheduler.add_noise(x0, eps, timesteps[index + 1])
        chunks.append(x0)
        model(x0, timesteps[-1:] * 0.0, **kwargs)  # the t = 0 pass that updates the cache
        trace["forwards"] += 1
    return torch.cat(chunks, dim=1), trace
