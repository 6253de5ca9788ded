"""Environment throughput: jitted, vmapped JAX beside plain-Python loops.

  python -m benchmarks.components.envs  # full table, ~4 minutes
  python -m benchmarks.components.envs --batch-sizes 1,4096 --json envs.json

For each environment and batch size it reports steps/s (a step plus a
render of the new observation) and generated levels/s, beside the Python
peers: the plain-Python rules of ``reference/envs.py`` and, for
Sokoban, the ``gym-sokoban`` package RAGEN builds on. Then it compares the
difficulty of generated Sokoban levels with gym-sokoban's: optimal solution
lengths from the breadth-first solver.

Timed step loops never generate levels: an episode that ends restarts from
its first state, in JAX and in Python alike. JAX uses every core; the Python
loops run on one, as RAGEN's environment workers do.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import envs
from benchmarks import common
from envs.jax.bandit import constants as bandit_constants
from envs.jax.sokoban import solve
from reference import countdown as ref_countdown
from reference import envs as ref
from reference import qa as ref_qa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ENV_NAMES = (
  "sokoban",
  "sokoban_larger",
  "frozen_lake",
  "bandit",
  "countdown",
  "qa",
  *envs.jax.jumanji_text.GAMES,
)
QA_DATA = os.path.join(ROOT, "configs", "data", "arithmetic_qa.jsonl")
# Random play must not end episodes by truncation inside the timed loop.
SETTINGS = {
  "sokoban": dict(max_steps=1_000_000),
  "sokoban_larger": dict(max_steps=1_000_000),
  "frozen_lake": dict(success_rate=1.0, max_steps=1_000_000),
  "bandit": {},
  "countdown": {},
  "qa": dict(source=QA_DATA),
}
# Jumanji's games have no plain-Python peer: their rows time JAX alone, and
# the random actions include moves the state does not allow (no-ops).
DEFAULT_BATCHES = (1, 4, 16, 64, 256, 1024, 4096)


def _step_loop(env, steps: int):
  """Jitted: ``steps`` vmapped steps and renders, restarting ended episodes.

  The rendered pieces feed a checksum, so the render cannot be optimised
  away.
  """

  @jax.jit
  def run(states, actions):
    first = states

    def body(carry, action):
      states, check = carry
      states, ts = jax.vmap(env.step)(states, action)
      pieces, n = jax.vmap(env.render)(states)
      check = check + jnp.sum(pieces, axis=-1) + n
      restart = lambda a, b: jnp.where(
        ts.done.reshape(-1, *[1] * (a.ndim - 1)), a, b
      )
      states = jax.tree.map(restart, first, states)
      return (states, check), None

    check = jnp.zeros(jax.tree.leaves(actions)[0].shape[1], jnp.int32)
    (_, check), _ = jax.lax.scan(body, (states, check), actions)
    return check

  return run


def jax_row(name: str, batch: int) -> dict[str, float]:
  env = envs.make(name, **SETTINGS.get(name, {}))
  reset = jax.jit(jax.vmap(env.reset))
  keys = jax.random.split(jax.random.key(batch), batch)
  reset_compile, reset_time = common.time_jitted(reset, keys)
  states, _ = reset(keys)
  steps = int(np.clip(2**18 // batch, 16, 2048))
  actions = jax.random.randint(
    jax.random.key(1), (steps, batch), 0, env.spec.num_actions
  )
  if name == "bandit":
    # Only the episode's two arms are available; pull one of them.
    pick = jax.random.bernoulli(jax.random.key(2), 0.5, (steps, batch))
    actions = jnp.where(pick, states.low, states.high)
  if env.spec.text_answers:
    # Each state's random well-formed answer (Countdown: its numbers joined
    # by random operators), the same at every step.
    answers = jax.jit(jax.vmap(env.random_answer))(states, keys)
    actions = jax.tree.map(
      lambda x: jnp.broadcast_to(x, (steps, *x.shape)), answers
    )
  loop = _step_loop(env, steps)
  step_compile, step_time = common.time_jitted(loop, states, actions)
  return {
    "jax_steps_per_s": steps * batch / step_time,
    "jax_levels_per_s": batch / reset_time,
    "step_compile_s": step_compile - step_time,
    "reset_compile_s": reset_compile - reset_time,
  }


def _python_step_rate(make_peer, step, total: int = 20_000) -> float:
  """Steps/s of a plain-Python loop, restarting ended episodes."""
  rng = random.Random(0)
  peers = [make_peer(rng) for _ in range(64)]

  def run():
    for i in range(total):
      j = i % len(peers)
      peer = peers[j]
      if step(peer, rng):
        peers[j] = make_peer(rng)

  return total / common.time_python(run, min_seconds=2.0)


def _sokoban_peer(rows: int, cols: int, num_boxes: int):
  from gym_sokoban.envs import room_utils

  while True:
    try:
      fixed, state, _ = room_utils.generate_room(
        dim=(rows, cols),
        num_steps=int(1.7 * (rows + cols)),
        num_boxes=num_boxes,
      )
      break
    except (RuntimeError, RuntimeWarning):
      continue
  cells = lambda mask: {tuple(map(int, rc)) for rc in np.argwhere(mask)}
  return fixed, state, cells


def python_rates(name: str) -> dict[str, float]:
  """Plain-Python steps/s and levels/s of the same rules."""
  rng = random.Random(0)
  if name.startswith("sokoban"):
    return _sokoban_rates(name, rng)
  if name == "frozen_lake":
    make_peer = lambda rng: ref.frozen_lake_generate(rng, 4, 0.8)

    def step(peer, rng):
      result = peer.step(rng.randrange(4))
      peer.text("grid")
      return result.terminated or result.truncated

    gen_time = common.time_python(lambda: [make_peer(rng) for _ in range(1000)])
    return {
      "py_steps_per_s": _python_step_rate(make_peer, step),
      "py_levels_per_s": 1000 / gen_time,
    }
  if name == "countdown":
    return _countdown_rates(rng)
  if name == "qa":
    return _qa_rates(rng)
  pairs = bandit_constants.TRAIN_PAIRS
  make_peer = lambda rng: ref.bandit_generate(rng, pairs)

  def step(peer, rng):
    peer.step(rng.choice((peer.low, peer.high)), rng.random() < 0.25)
    peer.text()
    return True

  gen_time = common.time_python(lambda: [make_peer(rng) for _ in range(1000)])
  return {
    "py_steps_per_s": _python_step_rate(make_peer, step),
    "py_levels_per_s": 1000 / gen_time,
  }


def _sokoban_rates(name: str, rng: random.Random) -> dict[str, float]:
  """``python_rates`` of Sokoban: the plain-Python rules stepping levels
  of gym-sokoban's generator, and that generator's levels/s."""
  env = envs.make(name)
  rows, cols, nb = env.rows, env.cols, env.num_boxes

  def generate(rng):
    fixed, state, cells = _sokoban_peer(rows, cols, nb)
    return ref.Sokoban(
      walls=cells(fixed == 0),
      targets=cells(fixed == 2),
      boxes=cells((state == 3) | (state == 4)),
      player=tuple(map(int, np.argwhere(state == 5)[0])),
      rows=rows,
      cols=cols,
      max_steps=1_000_000,
    )

  levels = [generate(rng) for _ in range(16)]

  def make_peer(rng):
    lv = rng.choice(levels)
    return ref.Sokoban(
      set(lv.walls),
      set(lv.targets),
      set(lv.boxes),
      lv.player,
      rows,
      cols,
      lv.max_steps,
    )

  def step(peer, rng):
    result = peer.step(rng.randrange(4))
    peer.text("grid")
    return result.terminated or result.truncated

  count = 32 if nb == 1 else 4
  gen_time = common.time_python(
    lambda: [generate(rng) for _ in range(count)], min_seconds=2.0
  )
  return {
    "py_steps_per_s": _python_step_rate(make_peer, step),
    "py_levels_per_s": count / gen_time,
  }


def _countdown_rates(rng: random.Random) -> dict[str, float]:
  """Python Countdown: problems drawn as the JAX generator draws them, the
  answer (numbers joined by random operators) scored by the reference."""

  def make_peer(rng):
    while True:
      nums = [rng.randint(1, 99) for _ in range(rng.randint(3, 4))]
      target = sum(rng.choice((1, -1)) * v for v in nums)
      if 1 <= target <= 99:
        ops = [rng.choice("+-*/") for _ in nums[1:]]
        answer = str(nums[0]) + "".join(
          f"{op}{v}" for op, v in zip(ops, nums[1:], strict=True)
        )
        return target, nums, answer.encode()

  def step(peer, rng):
    target, nums, answer = peer
    ref_countdown.reward(answer, target, nums)
    f"Target: {target}, nums: {nums}"  # the observation
    return True

  gen_time = common.time_python(lambda: [make_peer(rng) for _ in range(1000)])
  return {
    "py_steps_per_s": _python_step_rate(make_peer, step),
    "py_levels_per_s": 1000 / gen_time,
  }


def _qa_rates(rng: random.Random) -> dict[str, float]:
  """Python QA as RAGEN's environment: a random question of the same file,
  another question's answer scored by the reference."""
  with open(QA_DATA) as f:
    rows = [json.loads(line) for line in f]

  def make_peer(rng):
    row, other = rng.choice(rows), rng.choice(rows)
    return row["query"], row["response"], ref_qa.label(other["response"])

  def step(peer, rng):
    _, response, answer = peer  # the observation is the question itself
    ref_qa.rewards([answer.encode()], response, turns=1)
    return True

  gen_time = common.time_python(lambda: [make_peer(rng) for _ in range(1000)])
  return {
    "py_steps_per_s": _python_step_rate(make_peer, step),
    "py_levels_per_s": 1000 / gen_time,
  }


