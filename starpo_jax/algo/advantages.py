"""Advantage estimators over token-level rewards, all jittable.

Shapes: ``B`` episodes, ``L`` token positions. ``mask [B, L]`` marks the
tokens the policy generated (the actions of the token-level MDP; prompts and
observations between them are skipped, not stepped through). Rewards sit on
generated tokens: the episode's summed reward on its last generated token,
or each turn's reward on that turn's last token (``use_turn_scores``).
Groups are ``G`` consecutive runs of ``B // G`` episodes that played the
same level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import jax
import jax.numpy as jnp
from flax import struct

NEEDS_CRITIC = ("gae", "bi_level_gae")
EPS = 1e-6


def masked_mean(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
  mask = mask.astype(x.dtype)
  return jnp.sum(x * mask, axis=axis) / jnp.maximum(
    jnp.sum(mask, axis=axis), 1.0
  )


def centered(x: jax.Array, axis: int = -1) -> jax.Array:
  """``x`` minus its mean along ``axis``, exactly 0 where ``x`` is constant.

  The mean is taken of the differences to the first entry (a shifted mean),
  so rounding cannot invent deviations: whitening a constant vector, or
  normalising a group whose rewards are all equal, would otherwise turn
  rounding noise (which depends on the reduction order, hence on the mesh)
  into a full-size advantage.
  """
  d = x - jax.lax.slice_in_dim(x, 0, 1, axis=axis)
  return d - jnp.mean(d, axis=axis, keepdims=True)


def group_std(x: jax.Array) -> jax.Array:
  """Unbiased standard deviation of each row of ``x [groups, n]``; exactly
  0 for a constant row."""
  n = x.shape[1]
  return jnp.sqrt(jnp.sum(jnp.square(centered(x)), axis=1) / max(n - 1, 1))


def masked_whiten(x: jax.Array, mask: jax.Array) -> jax.Array:
  """(x - mean) / std over masked entries (unbiased variance, as verl),
  with the shifted mean of ``centered``: constant entries whiten to 0."""
  flat, m = x.reshape(-1), mask.reshape(-1)
  pivot = flat[jnp.argmax(m)]
  count = jnp.sum(m)
  d = jnp.where(m, flat - pivot, 0.0)
  c = jnp.where(m, d - jnp.sum(d) / jnp.maximum(count, 1), 0.0)
  var = jnp.sum(jnp.square(c)) / jnp.maximum(count - 1, 1)
  return (c * jax.lax.rsqrt(var + 1e-8)).reshape(x.shape)


def _reverse_scan_over_mask(step, init, xs, mask):
  """Scans right to left over positions; masked-out positions leave the
  carry alone and output zero."""

  def body(carry, x):
    x, m = x
    new_carry, out = step(carry, x)
    carry = jax.tree.map(lambda a, b: jnp.where(m, a, b), new_carry, carry)
    return carry, jnp.where(m, out, 0.0)

  xs_t = jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), (xs, mask))
  _, out = jax.lax.scan(body, init, xs_t, reverse=True)
  return jnp.swapaxes(out, 0, 1)


def gae(
  rewards: jax.Array,
  values: jax.Array,
  mask: jax.Array,
  gamma: float,
  lam: float,
) -> tuple[jax.Array, jax.Array]:
  """Generalised advantage estimation over the generated tokens.

  Returns:
    advantages (whitened over ``mask``, as verl) and returns, ``[B, L]``.
  """
  b = rewards.shape[0]

  def step(carry, x):
    next_value, last_gae = carry
    r, v = x
    delta = r + gamma * next_value - v
    adv = delta + gamma * lam * last_gae
    return (v, adv), adv

  zeros = jnp.zeros((b,), jnp.float32)
  adv = _reverse_scan_over_mask(step, (zeros, zeros), (rewards, values), mask)
  returns = jnp.where(mask, adv + values, 0.0)
  return masked_whiten(adv, mask), returns


def bi_level_gae(
  rewards: jax.Array,
  values: jax.Array,
  mask: jax.Array,
  turn_end: jax.Array,
  gamma: float,
  lam: float,
  turn_gamma: float,
) -> tuple[jax.Array, jax.Array]:
  """RAGEN's two-level GAE: over turns with ``turn_gamma``, then over the
  tokens inside each turn with ``gamma``.

  The turn level runs over the turns' last tokens (``turn_end``), bootstrapping
  from the next turn's value there; its returns become the reward of each
  turn's last token, and the token level runs inside each turn, restarting
  at every turn end. Choice made here: turn ends come from the trajectory;
  RAGEN finds them as the nonzero rewards, missing turns whose reward is
  exactly 0.

  Returns:
    advantages (whitened over ``mask``) and returns, ``[B, L]``.
  """
  b = rewards.shape[0]

  def turn_step(carry, x):
    next_value, last_gae = carry
    r, v = x
    delta = r + turn_gamma * next_value - v
    adv = delta + turn_gamma * lam * last_gae
    return (v, adv), adv

  zeros = jnp.zeros((b,), jnp.float32)
  turn_adv = _reverse_scan_over_mask(
    turn_step, (zeros, zeros), (rewards, values), turn_end
  )
  turn_return = turn_adv + values

  def token_step(carry, x):
    next_value, last_gae = carry
    r, v, end = x
    next_value = jnp.where(end, 0.0, next_value)
    last_gae = jnp.where(end, 0.0, last_gae)
    r = jnp.where(end, r, 0.0)
    delta = r + gamma * next_value - v
    adv = delta + gamma * lam * last_gae
    return (v, adv), adv

  token_rewards = jnp.where(turn_end, turn_return, 0.0)
  adv = _reverse_scan_over_mask(
    token_step,
    (zeros, zeros),
    (token_rewards, values, turn_end.astype(jnp.float32)),
    mask,
  )
  returns = jnp.where(mask, adv + values, 0.0)
  return masked_whiten(adv, mask), returns


def _group(x: jax.Array, groups: int) -> jax.Array:
  return x.reshape(groups, -1)


def grpo(
  scores: jax.Array, mask: jax.Array, groups: int, norm_by_std: bool
) -> jax.Array:
  """GRPO (``norm_by_std``) or Dr.GRPO advantages, ``[B, L]``.

  Args:
    scores: float ``[B]`` episode scores (summed rewards).
  """
  g = _group(scores, groups)
  if g.shape[1] == 1:
    # verl: a group of one has mean 0 and std 1.
    adv, std = g, 1.0
  else:
    adv = centered(g)
    std = group_std(g)[:, None]
  if norm_by_std:
    adv = adv / (std + EPS)
  return adv.reshape(-1)[:, None] * mask


def rloo(scores: jax.Array, mask: jax.Array, groups: int) -> jax.Array:
  """REINFORCE leave-one-out: each score minus the mean of the others."""
  g = _group(scores, groups)
  n = g.shape[1]
  if n > 1:
    g = centered(g) * n / (n - 1)
  return g.reshape(-1)[:, None] * mask


def reinforce_plus_plus(
  rewards: jax.Array, mask: jax.Array, gamma: float
) -> tuple[jax.Array, jax.Array]:
  """Discounted returns-to-go over generated tokens, whitened over the batch.

  Returns:
    advantages and returns, ``[B, L]``.
  """
  b = rewards.shape[0]

  def step(running, r):
    running = r + gamma * running
    return running, running

  returns = _reverse_scan_over_mask(
    step, jnp.zeros((b,), jnp.float32), rewards, mask
  )
  return masked_whiten(returns, mask), returns


def reinforce_plus_plus_baseline(
  scores: jax.Array, mask: jax.Array, groups: int
) -> jax.Array:
  """Group-mean baseline, then whitening over the batch's tokens."""
  g = _group(scores, groups)
  adv = (g - jnp.mean(g, axis=1, keepdims=True)).reshape(-1)[:, None] * mask
  return masked_whiten(adv, mask)


