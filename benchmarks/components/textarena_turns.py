"""What the host bridge adds to a TextArena game's turn.

  python -m benchmarks.components.textarena_turns --json turns.json

The same episodes (``--batch`` games of ``--game`` from seeds 0..B-1, the
same seeded moves, ``--turns`` turns of one move) stepped three ways, each
timed alone over ``--repeats`` rounds (resets outside the timing), the
median per episode-turn reported:

- ``plain``: TextArena as its README runs it, ``env.step(action=...)`` then
  ``env.get_observation()`` per episode, in a Python loop;
- ``wrapper``: ``envs/host/textarena.py``'s episode objects (``step``: the
  same calls, each episode in its own ``random`` stream);
- ``bridge``: the bridge's host side (``envs/batch/slots.py``'s
  ``Slots.act``: a thread per episode bounded by the timeout, type checks,
  the observation tokenized with SmolLM2's tokenizer into its row).

The compiled rollout's round trip to the host (an ``io_callback`` per
turn) is ``benchmarks.components.host_bridge``'s second table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import numpy as np

import envs
from benchmarks import common
from starpo_jax.models import checkpoints

MOVES = ("up", "down", "left", "right")


def plan(batch: int, turns: int) -> np.ndarray:
  """Each episode's move ids ``[B, turns]``, seeded."""
  return np.random.default_rng(0).integers(len(MOVES), size=(batch, turns))


def plain(game: str, moves: np.ndarray) -> float:
  """Seconds for the moves, TextArena stepped directly."""
  import textarena

  games = []
  for seed in range(len(moves)):
    env = textarena.make(f"{game}-raw")
    env.reset(num_players=1, seed=seed)
    env.get_observation()
    games.append(env)
  live = [True] * len(games)
  start = time.perf_counter()
  for t in range(moves.shape[1]):
    for i, env in enumerate(games):
      if live[i]:
        done, _ = env.step(action=f"[{MOVES[moves[i, t]]}]")
        env.get_observation()
        if done:
          env.close()
          live[i] = False
  return time.perf_counter() - start


def wrapper(spec, moves: np.ndarray) -> float:
  games = [spec.make() for _ in range(len(moves))]
  for seed, g in enumerate(games):
    g.reset(seed)
  live = [True] * len(games)
  start = time.perf_counter()
  for t in range(moves.shape[1]):
    for i, g in enumerate(games):
      if live[i]:
        live[i] = not g.step(MOVES[moves[i, t]])[2]
  return time.perf_counter() - start


def bridge(spec, encode, moves: np.ndarray) -> float:
  b = len(moves)
  slots = envs.batched(spec).bind(encode).slots
  slots.reset(0, np.arange(b), None)
  active = np.ones((b,), bool)
  used = np.zeros((b,), np.int32)
  answers = np.zeros((b, 1), np.uint8)
  start = time.perf_counter()
  for t in range(moves.shape[1]):
    actions = moves[:, t : t + 1].astype(np.int32)
    out = slots.act(0, actions, answers, np.zeros(b), active, used, 1 << 20)
    used, active = out["used"], active & ~out["done"]
  return time.perf_counter() - start


def turns_played(game: str, moves: np.ndarray) -> int:
  """Episode-turns the moves play (an episode stops when it ends)."""
  spec = envs.make("textarena", game=game, actions=",".join(MOVES))
  n = 0
  for seed, row in enumerate(moves):
    g = spec.make()
    g.reset(seed)
    for m in row:
      n += 1
      if g.step(MOVES[m])[2]:
        break
  return n


def measure(game: str, batch: int, turns: int, repeats: int) -> dict:
  moves = plan(batch, turns)
  spec = envs.make("textarena", game=game, actions=",".join(MOVES))
  encode = checkpoints.tokenizer(checkpoints.resolve("smollm2-135m")).encode
  ways = {
    "plain": lambda: plain(game, moves),
    "wrapper": lambda: wrapper(spec, moves),
    "bridge": lambda: bridge(spec, encode, moves),
  }
  n = turns_played(game, moves)
  times = {name: [] for name in ways}
  for _ in range(repeats):
    for name, fn in ways.items():
      times[name].append(fn() / n)
  us = {name: 1e6 * statistics.median(x) for name, x in times.items()}
  return {
    "game": game,
    "episode_turns": n,
    "us_per_turn": us,
    "bridge_over_plain": us["bridge"] / us["plain"],
    "wrapper_over_plain": us["wrapper"] / us["plain"],
  }


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--game", default="FrozenLake-v0")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--turns", type=int, default=6)
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  print(f"machine: {common.machine()}", flush=True)
  row = measure(args.game, args.batch, args.turns, args.repeats)
  us = row["us_per_turn"]
  print(
    common.markdown_table(
      ["game", "plain us/turn", "wrapper", "bridge", "bridge / plain"],
      [
        [
          row["game"],
          us["plain"],
          us["wrapper"],
          us["bridge"],
          row["bridge_over_plain"],
        ]
      ],
    )
  )
  payload = {"machine": common.machine(), "argv": sys.argv, "row": row}
  common.write_json(args.json, payload)
  return payload


if __name__ == "__main__":
  main()
