"""Passes over a batch that compute each group's shared prompt once
(``algo.share_prefix``).

A rollout group's episodes play one level: they hold the same system
message and first prompt, about half of a short episode's tokens. The
scoring passes (reference, critic), the update's forward and backward and
the warm start's imitation loss run each unit of rows that begin alike
through ``models.shared``: the unit's prefix once, each row's own tokens
after it, with the same losses and gradients as the plain batch.

``Plan`` is the static part, fixed when the step is traced: how many
consecutive rows form a unit (a divisor of the group that divides each
pass's rows, so that no unit straddles two groups or two passes), the
prefix's slots (the longest first prompt the codec can render) and the
suffix lengths a pass may run at (buckets, chosen on device as the
update's lengths are). A unit that shares less (a group whose members
differ, a level whose first prompt is short) shares what it has; one that
shares nothing runs its rows whole, within the longest bucket.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import jax
import jax.numpy as jnp

from starpo_jax.agent import mixture
from starpo_jax.agent.rollout import RolloutConfig
from starpo_jax.models import attention
from starpo_jax.models.shared import Shared, common_length

Setting = Literal["auto", "on", "off"]

# Suffix buckets are multiples of this many tokens.
SUFFIX_MULTIPLE = 64

# "auto" shares for models of at least this many parameters, whose passes
# cost what their tokens do. The tiny model's cost what their operations
# do: its default Sokoban step measured level with and without sharing
# (1.07 s and 1.04 s a step, 2-core AMD EPYC), with a 10 s longer compile.
AUTO_MIN_PARAMS = 10_000_000

# Rows of different levels share the system prompt and the first prompt's
# head, and may share this many tokens of their observations (a grid's
# first row of walls).
LEVELS_SLACK = 16


@dataclasses.dataclass(frozen=True)
class Plan:
  """How the passes over a batch share its rows' prompts: units of
  ``unit`` consecutive rows, a prefix of ``prefix`` slots, each row's own
  tokens at one of ``suffixes`` (ascending, the last holding any row)."""

  unit: int
  prefix: int
  suffixes: tuple[int, ...]

  def lengths(
    self, tokens: jax.Array, positions: jax.Array, mask: jax.Array
  ) -> jax.Array:
    """``[B]`` int32: the tokens each row's unit shares (``tokens [B, L]``
    with its unit's rows consecutive), ending before the hidden state that
    predicts the row's first ``mask``ed token at ``positions [B, G]``."""
    first = jnp.min(jnp.where(mask, positions, tokens.shape[1]), axis=1)
    units = common_length(tokens, self.unit, first - 1, self.prefix)
    return jnp.repeat(units, self.unit)

  def needed(
    self, lengths: jax.Array, positions: jax.Array, mask: jax.Array
  ) -> jax.Array:
    """[] int32: the own tokens a row needs beyond its unit's
    ``lengths [B]`` to hold its ``mask``ed tokens at ``positions``."""
    own = jnp.where(mask, positions - lengths[:, None], 0)
    return jnp.max(own) + 1

  def shared(self, lengths: jax.Array, suffix: int) -> Shared:
    """The rows ``lengths [B]`` describe (a unit's rows alike) at
    ``suffix`` own tokens each."""
    return Shared(
      lengths[:: self.unit],
      unit=self.unit,
      prefix=self.prefix,
      suffix=suffix,
    )

  def cut(self, length: int, suffix: int) -> int:
    """The tokens of a ``length``-token episode a pass at ``suffix`` own
    tokens reads."""
    return min(length, self.prefix + suffix)

  def saved(self, lengths: jax.Array) -> jax.Array:
    """[] float32: tokens a pass over rows of ``lengths [B]`` computes
    once per unit instead of once per row."""
    per_unit = lengths[:: self.unit].astype(jnp.float32)
    return (self.unit - 1) * jnp.sum(per_unit)


def unit_of(group_size: int, rows: int) -> int:
  """Rows per unit of a pass over ``rows`` rows of whole groups of
  ``group_size`` (or parts of one): the largest that divides both."""
  return math.gcd(group_size, rows)


def plan(
  setting: Setting,
  model: Any,
  codec: Any,
  rollout: RolloutConfig,
  unit: int,
  buckets: int,
  window: int = 0,
  levels: bool = False,
) -> Plan | None:
  """The passes' ``Plan`` for ``setting`` (None: plain passes; "auto":
  for models of ``AUTO_MIN_PARAMS`` or more): with units of ``unit``
  rows, for ``model`` (a ``Transformer``: its attention kernel must take
  a prefix), episodes of ``rollout`` rendered by ``codec``, ``buckets``
  suffix lengths, and a context ``window`` (turns; 0: all, the only one
  that shares). ``levels``: a unit's rows play different levels (the warm
  start's), so they share at most the system prompt, the first prompt's
  head and a few tokens of its observation; else they are a group's, and
  share the whole first prompt.

  Raises:
    ValueError: ``setting="on"`` where sharing cannot work.
  """
  if setting == "off":
    return None
  if setting == "auto" and model.cfg.num_params() < AUTO_MIN_PARAMS:
    return None
  why = _why_not(model, unit, window)
  if why:
    if setting == "on":
      raise ValueError(f"algo: share_prefix='on', but {why}")
    return None
  episode = min(
    rollout.max_context, mixture.needed(codec, rollout, rollout.max_turns)
  )
  parts = mixture.part_codecs(codec)
  system = min(len(c.fragments.system) for c in parts)
  if levels:
    first = max(
      len(c.fragments.system) + c.first_head(rollout.max_turns) for c in parts
    )
    first += LEVELS_SLACK
  else:
    first = mixture.needed(codec, rollout, 1) - rollout.max_new_tokens
  suffixes = suffix_lengths(episode - system, episode, buckets)
  return Plan(unit, min(first, episode), suffixes)


def _why_not(model: Any, unit: int, window: int) -> str:
  """What keeps a pass from sharing prompts ('' where nothing does)."""
  cfg = model.cfg
  if unit < 2:
    return "each pass's rows share no group (rollout.group_size 1)"
  if window:
    return "a context window hides turns (rollout.context_window)"
  if not attention.takes_prefix(cfg.attention, cfg.dtype, attention.platform()):
    kind = attention.choose(cfg.attention, cfg.dtype, attention.platform())
    return f"model.attention={cfg.attention!r} runs the {kind} kernel here"
  return ""


def suffix_lengths(span: int, episode: int, buckets: int) -> tuple[int, ...]:
  """The own tokens a pass may run each row at: ``buckets`` evenly spaced
  up to ``span`` (a row's longest after the system prompt every row of a
  unit shares), multiples of ``SUFFIX_MULTIPLE``, and ``episode`` (a
  row's longest: the last, for a unit that shares nothing)."""
  m = SUFFIX_MULTIPLE
  lengths = {
    min(episode, -(-span * i // buckets // m) * m)
    for i in range(1, buckets + 1)
  }
  return tuple(sorted(lengths | {episode}))
