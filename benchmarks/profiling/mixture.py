"""A mixture's training step against its parts' own steps: the mixture
(``env.mixture``, every part in one compiled step) and each part run alone
(its environment, settings and groups, nothing else changed), timed taking
turns in one process (``workload.timed_together``), so a slow spell of the
machine falls on every step alike.

  python -m benchmarks.profiling.mixture  # configs/mixture.py
  python -m benchmarks.profiling.mixture --repeats 5 \
    --json docs/data/bench_mixture.json

Each step compiles once (``assembly.compile_step``: the rollout, scoring,
the filter and the update); its first call is its warm-up and compile,
reported apart. Every call is the first RL step from the same initial
state. The mixture plays its parts one after another inside the step, so
its time should be the sum of its parts' (each part's episodes, plus an
update of the same number of episodes): ``against the parts`` is the
mixture's time over that sum.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import common
from benchmarks.compare.workload import timed_together
from benchmarks.profiling.phases import arguments, report
from starpo_jax.run import assembly


def parts(c) -> list[tuple[str, Any]]:
  """Each part of mixture config ``c`` as a config of its own: its tag and
  ``c`` with the part's environment, settings and groups in place of the
  mixture.

  Raises:
    ValueError: ``c`` has no mixture.
  """
  if not c.env.mixture:
    raise ValueError(
      "benchmarks.profiling.mixture: the config has no env.mixture"
    )
  out = []
  for tag, entry in c.env.mixture.items():
    settings = {k: v for k, v in entry.items() if k not in ("env", "groups")}
    p = c.copy_and_resolve_references()
    p.env.mixture = {}
    p.env.name = entry["env"]
    p.env.kwargs = settings
    p.rollout.env_groups = entry["groups"]
    out.append((tag, p))
  return out


def _call(c):
  """A call of ``c``'s compiled step, always from its initial state (the
  step donates its state: each call gets a copy)."""
  setup = assembly.build(c)
  learner = assembly.make_learner(setup)
  state = assembly.init_state(setup, learner)
  step = assembly.compile_step(setup, state, learner)

  def call():
    _, metrics = step(jax.tree.map(jnp.copy, state), setup.codec)
    return jax.block_until_ready(metrics)

  return call


def table(rows: list[dict[str, Any]]) -> str:
  """The steps' times, as ``main`` writes them (``rows``: the mixture
  first, then its parts)."""
  return common.markdown_table(
    ["step", "episodes", "step s", "first call s (compile)"],
    [
      [
        r["step"],
        str(r["episodes"]),
        f"{r['step_s']:.2f}",
        f"{r['first_call_s']:.1f}",
      ]
      for r in rows
    ]
    + [
      [
        "mixture / sum of its parts",
        "",
        f"{rows[0]['step_s'] / sum(r['step_s'] for r in rows[1:]):.2f}x",
        "",
      ]
    ],
  )


def main(argv: list[str] | None = None) -> dict[str, Any]:
  args, c = arguments(__doc__, argv, default="mixture")
  names = ["mixture", *(f"{tag} alone" for tag, _ in parts(c))]
  configs = [c, *(p for _, p in parts(c))]
  print(f"building {len(configs)} steps ...", file=sys.stderr, flush=True)
  calls = [_call(x) for x in configs]
  print(f"timing them, {args.repeats} rounds ...", file=sys.stderr, flush=True)
  timings = timed_together(calls, args.repeats)
  rows = [
    dict(
      step=name,
      episodes=x.rollout.env_groups * x.rollout.group_size,
      step_s=t.seconds,
      first_call_s=t.first,
      recompiled=t.recompiled,
    )
    for name, x, t in zip(names, configs, timings, strict=True)
  ]
  return report(
    args,
    rows,
    table,
    against_parts=rows[0]["step_s"] / sum(r["step_s"] for r in rows[1:]),
  )


if __name__ == "__main__":
  main()
