"""``python -m benchmarks.run --smoke``: every suite runs end to end, each
row compares the same workload on both sides, and nothing recompiles."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from benchmarks import run


def test_smoke_run_reports_every_suite(tmp_path):
  out = tmp_path / "bench.json"
  proc = subprocess.run(
    [sys.executable, "-m", "benchmarks.run", "--smoke", "--json", str(out)],
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())
  rows = result["rows"]
  assert {r["suite"] for r in rows} == set(run.SUITES)
  for r in rows:
    for key in ("jax", "torch", "compile_s", "peak_gib"):
      assert math.isfinite(r[key]) and r[key] > 0, (r, key)
    assert r["ratio"] == pytest.approx(r["jax"] / r["torch"])
    assert not r.get("recompiled", False), r
  baselines = {(r["suite"], r["baseline"]) for r in rows}
  assert ("env", "gym-sokoban") in baselines
  assert ("rollout", "transformers generate + Python envs") in baselines
  # The printed table has a line per row under its header.
  table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
  assert len(table) == len(rows) + 1
  assert result["machine"]["cores"] >= 1
  assert result["peak"]["matmul_flops"] > 0


def test_unknown_suite_is_named(capsys):
  with pytest.raises(SystemExit):
    run.main(["--suite", "env,rolout"])
  assert "unknown suite(s) ['rolout']" in capsys.readouterr().err
