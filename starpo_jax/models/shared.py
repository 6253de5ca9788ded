"""Sequences that begin alike, computed once where they are alike.

Every episode of a rollout group holds the same system message and first
prompt, so a pass over a batch of episodes (scoring, the update's forward
and backward, the warm start's imitation loss) repeats that work once per
episode. ``Shared`` describes the repetition and ``Transformer.hidden``
skips it (the idea of Prefix Grouper, arXiv 2506.05433): the rows of a
batch come in units of ``unit`` consecutive rows that begin with the same
``length[u]`` tokens. Each unit's prefix runs once, at ``prefix`` static
slots (only the first ``length[u]`` real), and each row runs only its
``suffix`` static slots from its unit's ``length[u]`` on; the suffix's
queries attend to the prefix's keys and values, then causally to their
own. Gradients reach the prefix from every row of its unit, summed, so
losses and gradients equal the plain batch's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from starpo_jax.models.blockwise import Prefix


@struct.dataclass
class Shared:
  """How a batch's ``B = U * unit`` rows share their first tokens."""

  length: jax.Array  # [U] int32 tokens each unit's rows share, <= prefix
  unit: int = struct.field(pytree_node=False)
  prefix: int = struct.field(pytree_node=False)  # P, the prefix's slots
  suffix: int = struct.field(pytree_node=False)  # S, each row's own slots

  @property
  def starts(self) -> jax.Array:
    """``[B]`` int32: where each row's own tokens begin."""
    return jnp.repeat(self.length, self.unit)

  def split(self, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``tokens [B, L]`` -> each unit's prefix ``[U, P]`` (its first row's
    first ``P`` tokens) and each row's own tokens ``[B, S]``: those from
    its unit's shared length on (past ``L``, the last token again: no
    position a caller reads lies there)."""
    length = tokens.shape[1]
    prefix = _first(tokens[:: self.unit], self.prefix)
    at = self.starts[:, None] + jnp.arange(self.suffix)
    own = jnp.take_along_axis(tokens, jnp.minimum(at, length - 1), axis=1)
    return prefix, own

  def positions(self) -> tuple[jax.Array, jax.Array]:
    """The rotary positions of the prefix ``[U, P]`` and of each row's own
    tokens ``[B, S]``."""
    units = self.length.shape[0]
    pre = jnp.broadcast_to(jnp.arange(self.prefix), (units, self.prefix))
    own = self.starts[:, None] + jnp.arange(self.suffix)
    return pre.astype(jnp.int32), own.astype(jnp.int32)

  def within(self, at: jax.Array) -> jax.Array:
    """Token indices ``at [B, G]`` as indices into each row's own tokens
    (those before them, never read for a real token, clamped)."""
    return jnp.clip(at - self.starts[:, None], 0, self.suffix - 1)

  def attended(self, k: jax.Array, v: jax.Array) -> Prefix:
    """The prefix's keys and values ``[U, P, K, H]`` as each row attends
    to them (repeated over the unit's rows: their gradients sum)."""
    rows = lambda x: jnp.repeat(x, self.unit, axis=0)
    return Prefix(rows(k), rows(v), self.starts)


def _first(x: jax.Array, n: int) -> jax.Array:
  """``x [R, L]``'s first ``n`` columns (padded with its last one where
  ``n > L``)."""
  if n <= x.shape[1]:
    return x[:, :n]
  return jnp.pad(x, ((0, 0), (0, n - x.shape[1])), mode="edge")


def common_length(
  tokens: jax.Array, unit: int, before: jax.Array, most: int
) -> jax.Array:
  """``[U]`` int32: how many first tokens each unit of ``unit``
  consecutive rows of ``tokens [B, L]`` shares, at most ``most`` and at
  most ``before [B]`` of any of its rows: the first hidden state a caller
  reads of a row (the one before its first scored token) must be among
  the row's own."""
  b, length = tokens.shape
  grouped = tokens.reshape(b // unit, unit, length)
  same = jnp.all(grouped == grouped[:, :1], axis=1)  # [U, L]
  common = jnp.where(jnp.all(same, axis=1), length, jnp.argmin(same, axis=1))
  limit = jnp.min(before.reshape(b // unit, unit), axis=1)
  return jnp.clip(jnp.minimum(common, limit), 0, most).astype(jnp.int32)