def gym_sokoban_rates() -> dict[str, float]:
  """The gym-sokoban package itself: steps with RAGEN's text render."""
  from gym_sokoban.envs.sokoban_env import SokobanEnv

  env = SokobanEnv(dim_room=(6, 6), num_boxes=1, max_steps=1_000_000)
  symbols = np.asarray(list("#_O√XPS"))
  rng = random.Random(0)

  def run():
    for _ in range(5000):
      # gym-sokoban's actions 1-4 are Up, Down, Left, Right pushes.
      env.step(rng.randrange(1, 5), observation_mode="tiny_rgb_array")
      room = np.where(
        (env.room_state == 5) & (env.room_fixed == 2), 6, env.room_state
      )
      "\n".join("".join(row) for row in symbols[room])

  step_rate = 5000 / common.time_python(run, min_seconds=2.0)
  level_time = common.time_python(lambda: [env.reset() for _ in range(32)])
  return {"steps_per_s": step_rate, "levels_per_s": 32 / level_time}


def difficulty(count: int) -> dict[str, Any]:
  """Optimal solution lengths of generated 6x6 one-box levels, both ways."""
  env = envs.make("sokoban")
  states, _ = jax.jit(jax.vmap(env.reset))(
    jax.random.split(jax.random.key(2024), count)
  )
  walls, targets, boxes, player = (
    np.asarray(x)
    for x in (states.walls, states.targets, states.boxes, states.player)
  )
  ours = [
    len(solve(walls[i], targets[i], boxes[i], int(player[i]), env.cols))
    for i in range(count)
  ]
  random.seed(2024)
  np.random.seed(2024)
  theirs = []
  for _ in range(count):
    fixed, state, _ = _sokoban_peer(6, 6, 1)
    cells = np.flatnonzero
    solution = solve(
      (fixed == 0).ravel(),
      (fixed == 2).ravel(),
      ((state == 3) | (state == 4)).ravel(),
      int(cells(state == 5)[0]),
      6,
    )
    theirs.append(len(solution))

  def summary(lengths):
    a = np.asarray(lengths)
    return {
      "mean": float(a.mean()),
      "p10": float(np.percentile(a, 10)),
      "median": float(np.median(a)),
      "p90": float(np.percentile(a, 90)),
      "max": int(a.max()),
      "histogram": np.bincount(a).tolist(),
    }

  return {
    "levels": count,
    "starpo_jax": summary(ours),
    "gym_sokoban": summary(theirs),
  }


