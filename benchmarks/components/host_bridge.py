"""A Python environment through the bridge beside the jittable one.

  python -m benchmarks.components.host_bridge                # ~6 min on 2 cores
  python -m benchmarks.components.host_bridge --repeats 9 --json bridge.json

1. Iterations: the default Sokoban config's RL step (tiny model, no warm
   start, no evaluation) on the jittable ``sokoban`` and on ``gym_sokoban``
   playing the same levels (the gym-sokoban package through
   ``envs.batch.host``), from the same parameters: both steps see the same
   tokens, so the workloads are identical (checked: the generated token
   counts are equal). Each is compiled and run once first (compile apart),
   then the two are timed alternately; the host's share is the time spent
   inside the bridge's host calls (resets and turns) over the step's.
2. The round trip: the two ways to let Python step a batch between turns,
   on the rollout's shapes (``--batch`` episodes, ``--turns`` turns, an
   answer's bytes out and an observation's tokens back per episode, a
   matrix product per turn standing for the decode): an ``io_callback``
   inside one compiled loop over the turns, against a function compiled
   per turn and called from a Python loop that steps the host between
   calls. The same host function (copies the answers into observations)
   on both sides.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from benchmarks import common
from configs import gym_sokoban, sokoban
from starpo_jax.run import assembly


def _config(name: str):
  c = (
    sokoban.get_config(None)
    if name == "sokoban"
    else gym_sokoban.get_config("levels=sokoban")
  )
  c.sft.steps = 0
  c.train.eval_every = 0
  c.diagnostics.collapse_every = 0
  return c


class _HostClock:
  """Seconds spent inside a host environment's calls (wraps its slots)."""

  def __init__(self, env: Any):
    self.seconds = 0.0
    slots = env.slots
    for name in ("reset", "act"):
      setattr(slots, name, self._timed(getattr(slots, name)))

  def _timed(self, fn):
    def run(*args, **kwargs):
      start = time.perf_counter()
      try:
        return fn(*args, **kwargs)
      finally:
        self.seconds += time.perf_counter() - start

    return run


def iterations(repeats: int) -> list[dict[str, Any]]:
  sides = {}
  for name in ("sokoban", "gym_sokoban"):
    setup = assembly.build(_config(name))
    learner = assembly.make_learner(setup)
    state = assembly.init_state(setup, learner)
    clock = _HostClock(setup.env) if name == "gym_sokoban" else None
    step = assembly.compile_step(setup, state, learner)
    start = time.perf_counter()
    state, m = step(state, setup.codec)
    common.block(m)
    sides[name] = dict(
      setup=setup,
      step=step,
      state=state,
      clock=clock,
      first=time.perf_counter() - start,
      times=[],
      host=[],
      tokens=[],
    )
    print(f"{name}: compiled and ran once in {sides[name]['first']:.1f} s")
  for _ in range(repeats):
    for s in sides.values():
      before = s["clock"].seconds if s["clock"] else 0.0
      start = time.perf_counter()
      s["state"], m = s["step"](s["state"], s["setup"].codec)
      tokens = float(jax.block_until_ready(m["rollout/generated_tokens"]))
      s["times"].append(time.perf_counter() - start)
      s["host"].append((s["clock"].seconds - before) if s["clock"] else 0.0)
      s["tokens"].append(tokens)
  base = statistics.median(sides["sokoban"]["times"])
  rows = []
  for name, s in sides.items():
    t = statistics.median(s["times"])
    rows.append(
      dict(
        env=name,
        iterations_per_s=1 / t,
        ratio=base / t,
        host_s=statistics.median(s["host"]),
        host_share=statistics.median(s["host"]) / t,
        first_s=s["first"],
        tokens=float(np.mean(s["tokens"])),
      )
    )
  if rows[0]["tokens"] != rows[1]["tokens"]:
    print("warning: the two sides generated different token counts")
  return rows


def round_trip(batch: int, turns: int, repeats: int) -> list[dict[str, Any]]:
  answer_bytes, obs_tokens, width = 400, 128, 256
  w = jnp.asarray(np.random.default_rng(0).normal(size=(width, width)) / 16)

  def host(answers: np.ndarray) -> np.ndarray:
    obs = np.zeros((batch, obs_tokens), np.int32)
    obs[:, :] = np.asarray(answers)[:, :obs_tokens] % 7
    return obs

  def decode(h: jax.Array, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
    h = jnp.tanh((h + obs[:, :1].astype(jnp.float32)) @ w)
    answers = (jnp.abs(h[:, :1]) * 100).astype(jnp.int32) + jnp.zeros(
      (batch, answer_bytes), jnp.int32
    )
    return h, answers

  shape = jax.ShapeDtypeStruct((batch, obs_tokens), jnp.int32)

  @jax.jit
  def one_program(h, obs):
    def turn(carry, _):
      h, obs = carry
      h, answers = decode(h, obs)
      return (h, io_callback(host, shape, answers)), None

    return jax.lax.scan(turn, (h, obs), None, length=turns)[0]

  per_turn = jax.jit(decode)

  def turn_by_turn(h, obs):
    for _ in range(turns):
      h, answers = per_turn(h, obs)
      obs = jax.device_put(host(np.asarray(answers)))
    return h, obs

  h0 = jnp.zeros((batch, width))
  o0 = jnp.zeros((batch, obs_tokens), jnp.int32)
  rows = []
  for name, fn in (
    ("io_callback in one program", one_program),
    ("compiled per turn, host between", turn_by_turn),
  ):
    first, seconds = common.time_jitted(fn, h0, o0, repeats=repeats)
    rows.append(
      dict(
        mechanism=name,
        ms_per_turn=1000 * seconds / turns,
        compile_s=first - seconds,
      )
    )
  return rows


def table(rows: list[dict[str, Any]]) -> str:
  """The iteration rates of ``rows`` (``iterations``)."""
  header = ["env", "iterations/s", "vs sokoban", "host s / step",
            "host share", "first call s", "tokens / step"]  # fmt: skip
  cells = [
    [r["env"], f"{r['iterations_per_s']:.3f}", f"{r['ratio']:.2f}x",
     f"{r['host_s']:.3f}", f"{100 * r['host_share']:.1f}%",
     f"{r['first_s']:.0f}", f"{r['tokens']:.0f}"]
    for r in rows
  ]  # fmt: skip
  return common.markdown_table(header, cells)


def round_trip_table(trips: list[dict[str, Any]]) -> str:
  """The host round trip's cost per turn, one row per mechanism."""
  return common.markdown_table(
    ["mechanism", "ms / turn", "compile s"],
    [
      [r["mechanism"], f"{r['ms_per_turn']:.3f}", f"{r['compile_s']:.2f}"]
      for r in trips
    ],
  )


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--turns", type=int, default=5)
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  print(f"machine: {common.machine()}", flush=True)
  rows = iterations(args.repeats)
  print(table(rows))
  trips = round_trip(args.batch, args.turns, max(args.repeats, 20))
  print(round_trip_table(trips))
  payload = {
    "machine": common.machine(),
    "argv": sys.argv,
    "iterations": rows,
    "round_trip": trips,
  }
  common.write_json(args.json, payload)
  return payload


if __name__ == "__main__":
  main()