@struct.dataclass
class Inputs:
  """What an estimator may read; ``[B, L]`` unless noted."""

  rewards: jax.Array  # token rewards
  values: jax.Array  # the critic's values (0 without a critic)
  mask: jax.Array  # bool: tokens trained on
  turn_end: jax.Array  # bool: the last trained token of each turn
  scores: jax.Array  # [B] each episode's summed reward


class Settings(Protocol):
  """The estimator settings of ``step.AlgoConfig``."""

  gamma: float
  lam: float
  turn_gamma: float
  norm_adv_by_std: bool


Estimator = Callable[
  [Inputs, int, Settings], tuple[jax.Array, jax.Array | None]
]

# name -> (inputs, groups, settings) -> (advantages, returns or None).
ESTIMATORS: dict[str, Estimator] = {
  "gae": lambda x, g, s: gae(x.rewards, x.values, x.mask, s.gamma, s.lam),
  "bi_level_gae": lambda x, g, s: bi_level_gae(
    x.rewards, x.values, x.mask, x.turn_end, s.gamma, s.lam, s.turn_gamma
  ),
  "grpo": lambda x, g, s: (grpo(x.scores, x.mask, g, s.norm_adv_by_std), None),
  "rloo": lambda x, g, s: (rloo(x.scores, x.mask, g), None),
  "reinforce_plus_plus": lambda x, g, s: reinforce_plus_plus(
    x.rewards, x.mask, s.gamma
  ),
  "reinforce_plus_plus_baseline": lambda x, g, s: (
    reinforce_plus_plus_baseline(x.scores, x.mask, g),
    None,
  ),
}


def compute(
  name: str, inputs: Inputs, groups: int, settings: Settings
) -> tuple[jax.Array, jax.Array]:
  """Advantages and returns ``[B, L]`` (returns are 0 for estimators that
  have none): the one place an estimator is chosen by name."""
  if name not in ESTIMATORS:
    raise ValueError(
      f"unknown advantage estimator {name!r}; expected one of "
      f"{tuple(ESTIMATORS)}"
    )
  advantages, returns = ESTIMATORS[name](inputs, groups, settings)
  if returns is None:
    returns = jnp.zeros_like(advantages)
  return advantages, returns
