"""``python -m benchmarks.compare.run --smoke``: every suite runs end to
end, each framework in its own process, each row compares the same
workload on both sides, and nothing recompiles."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from benchmarks.compare import rows as rows_lib
from benchmarks.compare import run, workload


def test_smoke_run_reports_every_suite(tmp_path):
  out = tmp_path / "bench.json"
  # Without the suite's compilation cache: a program read from it is no
  # XLA compile, and the recompilation check counts compiles.
  env = dict(os.environ)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "benchmarks.compare.run",
      "--smoke",
      "--json",
      str(out),
    ],
    capture_output=True,
    text=True,
    timeout=900,
    env=env,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())
  rows = result["rows"]
  assert {r["suite"] for r in rows} == set(run.SUITES)
  for r in rows:
    for key in ("jax", "torch", "compile_s", "peak_gib"):
      assert math.isfinite(r[key]) and r[key] > 0, (r, key)
    assert not r.get("recompiled", False), r
  pids = result["pids"]
  # Each suite's side in a process of its own (env's baselines in JAX's).
  alone = [*pids["jax"], *pids["torch"], pids["parent"], os.getpid()]
  assert len(set(alone)) == len(alone) == 2 * len(run.SUITES) + 1
  baselines = {(r["suite"], r["baseline"]) for r in rows}
  assert ("env", "gym-sokoban") in baselines
  assert ("rollout", "transformers generate + Python envs") in baselines
  # The printed table has a line per row under its header.
  table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
  assert len(table) == len(rows) + 1
  assert result["machine"]["cores"] >= 1
  # The commit it ran at (this checkout's: the suite runs in it).
  assert result["commit"].split("+")[0] == run_git("rev-parse", "HEAD")
  assert result["peak"]["matmul_flops"] > 0


def run_git(*args: str) -> str:
  where = os.path.dirname(os.path.abspath(__file__))
  return subprocess.run(
    ["git", "-C", where, *args], capture_output=True, text=True, check=True
  ).stdout.strip()


def test_unknown_suite_is_named(capsys):
  with pytest.raises(SystemExit):
    run.main(["--suite", "env,rolout"])
  assert "unknown suite(s) ['rolout']" in capsys.readouterr().err


def test_merge_pairs_each_measurement_with_its_own_workloads_baselines():
  half = dict(suite="update", workload="tiny, minibatch 2", metric="t/s")
  jax_rows = [dict(half, jax=30.0, compile_s=1.0, peak_gib=0.5)]
  rate = lambda workload, label, value, peak: dict(
    suite="update", workload=workload, label=label, value=value, peak_gib=peak
  )
  rows = rows_lib.merge(
    jax_rows,
    [
      rate("tiny, minibatch 2", "a", 10.0, 0.25),
      rate("tiny, minibatch 2", "b", 60.0, 2.0),
    ],
  )
  assert [(r["baseline"], r["ratio"]) for r in rows] == [("a", 3.0), ("b", 0.5)]
  # Each baseline's own peak memory beside the JAX side's.
  assert [(r["peak_gib"], r["torch_peak_gib"]) for r in rows] == [
    (0.5, 0.25),
    (0.5, 2.0),
  ]
  assert "| 0.50 | 0.25 |" in rows_lib.table(rows)
  with pytest.raises(RuntimeError, match="different workloads"):
    rows_lib.merge(jax_rows, [rate("0.5b", "a", 1.0, 1.0)])


def test_savings_are_measured_beside_the_baselines_and_the_defaults():
  half = dict(suite="rollout", workload="135m", metric="tok/s")
  jax_rows = [
    dict(half, jax=20.0, compile_s=1.0, peak_gib=0.5, savings="on"),
    dict(half, jax=10.0, compile_s=1.0, peak_gib=0.5, savings="off"),
  ]
  torch_rows = [
    dict(suite="rollout", workload="135m", label="a", value=5.0, peak_gib=1.0)
  ]
  rows = rows_lib.merge(jax_rows, torch_rows)
  got = [(r["workload"], r["baseline"], r["ratio"]) for r in rows]
  assert got == [
    ("135m", "a", 4.0),
    ("135m, savings off", "a", 2.0),
    ("135m, savings off", "starpo-jax, savings on", 0.5),
  ]
  # The docs' compact table: a line per saving, its ratio to the defaults.
  lines = rows_lib.savings_table(rows).splitlines()[2:]
  cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
  assert [(c[2], c[4], c[5]) for c in cells] == [
    ("on", "20", "1.00x"),
    ("off", "10", "0.50x"),
  ]
  with pytest.raises(SystemExit):
    run.main(["--savings", "on,of"])


def test_timed_flags_a_recompilation_after_the_warm_up():
  add = jax.jit(lambda x: x + 1)
  _, _, recompiled = workload.timed(lambda: add(jnp.ones(3)), repeats=2)
  assert not recompiled
  sizes = iter(range(4, 10))
  _, _, recompiled = workload.timed(
    lambda: add(jnp.ones(next(sizes))), repeats=2
  )
  assert recompiled


def test_timed_together_takes_turns_and_flags_only_the_recompiler():
  calls = []
  add = jax.jit(lambda x: x * 2)
  sizes = iter(range(20, 30))

  def steady():
    calls.append("a")
    add(jnp.ones(3)).block_until_ready()

  def growing():
    calls.append("b")
    add(jnp.ones(next(sizes))).block_until_ready()

  a, b = workload.timed_together([steady, growing], repeats=3)
  # One warm-up each, then the two alternate.
  assert calls == ["a", "b"] + ["a", "b"] * 3
  assert not a.recompiled and b.recompiled
  for t in (a, b):
    assert t.first > 0 and t.seconds > 0 and t.peak_gib > 0


def test_rows_hold_only_what_their_pytorch_side_holds(tmp_path):
  # No suite runs the warm start: no think-mode reference copy in a row.
  assert workload.workload("smollm2-135m", "cpu", "").sft.steps == 0
  pair = workload.Pair("tiny", "smoke", str(tmp_path))
  pair.init_jax(train=False)
  held = pair.state
  assert held.policy is not None
  assert (held.policy_opt, held.critic_opt, held.reference) == (None,) * 3
  pair.init_jax()
  assert pair.state.policy_opt is not None
