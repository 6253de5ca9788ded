"""Metrics computed on device: episode statistics of a rollout and the
per-step training metrics (rewards, their in-group spread, entropy,
filtering, losses, clipping, gradient norms, the critic's fit)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from starpo_jax import advantages as adv_lib
from starpo_jax import filtering
from starpo_jax.rollout import Trajectory


def summary(traj: Trajectory, group_size: int) -> dict[str, jax.Array]:
  """Episode statistics of a rollout (scalars): success, pass@group,
  return, actions and turns per episode, and per-turn rates of valid,
  effective and well-formed answers."""
  played = traj.turn_played
  turns = jnp.maximum(jnp.sum(played), 1)
  groups = traj.success.reshape(-1, group_size)
  return {
    "success": jnp.mean(traj.success),
    f"pass@{group_size}": jnp.mean(jnp.any(groups, axis=1)),
    "return": jnp.mean(traj.episode_return),
    "num_actions": jnp.mean(traj.num_actions),
    "num_turns": jnp.mean(jnp.sum(played, axis=1)),
    "valid_action_rate": jnp.sum(traj.turn_valid) / turns,
    "effective_action_rate": jnp.sum(traj.turn_effective) / turns,
    "format_rate": jnp.sum(traj.turn_format_ok) / turns,
    "response_length": jnp.sum(traj.response_lengths) / turns,
    "truncated": jnp.mean(traj.truncated),
    "context_truncated": jnp.mean(traj.context_truncated),
  }


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  m = mask.astype(jnp.float32)
  return jnp.sum(x * m) / jnp.maximum(jnp.sum(m), 1.0)


def update_metrics(stats: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Per-minibatch statistics ``[epochs, minibatches]`` averaged over the
  minibatches that trained (``live`` and finite)."""
  stats = {k: v.reshape(-1) for k, v in stats.items()}
  live, skipped = stats.pop("live"), stats.pop("skipped")
  ok = live & ~skipped
  count = jnp.maximum(jnp.sum(ok), 1)
  out = {
    f"train/{k}": jnp.sum(jnp.where(ok, v, 0.0)) / count
    for k, v in stats.items()
  }
  out["train/updates"] = jnp.sum(ok).astype(jnp.float32)
  out["train/skipped_nonfinite"] = jnp.sum(skipped).astype(jnp.float32)
  return out


def explained_variance(
  returns: jax.Array, values: jax.Array, mask: jax.Array
) -> jax.Array:
  """``1 - Var(returns - values) / Var(returns)`` over masked tokens."""
  m = mask.astype(jnp.float32)
  var = lambda x: adv_lib.masked_mean(
    jnp.square(x - adv_lib.masked_mean(x, m)), m
  )
  resid = jnp.where(mask, returns - values, 0.0)
  return 1.0 - var(resid) / jnp.maximum(
    var(jnp.where(mask, returns, 0.0)), 1e-8
  )


def step_metrics(
  traj: Trajectory,
  scored: Any,
  selection: Any,
  batch: Any,
  stats: dict[str, jax.Array],
  group_size: int,
  algo: Any,
) -> dict[str, jax.Array]:
  """The training step's flat metric dict (``step.Scored``,
  ``step.Selection``, ``step.Batch`` and the update's statistics)."""
  metrics = update_metrics(stats)
  metrics.update(
    {f"rollout/{k}": v for k, v in summary(traj, group_size).items()}
  )
  groups = selection.group_scores.shape[0]
  spread = filtering.group_scores(
    "reward_std", scored.scores, scored.lengths, scored.episode_entropy, groups
  )
  metrics.update(
    {
      "rollout/in_group_reward_std": jnp.mean(spread),
      "rollout/in_group_reward_std_min": jnp.min(spread),
      "rollout/in_group_reward_std_max": jnp.max(spread),
      "rollout/entropy": _masked_mean(scored.entropy, scored.mask),
      "rollout/generated_tokens": jnp.sum(traj.response_lengths).astype(
        jnp.float32
      ),
      "filter/kept_ratio": selection.kept_fraction,
    }
  )
  if algo.uses_reference:
    metrics["rollout/kl_to_reference"] = _masked_mean(scored.kl, scored.mask)
  if algo.uses_critic:
    metrics["train/explained_variance"] = explained_variance(
      batch.returns, batch.values, batch.mask
    )
  return metrics
