"""Several environments in one run (RAGEN's ``es_manager`` tags): a
``Mixture`` of parts, each an environment with its own settings, tag and
number of rollout groups, played inside the one compiled step.

  mix = Mixture((Part("sokoban", sokoban, 4), Part("frozen_lake", lake, 4)))
  codec = MixedCodec.build((sokoban_codec, lake_codec))
  traj = play(model, codec, mix, cfg, key)   # cfg.env_groups == 8

Each part rolls out on its own, one after another in the graph (like
``RolloutConfig.chunks``): its own environment (jittable or Python), its
own codec (system prompt, observation pieces, action names, answer
grammar), its system prompt prefilled once. Every part shares the
rollout's settings, so their trajectories have the same shapes and are
joined along the batch, part after part: one model batch for scoring and
one update. The filter then compares groups across the parts, as RAGEN's
does over its whole batch.

One thing is made common: the tokens the policy may emit
(``answer_vocab``) are the union of the parts', so that every episode
samples from the distribution the update scores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

import envs
from starpo_jax.agent.codec import Codec
from starpo_jax.agent.rollout import Trajectory, context_needed, rollout
from starpo_jax.agent.rollout_config import RolloutConfig


@dataclasses.dataclass(frozen=True)
class Part:
  """One environment of a mixture: its tag (metrics are named by it), the
  environment (one ``envs.batched`` takes) and its rollout groups."""

  tag: str
  env: Any
  groups: int


@dataclasses.dataclass(frozen=True)
class Mixture:
  """Environments played in one step, in this order along the batch;
  static (hashable), like a ``BatchEnv``."""

  parts: tuple[Part, ...]

  def __post_init__(self) -> None:
    tags = [p.tag for p in self.parts]
    if len(set(tags)) != len(tags) or not tags:
      raise ValueError(f"mixture: tags {tags} must be distinct, at least one")
    for p in self.parts:
      if p.groups < 1:
        raise ValueError(f"mixture: {p.tag} has {p.groups} groups, needs >= 1")

  @property
  def groups(self) -> int:
    return sum(p.groups for p in self.parts)

  @property
  def tags(self) -> tuple[str, ...]:
    return tuple(p.tag for p in self.parts)

  def bind(self, encode: Any, batch_axes: tuple[str, ...] = ()) -> Mixture:
    parts = [
      dataclasses.replace(p, env=envs.batched(p.env).bind(encode, batch_axes))
      for p in self.parts
    ]
    return Mixture(tuple(parts))

  def configs(self, cfg: RolloutConfig) -> tuple[RolloutConfig, ...]:
    """Each part's rollout settings: ``cfg`` with its groups."""
    if cfg.env_groups != self.groups:
      raise ValueError(
        f"rollout: env_groups={cfg.env_groups} must be the mixture's "
        f"{self.groups} groups ({self.describe()})"
      )
    return tuple(
      dataclasses.replace(cfg, env_groups=p.groups) for p in self.parts
    )

  def rows(self, group_size: int) -> tuple[tuple[str, int, int], ...]:
    """Each part's tag and its rows ``[start, stop)`` of the batch."""
    out, start = [], 0
    for p in self.parts:
      stop = start + p.groups * group_size
      out.append((p.tag, start, stop))
      start = stop
    return tuple(out)

  def describe(self) -> str:
    return " + ".join(f"{p.tag} x {p.groups}" for p in self.parts)


@struct.dataclass
class MixedCodec:
  """The parts' codecs, in the mixture's order, and the tokens every part
  may emit (``None``: all)."""

  parts: tuple[Codec, ...]
  allowed: jax.Array | None

  @classmethod
  def build(cls, codecs: tuple[Codec, ...]) -> MixedCodec:
    """Joins the parts' codecs; their ``allowed`` become the union."""
    masks = [c.allowed for c in codecs]
    if any(m is None for m in masks):
      allowed = None
    else:
      allowed = jnp.any(jnp.stack(masks), axis=0)
    parts = tuple(c.replace(allowed=allowed) for c in codecs)
    return cls(parts=parts, allowed=allowed)

  def context_needed(self, cfg: RolloutConfig, turns: int) -> int:
    """The longest context ``turns`` turns of any part can fill."""
    return max(context_needed(c, cfg, turns) for c in self.parts)


def part_codecs(codec: Any) -> tuple[Codec, ...]:
  """Each part's codec: a ``MixedCodec``'s parts, or ``codec`` alone."""
  return codec.parts if isinstance(codec, MixedCodec) else (codec,)


def needed(codec: Any, cfg: RolloutConfig, turns: int) -> int:
  """The longest context ``turns`` turns of ``cfg`` fill with ``codec``
  (a ``MixedCodec``: its longest part's)."""
  if isinstance(codec, MixedCodec):
    return codec.context_needed(cfg, turns)
  return context_needed(codec, cfg, turns)


def window_width(codec: Any, cfg: RolloutConfig) -> int:
  """The most tokens a re-rendered prompt holds
  (``context_method="reprefill"``): the system prompt, then the visible
  turns' prompt chunks and replies; 0 for the other methods."""
  if cfg.context_method != "reprefill":
    return 0
  return min(needed(codec, cfg, cfg.visible_turns), cfg.max_context)


def play(
  model: Any,
  codec: Any,
  env: Any,
  cfg: RolloutConfig,
  key: jax.Array,
  constrain: Callable[[Any], Any] = lambda tree: tree,
) -> Trajectory:
  """``rollout`` of one environment, or of a ``Mixture`` (with its
  ``MixedCodec``): each part with ``fold_in(key, i)`` (a part alone with
  ``key`` itself, so it plays as its environment would), joined along the
  batch."""
  if not isinstance(env, Mixture):
    return rollout(model, codec, env, cfg, key, constrain)
  one = len(env.parts) == 1
  return join(
    [
      rollout(
        model,
        c,
        part.env,
        part_cfg,
        key if one else jax.random.fold_in(key, i),
        constrain,
      )
      for i, (part, c, part_cfg) in enumerate(
        zip(env.parts, codec.parts, env.configs(cfg), strict=True)
      )
    ]
  )


def join(trajectories: list[Any]) -> Any:
  """Trajectories (or any batch-first trees of one structure) one after
  another along the batch."""
  return jax.tree.map(lambda *x: jnp.concatenate(x), *trajectories)


def slice_rows(tree: Any, start: int, stop: int) -> Any:
  """Rows ``[start, stop)`` of a batch-first tree."""
  return jax.tree.map(lambda x: x[start:stop], tree)
