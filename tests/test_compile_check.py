"""The ahead-of-time compile check (a subprocess: it simulates devices)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_memory_falls_with_fsdp(tmp_path):
  report = tmp_path / "report.json"
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  env.pop("XLA_FLAGS", None)
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "starpo_jax.compile_check",
      "--config=configs/bandit.py:algo=grpo",  # no critic: compiles faster
      "--config.model.num_layers=1",
      "--mesh=1,1,1",
      "--mesh=1,4,1",
      f"--json={report}",
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  assert out.returncode == 0, out.stderr[-4000:]
  one, four = json.loads(report.read_text())
  assert (one["devices"], four["devices"]) == (1, 4)
  assert "per device:" in out.stdout and "activations" in out.stdout
  for key in ("param_bytes", "optimizer_bytes"):
    # About 1/4: norm scales and step counts stay replicated.
    ratio = four[key] / one[key]
    assert 0.25 <= ratio < 0.27, (key, ratio)
  assert four["activation_bytes"] > 0


def test_mesh_flag_is_checked():
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "starpo_jax.compile_check",
      "--config=configs/bandit.py",
      "--mesh=2,x,1",
    ],
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert out.returncode != 0
  assert "--mesh='2,x,1'" in out.stderr
