"""The training step's time in each context-window mode
(``rollout.context_window``) and method (``rollout.context_method``: older
turns masked, or the visible ones re-prefilled each turn and each turn
scored as a sequence of its own), built from one config and timed taking turns
in one process (``workload.timed_together``), so a slow spell of the
machine falls on every mode alike.

  python -m benchmarks.profiling.context_window  # configs/sokoban.py
  python -m benchmarks.profiling.context_window --repeats 5 \\
    --json docs/data/bench_context_window.json

Each mode compiles its own step (``assembly.compile_step``, one jit: the
rollout, scoring, the filter and the update); the first call is its
warm-up and compile, reported apart. Every call of every mode is the
first RL step from the same initial state (same levels, same keys).
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

# Each row's settings: its name, the context window, the turns it keeps
# and how it hides the others (``rollout.context_method``).
MODES = (
  ("full", "full", 3, "mask"),
  ("limited k=3, masked", "limited", 3, "mask"),
  ("limited k=3, re-prefilled", "limited", 3, "reprefill"),
  ("limited k=1 (single_turn), masked", "single_turn", 1, "mask"),
  ("limited k=1 (single_turn), re-prefilled", "single_turn", 1, "reprefill"),
)


def steps(c) -> tuple[list[str], list[Any]]:
  """Each mode's name and a call of its compiled step, always from the
  initial train state: every call plays and trains the same step, so the
  modes differ only in what their attention sees (a state carried from
  call to call would train each mode's policy its own way, and their
  episodes would part)."""
  names, calls = [], []
  for name, window, turns, method in MODES:
    m = c.copy_and_resolve_references()
    m.rollout.context_window = window
    m.rollout.context_turns = turns
    m.rollout.context_method = method
    setup = assembly.build(m)
    learner = assembly.make_learner(setup)
    state = assembly.init_state(setup, learner)
    step = assembly.compile_step(setup, state, learner)

    def call(step=step, state=state, codec=setup.codec):
      # The step donates its state: each call gets a copy of the first.
      _, metrics = step(jax.tree.map(jnp.copy, state), codec)
      return jax.block_until_ready(metrics)

    names.append(name)
    calls.append(call)
  return names, calls


def table(rows: list[dict[str, Any]]) -> str:
  """The modes' step times, as ``main`` writes them (``rows``)."""
  return common.markdown_table(
    ["mode", "step s", "against full", "first call s (compile)"],
    [
      [
        r["mode"],
        f"{r['step_s']:.2f}",
        f"{r['against_full']:.2f}x",
        f"{r['first_call_s']:.1f}",
      ]
      for r in rows
    ],
  )


def main(argv: list[str] | None = None) -> dict[str, Any]:
  args, c = arguments(__doc__, argv)
  print("building a step per mode ...", file=sys.stderr, flush=True)
  names, calls = steps(c)
  print(
    f"timing {len(calls)} modes, {args.repeats} rounds ...",
    file=sys.stderr,
    flush=True,
  )
  timings = timed_together(calls, args.repeats)
  full = timings[0].seconds
  rows = [
    dict(
      mode=name,
      step_s=t.seconds,
      first_call_s=t.first,
      against_full=t.seconds / full,
      recompiled=t.recompiled,
    )
    for name, t in zip(names, timings, strict=True)
  ]
  return report(args, rows, table)


if __name__ == "__main__":
  main()
