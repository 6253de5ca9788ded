"""Rotary position embeddings (RoPE), with Llama 3's and linear scaling."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from starpo_jax.models.config import ModelConfig


def inverse_frequencies(cfg: ModelConfig) -> jax.Array:
  """RoPE inverse frequencies ``[head_dim // 2]``, scaling applied."""
  exponents = jnp.arange(0, cfg.head_dim, 2, dtype=jnp.float32) / cfg.head_dim
  inv = 1.0 / (cfg.rope_theta**exponents)
  s = cfg.rope_scaling
  if s is None:
    return inv
  if s.kind == "linear":
    return inv / s.factor
  low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
  high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
  wavelen = 2 * math.pi / inv
  scaled = jnp.where(wavelen > low_wavelen, inv / s.factor, inv)
  smooth = (
    s.original_max_position_embeddings / wavelen - s.low_freq_factor
  ) / (s.high_freq_factor - s.low_freq_factor)
  smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return jnp.where(medium, smoothed, scaled)


def rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
  """Rotates ``x [B, T, N, H]`` by ``positions [B, T]`` (half-split layout)."""
  angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, H/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  xf = x.astype(jnp.float32)
  return (xf * cos + rotated.astype(jnp.float32) * sin).astype(x.dtype)