def _ratio(row: dict[str, Any], kind: str) -> str:
  """JAX over Python for ``kind`` ("steps", "levels"); "-" with no peer."""
  if f"py_{kind}_per_s" not in row:
    return "-"
  return f"{row[f'jax_{kind}_per_s'] / row[f'py_{kind}_per_s']:.1f}x"


HEADER = [
  "env",
  "batch",
  "JAX steps/s",
  "Python steps/s",
  "ratio",
  "JAX levels/s",
  "Python levels/s",
  "ratio",
  "compile s (step / reset)",
]


def table(results: list[dict[str, Any]]) -> str:
  """The rates of ``results`` (one row per environment and batch)."""
  rows = [
    [
      r["env"],
      r["batch"],
      r["jax_steps_per_s"],
      r.get("py_steps_per_s", "-"),
      _ratio(r, "steps"),
      r["jax_levels_per_s"],
      r.get("py_levels_per_s", "-"),
      _ratio(r, "levels"),
      f"{r['step_compile_s']:.1f} / {r['reset_compile_s']:.1f}",
    ]
    for r in results
  ]
  return common.markdown_table(HEADER, rows)


def difficulty_table(d: dict[str, Any]) -> str:
  """Optimal solution lengths of both generators' levels (``difficulty``)."""
  return common.markdown_table(
    ["generator", "mean", "p10", "median", "p90", "max"],
    [
      [k, v["mean"], v["p10"], v["median"], v["p90"], v["max"]]
      for k, v in (
        ("starpo-jax", d["starpo_jax"]),
        ("gym-sokoban", d["gym_sokoban"]),
      )
    ],
  )


