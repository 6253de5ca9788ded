"""Shows the environments: a generated level in each render mode, then
random play on thousands of environments inside one jit.

  python -m envs.demo [--env sokoban] [--batch 4096]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

import envs


def random_play(env, batch: int, steps: int, key: jax.Array):
  """Plays ``batch`` episodes of uniformly random actions, all in one jit."""

  @jax.jit
  def play(key):
    k_reset, k_act = jax.random.split(key)
    states, _ = jax.vmap(env.reset)(jax.random.split(k_reset, batch))
    actions = jax.random.randint(k_act, (steps, batch), 0, env.spec.num_actions)

    def body(carry, action):
      states, ret, done, success = carry
      states, ts = jax.vmap(env.step)(states, action)
      live = ~done
      return (
        states,
        ret + jnp.where(live, ts.reward, 0.0),
        done | ts.done,
        success | (live & ts.success),
      ), None

    zeros = jnp.zeros((batch,))
    init = (states, zeros, zeros.astype(bool), zeros.astype(bool))
    (_, ret, done, success), _ = jax.lax.scan(body, init, actions)
    return ret.mean(), done.mean(), success.mean()

  play(key)  # compile
  start = time.perf_counter()
  ret, done, success = jax.block_until_ready(play(jax.random.fold_in(key, 1)))
  return float(ret), float(done), float(success), time.perf_counter() - start


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--env", default="sokoban", choices=sorted(envs.REGISTRY))
  parser.add_argument("--batch", type=int, default=4096)
  parser.add_argument("--steps", type=int, default=100)
  args = parser.parse_args()
  key = jax.random.key(0)
  modes = ["grid", "coord", "grid_coord"]
  if args.env == "bandit":
    modes = [None]
  for mode in modes:
    env = envs.make(args.env, **({"render_mode": mode} if mode else {}))
    state, _ = env.reset(key)
    print(f"--- {args.env}, render_mode={mode} ---")
    print(envs.to_text(env.spec, *env.render(state)))
  env = envs.make(args.env)
  ret, done, success, seconds = random_play(env, args.batch, args.steps, key)
  steps = args.batch * args.steps
  print(
    f"\nRandom play, {args.batch} episodes x {args.steps} actions in one jit: "
    f"{steps / seconds:,.0f} steps/s, mean return {ret:.2f}, "
    f"{done:.0%} ended, {success:.1%} solved."
  )


if __name__ == "__main__":
  main()
