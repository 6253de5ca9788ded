"""Success of a player that takes uniformly random valid actions: the bar a
trained agent must clear to show it reads the board.

  python -m experiments.random_baseline            # the training configs
  python -m experiments.random_baseline --episodes 4096 --actions 10

Each episode takes up to ``--actions`` actions (the configs'
``max_actions_per_traj``), each drawn uniformly from those valid in the
state, so it never breaks the format. Training runs report the same player
on their own held-out levels (``eval/random_success``).
"""

from __future__ import annotations

import argparse

import jax

import envs
from starpo_jax.run import evaluator

# (name, kwargs) as the configs play them.
ENVS = (
  ("sokoban", {}),
  ("frozen_lake", {"success_rate": 1.0}),
  ("bandit", {}),
)


def success_rate(env, episodes: int, actions: int, seed: int = 0) -> float:
  """Fraction of ``episodes`` new levels the random valid player solves."""
  k_reset, k_act = jax.random.split(jax.random.key(seed))
  states, _ = jax.vmap(env.reset)(jax.random.split(k_reset, episodes))
  wins = jax.jit(evaluator.random_valid_success, static_argnums=(0, 2))(
    env, states, actions, k_act
  )
  return float(wins.mean())


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
