"""Evaluation: success rates, pass@k and readable transcripts."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from starpo_jax.models.tokenizer import Tokenizer
from starpo_jax.rollout import Trajectory


def summary(traj: Trajectory, group_size: int) -> dict[str, jax.Array]:
  """On-device episode statistics of a rollout (scalars)."""
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


def transcript(traj: Any, tokenizer: Tokenizer, episode: int) -> str:
  """One episode as text, exactly as the model saw it, with each turn's
  reward added on a line of its own in brackets."""
  tokens = np.asarray(traj.tokens[episode])
  turns = np.asarray(traj.turn_ids[episode])
  generated = np.asarray(traj.loss_mask[episode])
  rewards = np.asarray(traj.turn_rewards[episode])
  n = int(traj.length[episode])
  out = [tokenizer.decode(tokens[:n][turns[:n] < 0])]
  for k in range(int(turns[:n].max(initial=-1)) + 1):
    here = turns[:n] == k
    prompt = tokenizer.decode(tokens[:n][here & ~generated[:n]])
    reply = tokenizer.decode(tokens[:n][here & generated[:n]])
    out.append(f"{prompt}{reply}\n[turn {k + 1} reward: {rewards[k]:+.2f}]\n")
  status = "success" if bool(traj.success[episode]) else "no success"
  out.append(
    f"[episode return {float(traj.episode_return[episode]):+.2f}, {status}]"
  )
  return "".join(out)
