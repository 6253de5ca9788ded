"""benchmarks/profiling/tpu_memory.py: a row whose compile fails says why."""

from __future__ import annotations

import subprocess

from benchmarks.profiling import tpu_memory


def test_a_killed_compile_says_it_was_killed(monkeypatch):
  def killed(cmd, **kwargs):
    return subprocess.CompletedProcess(cmd, -9, stdout="", stderr="")

  monkeypatch.setattr(tpu_memory.subprocess, "run", killed)
  row = tpu_memory.compile_row("qwen2.5-7b", "v5e-8", "1,8,1", ["--x=1"])
  assert row["error"] == "killed by signal 9"
  assert row["overrides"] == ["--x=1"]
  assert "failed: killed by signal 9" in tpu_memory.table([row])
