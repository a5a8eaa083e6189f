"""Rotary position embeddings (RoPE), in the rotate-half layout of GPT-NeoX and Llama.

Per query/key head, the first r = ``rotary_dims`` of its dims are rotated by the position p:
pair (c, c + r/2) turns by the angle p * omega_c, with omega_c = theta^(-2c/r) (before scaling),
and the other dims pass unchanged. As a map on row vectors, q -> q M(p) with M(p) orthogonal and
M(p) M(p')^T = M(p - p'). So the score of query i and key j is

    S_ij = x_i W_Q M(i) M(j)^T W_K^T x_j^T / sqrt(d) = x_i W_Q R(j - i) W_K^T x_j^T / sqrt(d),

with R(delta) = M(-delta) = M(delta)^T: the bilinear form depends on the offset delta = j - i
(<= 0 under the causal mask), B(delta) = W_Q R(delta) W_K^T / sqrt(d) (docs/maths.md).

Scaling (``ModelConfig.rope_scaling``): "linear" divides every frequency by ``factor``; "llama3"
divides the low frequencies by ``factor``, keeps the high ones and interpolates between, as
Llama 3.1 does; "yarn" (gpt-oss, DeepSeek) blends each frequency between omega_c (extrapolated)
and omega_c / factor (interpolated) by a linear ramp over the dims between the corrections for
``beta_fast`` and ``beta_slow`` rotations in ``original_max_position_embeddings``, and multiplies
cos and sin by ``attention_factor`` (:func:`attention_factor`), as transformers computes them: the
rotated dims of q and of k each carry it, so their part of every score carries its square.
"""

from __future__ import annotations

import math

import torch

from attn_core.model.config import ModelConfig


def inverse_frequencies(cfg: ModelConfig, layer: int | None = None) -> torch.Tensor:
    """omega_c for c < r/2, float32 [r/2] (after scaling), on the default device; for ``layer``,
    that layer's (``rope_theta_local`` in a sliding layer, unscaled, when set). Computed on the
    CPU first and refused (ValueError) unless every omega_c is finite and positive: a scaling
    factor of 1e-300 would otherwise give infinite angles and NaN scores in every view."""
    r = cfg.rotary_dims
    if r == 0:
        raise ValueError("this model has no rotary positions")
    theta, s = cfg.rope_theta, cfg.rope_scaling
    if layer is not None and cfg.layer_rope_theta(layer) != theta:
        theta, s = cfg.layer_rope_theta(layer), None
    inv = 1.0 / (theta ** (torch.arange(0, r, 2, dtype=torch.int64, device="cpu").float() / r))
    if s is not None and s["type"] == "linear":
        inv = inv / s["factor"]
    elif s is not None and s["type"] == "yarn":
        inv = _yarn(inv, theta, r, s)
    elif s is not None:
        factor, old = s["factor"], s["original_max_position_embeddings"]
        low, high = s["low_freq_factor"], s["high_freq_factor"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = torch.where(medium, smoothed, scaled)
    if not bool(inv.isfinite().all() and (inv > 0).all()):
        raise ValueError(
            f"rope_theta={theta!r} with rope_scaling {s} gives rotary frequencies that are not "
            "finite and positive in float32 (a scaling factor too small or too large)"
        )
    return inv.to(torch.get_default_device())


def _yarn(inv: torch.Tensor, theta: float, r: int, s: dict) -> torch.Tensor:
    """YaRN's blend of the extrapolated (``inv``) and interpolated (``inv / factor``) frequencies,
    as transformers' ``_compute_yarn_parameters`` computes it (float32)."""
    old = s["original_max_position_embeddings"]

    def dim(rotations: float) -> float:  # the dim that turns ``rotations`` times in ``old`` positions
        return (r * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = dim(s["beta_fast"]), dim(s["beta_slow"])
    if s["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, r - 1)
    if low == high:
        high += 0.001  # as transformers does: no division by zero
    ramp = ((torch.arange(r // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    pos_freqs = theta ** (torch.arange(0, r, 2, dtype=torch.int64, device="cpu").float() / r)
    return (1.0 / (s["factor"] * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def attention_factor(cfg: ModelConfig, layer: int | None = None) -> float:
    """The factor YaRN puts on cos and sin (1.0 otherwise, and in a layer of its own base or
    without positions): q and k each carry it on their rotated dims."""
    s = cfg.rope_scaling
    if s is None or s["type"] != "yarn" or cfg.positional != "rotary":
        return 1.0
    if layer is not None and (not cfg.rotary_layer(layer) or cfg.layer_rope_theta(layer) != cfg.rope_theta):
        return 1.0
    return float(s["attention_factor"])


def yarn_mscale(factor: float, m: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1 m ln(factor) + 1 (1.0 for a factor of 1 or less), as
    transformers' ``yarn_get_mscale``."""
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """YaRN's attention factor from a config's ``factor`` (and DeepSeek's ``mscale`` /
    ``mscale_all_dim``) when the config does not give it: 0.1 ln(factor) + 1, as transformers has it."""
    if mscale and mscale_all_dim:
        return float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
    return yarn_mscale(factor)


def cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, gain: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of p * omega, [len(positions), r] (each angle twice, rotate-half layout), times
    ``gain`` (YaRN's :func:`attention_factor`)."""
    angles = positions.float()[:, None] * inv_freq.to(positions.device)[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    if gain != 1.0:
        return angles.cos() * gain, angles.sin() * gain
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x M(p) for x [..., pos, width]: the first r = cos.shape[-1] dims rotated, the rest kept."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    half = r // 2
    turned = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    out = rot * cos.to(x.dtype) + turned * sin.to(x.dtype)
    return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out


def offset_rotation(
    cfg: ModelConfig, delta: int | torch.Tensor, width: int | None = None, layer: int | None = None
) -> torch.Tensor:
    """R(delta) = M(delta)^T, [width, width] (or [n, width, width] for n offsets), so that the
    score of a query at i and a key at i + delta is q R(delta) k^T (module doc). ``width``
    defaults to d_head; dims past the rotary ones are the identity. With ``layer``, that layer's
    rotation: its own base, or the identity in a layer without positions (NoPE)."""
    width = cfg.d_head if width is None else width
    deltas = torch.as_tensor(delta, dtype=torch.float64).reshape(-1)
    if layer is not None and not cfg.rotary_layer(layer):
        R = torch.eye(width).expand(len(deltas), width, width).clone()
        return R if torch.as_tensor(delta).dim() else R[0]
    cos, sin = cos_sin(inverse_frequencies(cfg, layer).double(), deltas)  # [n, r]
    eye = torch.eye(width, dtype=torch.float64).expand(len(deltas), width, width)
    M = rotate(eye, cos[:, None, :], sin[:, None, :])  # rows e_c M(delta): [n, width, width]
    R = M.transpose(-1, -2).float()
    return R if torch.as_tensor(delta).dim() else R[0]
