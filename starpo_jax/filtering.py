"""StarPO-S rollout filtering: keep the groups whose rollouts disagree.

RAGEN's finding: groups whose episodes all earn the same reward carry no
learning signal, and training on them speeds up collapse. Each group is
scored by a metric (the in-group reward standard deviation by default) and
a strategy keeps some groups. Shapes stay static: dropped groups are masked,
never sliced.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from starpo_jax.advantages import group_std

METRICS = ("reward_std", "reward_mean", "reward_sum", "entropy", "length")
STRATEGIES = ("top_p", "top_k", "top_k_abs", "min_p")
TOP_P_MODES = ("linear", "softmax")
LOSS_SCALINGS = ("none", "linear", "sqrt")


@dataclasses.dataclass(frozen=True)
class FilterConfig:
  """RAGEN's ``rollout_filter_*`` settings.

  ``value`` is the kept fraction (``top_p``, ``top_k``), the kept count
  (``top_k_abs``) or the fraction of the best score (``min_p``); ``top_p``
  with ``value >= 1`` keeps everything. ``include_zero=False`` never keeps
  groups whose score is 0 (DAPO's dynamic sampling with ``reward_std``).
  ``loss_scaling`` scales advantages by the kept fraction (or its root).
  """

  metric: str = "reward_std"
  strategy: str = "top_p"
  value: float = 1.0
  largest: bool = True
  include_zero: bool = True
  top_p_mode: str = "linear"
  selection_eps: float = 0.01
  loss_scaling: str = "none"

  def __post_init__(self) -> None:
    for name, known in (
      ("metric", METRICS),
      ("strategy", STRATEGIES),
      ("top_p_mode", TOP_P_MODES),
      ("loss_scaling", LOSS_SCALINGS),
    ):
      if getattr(self, name) not in known:
        raise ValueError(
          f"filter: {name}={getattr(self, name)!r}; expected one of {known}"
        )
    if self.value < 0:
      raise ValueError(f"filter: value={self.value} must be >= 0")

  @property
  def keeps_everything(self) -> bool:
    return self.strategy == "top_p" and self.value >= 1 and self.include_zero


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
    k = int(cfg.value * n) if cfg.strategy == "top_k" else int(cfg.value)
    k = jnp.maximum(jnp.minimum(k, count), 1)
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
