"""Ragged concatenation inside ``jit``: segments of ids, each with a keep
mask, packed left into a static size (what rendering, prompts and the
answer grammar assemble text with)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

Segment = tuple[jax.Array, jax.Array]  # ids [M], keep [M]


def fixed(ids: Sequence[int], keep: jax.typing.ArrayLike = True) -> Segment:
  ids = jnp.asarray(ids, jnp.int32).reshape(-1)
  return ids, jnp.broadcast_to(jnp.asarray(keep, bool), ids.shape)


def pack(segments: Sequence[Segment], size: int) -> tuple[jax.Array, jax.Array]:
  """Kept ids of the segments, in order, at the front of ``[size]``."""
  ids = jnp.concatenate([s[0] for s in segments])
  keep = jnp.concatenate([s[1] for s in segments])
  pos = jnp.where(keep, jnp.cumsum(keep) - 1, size)
  out = jnp.zeros((size,), jnp.int32).at[pos].set(ids, mode="drop")
  return out, jnp.sum(keep, dtype=jnp.int32)
