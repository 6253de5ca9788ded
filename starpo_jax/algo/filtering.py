"""StarPO-S rollout filtering: keep the groups whose rollouts disagree.

RAGEN's finding: groups whose episodes all earn the same reward carry no
learning signal, and training on them speeds up collapse. Each group is
scored by a metric (the in-group reward standard deviation by default) and
a strategy keeps some groups. Shapes stay static: the kept groups are
gathered into ``capacity(cfg, groups)`` slots (exact for ``top_k``,
``top_k_abs`` and linear ``top_p``; a setting otherwise), so the update
runs only over them; a slot with no kept group is masked.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax
import jax.numpy as jnp

from starpo_jax import settings
from starpo_jax.algo.advantages import group_std

Metric = Literal["reward_std", "reward_mean", "reward_sum", "entropy", "length"]


@dataclasses.dataclass(frozen=True)
class FilterConfig:
  """RAGEN's ``rollout_filter_*`` settings.

  ``value`` is the kept fraction (``top_p``, ``top_k``), the kept count
  (``top_k_abs``) or the fraction of the best score (``min_p``); ``top_p``
  with ``value >= 1`` keeps everything. ``include_zero=False`` never keeps
  groups whose score is 0 (DAPO's dynamic sampling with ``reward_std``).
  ``loss_scaling`` scales advantages by the kept fraction (or its root).
  ``capacity`` is how many groups the update holds (0: derived, see
  ``capacity``); the filter's groups beyond it are dropped, least
  preferred first, and counted (``filter/over_capacity``).
  ``by_part`` (with ``env.mixture``) applies the rule to each part's
  groups apart, so each environment keeps its share; by default all
  groups are ranked together, as RAGEN does, where an environment with
  larger rewards (a larger in-group spread) takes the kept slots.
  """

  metric: Metric = "reward_std"
  strategy: Literal["top_p", "top_k", "top_k_abs", "min_p"] = "top_p"
  value: float = 1.0
  largest: bool = True
  include_zero: bool = True
  top_p_mode: Literal["linear", "softmax"] = "linear"
  selection_eps: float = 0.01
  loss_scaling: Literal["none", "linear", "sqrt"] = "none"
  capacity: int = 0
  by_part: bool = False

  def __post_init__(self) -> None:
    settings.check(self, "filter")
    settings.within(self, "filter", selection_eps=(0, None))
    if self.value < 0:
      raise ValueError(f"filter: value={self.value} must be >= 0")
    if self.capacity < 0:
      raise ValueError(
        f"filter: capacity={self.capacity} must be >= 0 (0: derived)"
      )

  @property
  def keeps_everything(self) -> bool:
    return self.strategy == "top_p" and self.value >= 1 and self.include_zero


def _top_k(cfg: FilterConfig, groups: int) -> int:
  """``top_k`` / ``top_k_abs``'s count before the candidates bound it."""
  k = int(cfg.value * groups) if cfg.strategy == "top_k" else int(cfg.value)
  return min(max(k, 1), groups)


def capacity(cfg: FilterConfig, groups: int) -> int:
  """How many of ``groups`` rollout groups the update holds.

  ``cfg.capacity`` if set (at most ``groups``); else the most the filter
  can keep: ``k`` for ``top_k`` / ``top_k_abs``; ``ceil(value * groups)``
  for ``top_p`` (exact in linear mode: the top ``k`` groups hold at least
  ``k / groups`` of the summed score, so a ``(k + 1)``-th is never needed;
  softmax mode may want more); every group for ``min_p``, whose count has
  no bound below that.
  """
  if cfg.capacity:
    return min(cfg.capacity, groups)
  if cfg.strategy in ("top_k", "top_k_abs"):
    return _top_k(cfg, groups)
  if cfg.strategy == "top_p":
    return min(max(math.ceil(cfg.value * groups - 1e-9), 1), groups)
  return groups


def by_parts(
  scores: jax.Array, cfg: FilterConfig, parts: tuple[int, ...]
) -> jax.Array:
  """``keep_groups`` applied to each part's groups apart (``parts``: each
  part's group count, in the batch's order), ``[G]`` bool."""
  kept, start = [], 0
  for n in parts:
    kept.append(keep_groups(scores[start : start + n], cfg))
    start += n
  return jnp.concatenate(kept)


def preference(scores: jax.Array, keep: jax.Array, largest: bool) -> jax.Array:
  """Group indices ``[G]``: kept groups first, each part in the filter's
  order of preference (stable for ties)."""
  direction = -1.0 if largest else 1.0
  return jnp.lexsort((direction * scores, ~keep))


def group_scores(
  metric: str,
  returns: jax.Array,
  lengths: jax.Array,
  entropy: jax.Array,
  groups: int,
) -> jax.Array:
  """Per-group selection score ``[G]`` from per-episode values ``[B]``."""
  if metric == "reward_std":
    x = returns.reshape(groups, -1)
    return group_std(x) if x.shape[1] > 1 else jnp.zeros(groups)
  source = {
    "reward_mean": returns,
    "reward_sum": returns,
    "entropy": entropy,
    "length": lengths.astype(jnp.float32),
  }[metric]
  x = source.reshape(groups, -1)
  return jnp.sum(x, axis=1) if metric == "reward_sum" else jnp.mean(x, axis=1)


def keep_groups(scores: jax.Array, cfg: FilterConfig) -> jax.Array:
  """Which groups to train on, ``[G]`` bool (RAGEN's selection rules)."""
  n = scores.shape[0]
  candidate = jnp.ones(n, bool) if cfg.include_zero else jnp.abs(scores) > 1e-10
  count = jnp.sum(candidate)
  if cfg.strategy == "top_p" and cfg.value >= 1:
    return candidate
  if cfg.strategy == "min_p":
    if cfg.largest:
      best = jnp.max(jnp.where(candidate, scores, -jnp.inf))
      keep = scores >= best * cfg.value - 1e-10
    else:
      best = jnp.min(jnp.where(candidate, scores, jnp.inf))
      keep = scores <= best / (cfg.value + 1e-10) + 1e-10
    return keep & candidate
  direction = -1.0 if cfg.largest else 1.0
  # Candidates first, in preference order (stable for ties).
  order = jnp.argsort(
    jnp.where(candidate, direction * scores, jnp.inf), stable=True
  )
  ranked = scores[order]
  ranked_candidate = candidate[order]
  position = jnp.arange(n)
  if cfg.strategy in ("top_k", "top_k_abs"):
    k = jnp.maximum(jnp.minimum(_top_k(cfg, n), count), 1)
    take = ranked_candidate & (position < k)
  elif cfg.top_p_mode == "softmax":
    logits = jnp.where(ranked_candidate, -direction * ranked, -jnp.inf)
    probs = jax.nn.softmax(logits)
    cumulative = jnp.cumsum(probs)
    cutoff = jnp.sum(cumulative < cfg.value)  # torch.searchsorted (left)
    k = jnp.minimum(cutoff + 1, count)
    take = ranked_candidate & (position < k)
  else:
    # Linear: walk the ranked scores, adding them up until their sum reaches
    # value * total; stop at the first non-positive score. Keep nothing if
    # the threshold is never reached.
    values = jnp.where(ranked_candidate, ranked, 0.0)
    threshold = cfg.value * jnp.sum(values) - cfg.selection_eps
    before = jnp.cumsum(values) - values
    step_ok = ranked_candidate & (before < threshold) & (values > 0)
    take = jnp.cumprod(step_ok).astype(bool)
    reached = jnp.sum(jnp.where(take, values, 0.0)) >= threshold
    take = take & reached
  return jnp.zeros(n, bool).at[order].set(take)


def loss_scale(kept_fraction: jax.Array, cfg: FilterConfig) -> jax.Array:
  if cfg.loss_scaling == "linear":
    return kept_fraction
  if cfg.loss_scaling == "sqrt":
    return jnp.sqrt(kept_fraction)
  return jnp.ones_like(kept_fraction)
