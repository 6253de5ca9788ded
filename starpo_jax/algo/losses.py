"""PPO-family losses on token log-probabilities, all jittable.

``mask [B, T]`` marks the tokens a loss is taken over. Conventions follow
verl (which RAGEN builds on), so that results compare.
"""

from __future__ import annotations

from typing import Literal, get_args

import jax
import jax.numpy as jnp

from starpo_jax.models import sampling

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
AGGREGATIONS = get_args(Aggregation)
KlEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS = get_args(KlEstimator)


def aggregate(loss: jax.Array, mask: jax.Array, mode: str) -> jax.Array:
  """A ``[B, T]`` loss to a scalar.

  ``token-mean`` averages over every masked token; the ``seq-mean`` modes
  average per sequence (over sequences with any masked token), the
  per-sequence value being the mean or the sum of its tokens.
  """
  mask = mask.astype(loss.dtype)
  if mode == "token-mean":
    return jnp.sum(loss * mask) / jnp.maximum(jnp.sum(mask), 1.0)
  per_seq = jnp.sum(loss * mask, axis=-1)
  tokens = jnp.sum(mask, axis=-1)
  if mode == "seq-mean-token-mean":
    per_seq = per_seq / jnp.maximum(tokens, 1.0)
  elif mode != "seq-mean-token-sum":
    raise ValueError(
      f"unknown loss aggregation {mode!r}; expected {AGGREGATIONS}"
    )
  present = (tokens > 0).astype(loss.dtype)
  return jnp.sum(per_seq * present) / jnp.maximum(jnp.sum(present), 1.0)


def normaliser(mask: jax.Array, mode: str) -> jax.Array:
  """What ``aggregate`` divides by (before its floor of 1): masked tokens
  for ``token-mean``, sequences with any masked token otherwise. A loss
  over a batch is the sum of its parts' losses, each weighted by its share
  of this."""
  if mode == "token-mean":
    return jnp.sum(mask.astype(jnp.float32))
  return jnp.sum(jnp.any(mask, axis=-1).astype(jnp.float32))


def token_logprobs(
  logits: jax.Array,
  tokens: jax.Array,
  temperature: float,
  allowed: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Log-probability and entropy of tokens under the policy's logits.

  Args:
    logits: ``[..., V]``, the distribution each token was drawn from.
    tokens: ``[...]``.
    temperature: the sampling temperature (0 means 1).
    allowed: optional ``[V]`` bool, the tokens the policy may emit.

  Returns:
    ``logp [...]`` and ``entropy [...]``.
  """
  logp_all = sampling.policy_logprobs(logits, temperature, allowed)
  logp = jnp.take_along_axis(logp_all, tokens[..., None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  return logp, entropy


def policy_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  clip_low: float,
  clip_high: float,
  dual_clip: float,
  aggregation: str,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The clipped surrogate with asymmetric clipping and dual clip.

  Returns:
    The loss and statistics: ``clip_frac`` (either bound active),
    ``clip_frac_upper`` / ``clip_frac_lower`` (ratio clipped above with a
    positive advantage / below with a negative one), ``dual_clip_frac`` and
    ``approx_kl`` (mean old - new log-probability).
  """
  log_ratio = logp - old_logp
  ratio = jnp.exp(log_ratio)
  loss1 = -advantages * ratio
  loss2 = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  clipped = jnp.maximum(loss1, loss2)
  loss3 = -advantages * dual_clip
  dual = jnp.minimum(loss3, clipped)
  per_token = jnp.where(advantages < 0, dual, clipped)
  m = mask.astype(jnp.float32)
  frac = lambda x: (
    jnp.sum(x.astype(jnp.float32) * m) / jnp.maximum(jnp.sum(m), 1.0)
  )
  stats = {
    "clip_frac": frac(loss2 > loss1),
    "clip_frac_upper": frac((ratio > 1.0 + clip_high) & (advantages > 0)),
    "clip_frac_lower": frac((ratio < 1.0 - clip_low) & (advantages < 0)),
    "dual_clip_frac": frac((clipped > loss3) & (advantages < 0)),
    "approx_kl": frac(-log_ratio),
  }
  return aggregate(per_token, mask, aggregation), stats


def kl(logp: jax.Array, ref_logp: jax.Array, estimator: str) -> jax.Array:
  """Per-token KL(policy || reference) estimates (Schulman's k1, k2, k3)."""
  diff = logp - ref_logp
  if estimator == "k1":
    return diff
  if estimator == "k2":
    return 0.5 * jnp.square(diff)
  if estimator == "k3":
    # verl's low_var_kl, clamped like it.
    return jnp.clip(jnp.exp(-diff) + diff - 1.0, -10.0, 10.0)
  raise ValueError(
    f"unknown KL estimator {estimator!r}; expected {KL_ESTIMATORS}"
  )


def value_loss(
  values: jax.Array,
  old_values: jax.Array,
  returns: jax.Array,
  mask: jax.Array,
  *,
  clip: float,
  aggregation: str,
) -> tuple[jax.Array, jax.Array]:
  """Clipped value loss (0.5 x squared error) and its clip fraction."""
  clipped = old_values + jnp.clip(values - old_values, -clip, clip)
  loss1 = jnp.square(values - returns)
  loss2 = jnp.square(clipped - returns)
  m = mask.astype(jnp.float32)
  clip_frac = jnp.sum((loss2 > loss1) * m) / jnp.maximum(jnp.sum(m), 1.0)
  return 0.5 * aggregate(
    jnp.maximum(loss1, loss2), mask, aggregation
  ), clip_frac
