"""Held-out evaluation: success with a 95% interval, sampled and greedy,
beside a random player on the same levels; readable transcripts.

Validation plays levels no training step draws: training steps fold the
step number into ``key(seed)``, evaluation uses a key split from it. The
levels are the same at every evaluation of a run.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np
from flax import nnx

from envs import Env, planning
from starpo_jax import diagnostics, sharding
from starpo_jax import rollout as rollout_lib
from starpo_jax.models.tokenizer import Tokenizer


def wilson_interval(successes: int, n: int, z: float = 1.96):
  """The Wilson score interval of a success rate (95% by default)."""
  if n == 0:
    return 0.0, 1.0
  p = successes / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return max(0.0, centre - half), min(1.0, centre + half)


def random_valid_success(
  env: Env, states: Any, actions: int, key: jax.Array
) -> jax.Array:
  """Which episodes ``[B]`` a player solves that takes up to ``actions``
  uniformly random actions among those valid in each state (never a
  malformed or unavailable answer): the bar a policy that ignores the
  board cannot pass. Jittable; ``states`` are batched."""
  b = jax.tree.leaves(states)[0].shape[0]
  play = lambda s, k: planning.random_valid_play(env, s, actions, k)[1]
  return jax.vmap(play)(states, jax.random.split(key, b))


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


def held_out_key(seed: int) -> jax.Array:
  """The key of the evaluation levels (never a training step's key)."""
  return jax.random.split(jax.random.key(seed))[1]


class Evaluator:
  """Jitted held-out rollouts for each evaluation environment and
  temperature; ``evaluator(params) -> (metrics, transcripts)``.

  Metrics are named ``{env}/{stat}`` at the first temperature and
  ``{env}/{stat}@t{T}`` at the others; success comes with its 95% Wilson
  interval (``success_lo``, ``success_hi``), and ``{env}/random_success``
  is a random valid player on the same levels.
  """

  def __init__(
    self,
    *,
    envs: dict[str, Env],
    codecs: dict[str, Any],
    rollout_cfg: rollout_lib.RolloutConfig,
    policy_def: Any,
    episodes: int,
    temperatures: tuple[float, ...],
    seed: int,
    tokenizer: Tokenizer,
    transcripts: bool,
    mesh: Any = None,
  ) -> None:
    self.temperatures = tuple(float(t) for t in temperatures)
    self.tokenizer, self.transcripts = tokenizer, transcripts
    base = dataclasses.replace(rollout_cfg, env_groups=episodes, group_size=1)
    everywhere = sharding.replicated(mesh)
    self.runs = {}
    for name, env in envs.items():
      for t in self.temperatures:
        cfg = dataclasses.replace(base, temperature=t)
        # Replicated outputs: every host can read the summary and transcript.
        play = lambda params, codec, key, env=env, cfg=cfg: rollout_lib.rollout(
          nnx.merge(policy_def, params), codec, env, cfg, key
        )
        self.runs[(name, t)] = jax.jit(
          sharding.traced_for(mesh, play), out_shardings=everywhere
        )
    key = held_out_key(seed)
    self.key = jax.random.wrap_key_data(
      sharding.replicate(jax.random.key_data(key), mesh)
    )
    self.codecs = {n: sharding.replicate(c, mesh) for n, c in codecs.items()}
    self.random = {}
    for name, env in envs.items():
      states = rollout_lib.reset(env, base, rollout_lib.reset_key(key))
      wins = jax.jit(random_valid_success, static_argnums=(0, 2))(
        env, states, base.max_actions_per_traj, jax.random.fold_in(key, 1)
      )
      self.random[name] = _rate(np.asarray(sharding.local_value(wins)))

  def __call__(self, params: Any) -> tuple[dict[str, float], dict[str, str]]:
    metrics, transcripts = {}, {}
    for (name, t), run in self.runs.items():
      traj = jax.tree.map(
        sharding.local_value, run(params, self.codecs[name], self.key)
      )
      suffix = "" if t == self.temperatures[0] else f"@t{t:g}"
      stats = {
        k: float(v)
        for k, v in diagnostics.summary(traj, 1).items()
        if not k.startswith("pass@")
      }
      stats.update(_rate(np.asarray(traj.success)))
      for k, v in stats.items():
        metrics[f"{name}/{k}{suffix}"] = v
      if self.transcripts:
        transcripts[f"{name}_t{t:g}"] = transcript(traj, self.tokenizer, 0)
    for name, stats in self.random.items():
      for k, v in stats.items():
        metrics[f"{name}/random_{k}"] = v
    return metrics, transcripts


def _rate(success: np.ndarray) -> dict[str, float]:
  wins, n = int(np.sum(success)), int(success.size)
  lo, hi = wilson_interval(wins, n)
  return {"success": wins / max(n, 1), "success_lo": lo, "success_hi": hi}
