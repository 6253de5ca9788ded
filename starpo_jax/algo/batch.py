"""The step's intermediate structs: the scored rollout, the filter's
selection, the training batch, and all of them together (``Prepared``);
the static lengths the batch is scored and trained at (length buckets).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from starpo_jax.agent.rollout import (
  Trajectory,
)


@struct.dataclass
class Scored:
  """A rollout on its generated tokens, packed to the front: ``[B, G]``."""

  positions: jax.Array  # [B, G] int32 where each token sits in the episode
  mask: jax.Array  # [B, G] bool: a generated token
  old_logp: jax.Array  # [B, G] sampling log-probabilities
  entropy: jax.Array  # [B, G] entropy of each sampling distribution
  rewards: jax.Array  # [B, G] token rewards (a KL penalty included)
  turn_end: jax.Array  # [B, G] bool: a turn's last token
  ref_logp: jax.Array  # [B, G] reference log-probabilities (0 without)
  kl: jax.Array  # [B, G] KL(sampling policy || reference) estimate
  values: jax.Array  # [B, G] the critic's values (0 without a critic)

  @property
  def scores(self) -> jax.Array:
    """[B] each episode's summed reward."""
    return jnp.sum(self.rewards, axis=1)

  @property
  def lengths(self) -> jax.Array:
    """[B] generated tokens per episode."""
    return jnp.sum(self.mask, axis=1)

  @property
  def episode_entropy(self) -> jax.Array:
    """[B] mean sampling entropy per episode."""
    m = self.mask.astype(jnp.float32)
    return jnp.sum(self.entropy * m, 1) / jnp.maximum(jnp.sum(m, 1), 1)


@struct.dataclass
class Selection:
  """Which rollout groups the update trains on (StarPO-S), and the
  episodes it holds: whole groups, the kept ones among them."""

  group_scores: jax.Array  # [groups] the filter metric
  keep_group: jax.Array  # [groups] bool, within the capacity
  keep: jax.Array  # [B] bool, per episode
  rows: jax.Array  # [C * group_size] int32 episodes the update holds
  over_capacity: jax.Array  # [] int32 groups kept beyond the capacity

  @property
  def kept_fraction(self) -> jax.Array:
    return jnp.mean(self.keep_group.astype(jnp.float32))

  @property
  def row_keep(self) -> jax.Array:
    """[C * group_size] bool: the held episode is kept."""
    return self.keep[self.rows]


@struct.dataclass
class Batch:
  """What the update trains on; ``[B, G]`` unless noted."""

  tokens: jax.Array  # [B, L] whole episodes
  turns: jax.Array  # [B, L] int32 each token's turn (-1: system, padding)
  positions: jax.Array  # [B, G] where the generated tokens are
  mask: jax.Array  # [B, G] bool: generated and kept by the filter
  old_logp: jax.Array
  ref_logp: jax.Array
  advantages: jax.Array
  returns: jax.Array  # the critic's targets (0 without a critic)
  values: jax.Array  # the critic's values at rollout time
  episode: jax.Array  # [B] int32 each row's episode in the rollout
  # [B] int32 tokens each row shares with its unit's rows, computed once
  # (``algo.prefix``; 0: none); set by the update.
  prefix: jax.Array | None = None


@struct.dataclass
class Prepared:
  """Phases 1-4 of a step: what was played and what the update reads."""

  traj: Trajectory
  scored: Scored  # every episode; the models' fields only with a KL reward
  selection: Selection
  held: Scored  # the selection's rows, the models' fields filled
  batch: Batch


def bucket_lengths(context: int, buckets: int) -> tuple[int, ...]:
  """The static sequence lengths scoring and the update may run at:
  ``buckets`` evenly spaced up to ``context``, rounded up to multiples of
  128 (the attention kernels' blocks), the last ``context`` itself."""
  lengths = {
    min(context, -(-context * i // buckets // 128) * 128)
    for i in range(1, buckets)
  }
  return tuple(sorted(lengths | {context}))


def needed_length(mask: jax.Array, positions: jax.Array) -> jax.Array:
  """[] int32: a sequence length holding every masked generated token
  (``mask``, ``positions`` ``[B, G]``); the attention is causal, so the
  tokens after the last of them change none of their log-probabilities."""
  return jnp.max(jnp.where(mask, positions, 0)) + 1


def at_length(
  lengths: tuple[int, ...],
  needed: jax.Array,
  fn: Callable[[jax.Array, int], Any],
  tokens: jax.Array,
  cut: Callable[[int], int] = lambda n: n,
) -> tuple[Any, jax.Array]:
  """``fn(tokens[:, :cut(length)], length)`` at the shortest of
  ``lengths`` (static, ascending) that is at least ``needed``, chosen on
  device: one compiled branch per length (``lax.switch``), no
  recompilation.

  Returns:
    ``fn``'s result and the length used, ``[]`` int32.
  """
  branch = lambda n: lambda t: fn(t[:, : cut(n)], n)
  if len(lengths) == 1:
    return branch(lengths[0])(tokens), jnp.asarray(lengths[0], jnp.int32)
  table = jnp.asarray(lengths, jnp.int32)
  index = jnp.minimum(jnp.searchsorted(table, needed), len(lengths) - 1)
  branches = [branch(n) for n in lengths]
  return jax.lax.switch(index, branches, tokens), table[index]
