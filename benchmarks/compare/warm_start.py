"""The warm start's step (``sft``: the expert episodes played, the
imitation loss's forward and backward, the optimizer) of this checkout
against another commit's, on the same examples: each tree's step in its
own processes, taking turns.

  python -m benchmarks.compare.warm_start --arg model=smollm2-135m \\
    --against REF --json docs/data/bench_warm_start_smollm2.json

Each process builds the config (``configs/NAME.py`` with ``--arg`` and
``--set``), compiles the warm-start step, calls it once (compiling; its
loss is the examples' fingerprint: both trees' first steps play the same
levels from the same state) and then ``--calls`` more, timed. ``--rounds``
rounds alternate the trees (a slow spell of the machine falls on both).
``REF``'s tree is a ``git worktree`` made for the run and removed after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from benchmarks import common

# What each process runs, with its tree first on the path; only what both
# trees have: the config, the assembly, the compiled warm-start step.
CHILD = """
import importlib, json, sys, time
from benchmarks.compare.workload import PeakMemory
from starpo_jax.run import assembly
name, arg, sets, calls = json.loads(sys.argv[1])
c = importlib.import_module(f"configs.{name}").get_config(arg or None)
for item in sets:
  key, value = item.split("=", 1)
  section, field = key.split(".")
  c[section][field] = type(c[section][field])(value)
setup = assembly.build(c)
learner = assembly.make_learner(setup)
state = assembly.init_state(setup, learner)
with PeakMemory() as mem:
  start = time.perf_counter()
  step = assembly.compile_sft_step(setup, state, learner)
  state, m = step(state, setup.codec)
  loss = float(m["sft/loss"])
  first = time.perf_counter() - start
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    state, m = step(state, setup.codec)
    float(m["sft/loss"])
    times.append(time.perf_counter() - start)
print(json.dumps(dict(first=first, times=times, loss=loss, peak_gib=mem.gib)))
"""


def run_tree(tree: str, args: argparse.Namespace) -> dict[str, Any]:
  """One process of ``tree``'s warm-start step: its timings and loss."""
  payload = json.dumps([args.config, args.arg, args.set, args.calls])
  env = dict(os.environ, PYTHONPATH=tree)
  out = subprocess.run(
    [sys.executable, "-c", CHILD, payload],
    cwd=tree,
    env=env,
    check=True,
    capture_output=True,
    text=True,
  )
  return json.loads(out.stdout.strip().splitlines()[-1])


def _git(*cmd: str, cwd: str | None = None) -> str:
  return subprocess.run(
    ["git", *cmd], cwd=cwd, check=True, capture_output=True, text=True
  ).stdout.strip()


def measure(args: argparse.Namespace) -> dict[str, Any]:
  here = _git("rev-parse", "--show-toplevel")
  against = _git("rev-parse", args.against)
  runs: dict[str, list[dict[str, Any]]] = {"this": [], "against": []}
  with tempfile.TemporaryDirectory() as where:
    tree = os.path.join(where, "tree")
    _git("worktree", "add", "--detach", tree, against, cwd=here)
    try:
      for r in range(args.rounds):
        for side, path in (("against", tree), ("this", here)):
          runs[side].append(run_tree(path, args))
          print(f"round {r + 1} {side}: {runs[side][-1]}", file=sys.stderr)
    finally:
      _git("worktree", "remove", "--force", tree, cwd=here)
  return dict(
    config=args.config,
    arg=args.arg,
    overrides=args.set,
    against=against,
    **summary(runs),
    machine=common.machine(),
  )


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
  """Each tree's median step over all its processes' timed calls, and
  how much faster this tree's is."""
  median = lambda side: statistics.median(
    t for run in runs[side] for t in run["times"]
  )
  return dict(
    runs=runs,
    seconds={side: median(side) for side in runs},
    speedup=median("against") / median("this"),
  )


def table(result: dict[str, Any]) -> str:
  """The two trees' warm-start steps as a Markdown table: the step's
  median seconds, the first call's (compile included), the peak RSS, the
  first loss (the same examples on both sides)."""
  runs = result["runs"]
  calls = sum(len(run["times"]) for run in runs["this"])
  rows = [
    (
      f"step, s (median of {calls} calls)",
      lambda side: f"{result['seconds'][side]:.2f}",
    ),
    (
      "first call (compile), s",
      lambda side: f"{statistics.median(r['first'] for r in runs[side]):.1f}",
    ),
    (
      "peak RSS, GiB",
      lambda side: f"{max(r['peak_gib'] for r in runs[side]):.2f}",
    ),
    ("first loss", lambda side: f"{runs[side][0]['loss']:.4f}"),
  ]
  lines = [
    "| | the earlier commit | this checkout |",
    "|---|---|---|",
    *(
      f"| {name} | {cell('against')} | {cell('this')} |" for name, cell in rows
    ),
    f"| speedup | | {result['speedup']:.2f}x |",
  ]
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(
    description=__doc__.splitlines()[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument("--config", default="sokoban", help="configs/NAME.py")
  parser.add_argument("--arg", default="", help="the config's argument")
  parser.add_argument(
    "--set", action="append", default=[], help="SECTION.NAME=VALUE"
  )
  parser.add_argument("--against", required=True, help="a git commit")
  parser.add_argument("--calls", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--json", default="")
  args = parser.parse_args(argv)
  result = measure(args)
  print(table(result))
  print(
    f"warm-start step: {result['seconds']['this']:.2f} s here, "
    f"{result['seconds']['against']:.2f} s at {result['against'][:12]}: "
    f"{result['speedup']:.2f}x"
  )
  common.write_json(args.json, result)
  return result


if __name__ == "__main__":
  main()