def _rates(names: list[str], batches: list[int]) -> list[dict[str, Any]]:
  """Every environment's JAX rates at every batch size beside its
  plain-Python rules' rates."""
  results = []
  for name in names:
    py = python_rates(name) if name in SETTINGS else {}
    for batch in batches:
      start = time.perf_counter()
      r = jax_row(name, batch)
      r.update(py, env=name, batch=batch)
      results.append(r)
      print(
        f"  {name} batch {batch}: {time.perf_counter() - start:.0f}s",
        file=sys.stderr,
        flush=True,
      )
  return results


def _gym_sokoban(results: list[dict[str, Any]]) -> dict[str, float]:
  """gym-sokoban's rates, printed beside starpo-jax's largest batch."""
  gym = gym_sokoban_rates()
  largest = max(
    (r for r in results if r["env"] == "sokoban"), key=lambda r: r["batch"]
  )
  print(
    "\ngym-sokoban (6x6, one box, RAGEN's text render): "
    f"{gym['steps_per_s']:,.0f} steps/s, {gym['levels_per_s']:,.0f} "
    f"levels/s; starpo-jax at batch {largest['batch']}: "
    f"{largest['jax_steps_per_s'] / gym['steps_per_s']:,.0f}x steps, "
    f"{largest['jax_levels_per_s'] / gym['levels_per_s']:,.0f}x levels"
  )
  return gym


def _difficulty(levels: int) -> dict[str, Any]:
  """Optimal solution lengths of generated levels, printed."""
  d = difficulty(levels)
  print(
    f"\nOptimal solution lengths of {d['levels']} generated 6x6 "
    "one-box levels (BFS solver):"
  )
  print(difficulty_table(d))
  for k in ("starpo_jax", "gym_sokoban"):
    print(f"  histogram {k}: {d[k]['histogram']}")
  return d


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--batch-sizes",
    default=",".join(map(str, DEFAULT_BATCHES)),
    help="comma-separated batch sizes",
  )
  parser.add_argument("--envs", default=",".join(ENV_NAMES))
  parser.add_argument("--difficulty-levels", type=int, default=1000)
  parser.add_argument("--json", default=None, help="write the results here")
  args = parser.parse_args(argv)
  batches = [int(b) for b in args.batch_sizes.split(",")]
  names = args.envs.split(",")
  warnings.filterwarnings("ignore")
  print(f"machine: {common.machine()}", flush=True)

  results = _rates(names, batches)
  print(table(results))
  payload: dict[str, Any] = {"machine": common.machine(), "rows": results}
  if "sokoban" in names:
    payload["gym_sokoban"] = _gym_sokoban(results)
  if args.difficulty_levels:
    payload["difficulty"] = _difficulty(args.difficulty_levels)
  common.write_json(args.json, payload)
  return payload


if __name__ == "__main__":
  main()
