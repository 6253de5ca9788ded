"""Success of a uniformly random action policy: the bar a trained agent
must clear to show it reads the board.

  python -m benchmarks.random_baseline            # the training configs
  python -m benchmarks.random_baseline --episodes 4096 --actions 10

Each episode takes up to ``--actions`` uniformly random actions (the
configs' ``max_actions_per_traj``), always well formed and valid, so this is
an upper bound on what a policy that ignores the observation but never
breaks the format reaches.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import envs

# (name, kwargs) as the configs play them.
ENVS = (
  ("sokoban", {}),
  ("frozen_lake", {"success_rate": 1.0}),
)


def success_rate(env, episodes: int, actions: int, seed: int = 0) -> float:
  """Fraction of ``episodes`` a uniformly random policy solves."""
  k_reset, k_act = jax.random.split(jax.random.key(seed))
  state, _ = jax.vmap(env.reset)(jax.random.split(k_reset, episodes))
  n_actions = len(env.spec.action_names)

  def body(carry, k):
    state, done, success = carry
    a = jax.random.randint(k, (episodes,), 0, n_actions)
    state, ts = jax.vmap(env.step)(state, a)
    success = success | (~done & ts.success)
    return (state, done | ts.done, success), None

  init = (state, jnp.zeros(episodes, bool), jnp.zeros(episodes, bool))
  (_, _, success), _ = jax.jit(
    lambda init, keys: jax.lax.scan(body, init, keys)
  )(init, jax.random.split(k_act, actions))
  return float(jnp.mean(success))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--episodes", type=int, default=4096)
  parser.add_argument("--actions", type=int, default=10)
  args = parser.parse_args()
  for name, kwargs in ENVS:
    rate = success_rate(envs.make(name, **kwargs), args.episodes, args.actions)
    print(f"{name}: {100 * rate:.1f}% with {args.actions} random actions")


if __name__ == "__main__":
  main()
