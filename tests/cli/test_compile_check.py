"""The ahead-of-time compile check (a subprocess: it simulates devices, or
compiles for TPU chips this machine does not have)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def compile_check(
  *args: str, quick: bool = False
) -> subprocess.CompletedProcess:
  """``python -m starpo_jax.compile_check ARGS``; ``quick``: a compile for
  the CPU with the tests' quick LLVM settings (tests/conftest.py; memory
  and FLOP counts come before code generation), else XLA's own."""
  env = dict(os.environ, PYTHONPATH=os.getcwd(), JAX_PLATFORMS="cpu")
  if not quick:
    env.pop("XLA_FLAGS", None)
  return subprocess.run(
    [sys.executable, "-m", "starpo_jax.compile_check", *args],
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )


@pytest.mark.slow
def test_memory_falls_with_fsdp(tmp_path):
  report = tmp_path / "report.json"
  out = compile_check(
    "--config=configs/bandit.py:algo=grpo",  # no critic: compiles faster
    "--config.model.num_layers=1",
    "--config.diagnostics.collapse_every=0",  # compiles faster
    "--config.diagnostics.gradients_every=0",
    "--mesh=1,1,1",
    "--mesh=1,4,1",
    f"--json={report}",
    quick=True,
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
  assert one["attention"] == "blockwise"  # the CPU's kernel
  # Loops counted as they run: the update (forward and backward) costs
  # about three forward passes of the score phase over the same tokens,
  # and XLA's own count (each loop body once) is far below the total.
  flops = one["phase_flops"]
  assert 2.5 < flops["update"] / flops["score"] < 3.6, flops
  assert one["xla_flops"] < sum(flops.values()) / 2
  # Four devices split the batch: each does less than half the work (not
  # a quarter: some of it, e.g. over the vocabulary, is replicated).
  for phase in ("score", "update"):
    ratio = four["phase_flops"][phase] / flops[phase]
    assert 0.2 < ratio < 0.5, (phase, ratio)
  # Only the level generators' rejection loops have no bound.
  assert all("generate" in n for n in one["unbounded_loops"]), one
  assert one["blind_loops"] == []
  assert one["roofline_s"] is None  # no published peak for a CPU
  assert "roofline" not in out.stdout and "GFLOP" in out.stdout


def test_mesh_flag_is_checked():
  out = compile_check("--config=configs/bandit.py", "--mesh=2,x,1")
  assert out.returncode != 0
  assert "--mesh='2,x,1'" in out.stderr


@pytest.mark.slow
def test_step_compiles_for_a_tpu_topology(tmp_path):
  # libtpu (jax[tpu], a test dependency) compiles for TPU chips this CPU
  # machine does not have; the TPU's attention kernel (Pallas splash,
  # per device in shard_map) is the one compiled: in the first of two
  # layers (the last one's queries are only the scored tokens'). With LoRA
  # adapters (the qwix interception compiles for TPU too).
  report = tmp_path / "report.json"
  out = compile_check(
    "--config=configs/bandit.py:algo=grpo",
    "--config.model.num_layers=2",
    "--config.model.lora.rank=4",
    "--config.sft.steps=0",
    "--config.diagnostics.collapse_every=0",  # compiles faster
    "--config.diagnostics.gradients_every=0",
    "--topology=v5e-4",
    "--mesh=1,2,2",
    f"--json={report}",
  )
  assert out.returncode == 0, out.stderr[-4000:]
  (r,) = json.loads(report.read_text())
  assert (r["platform"], r["devices"], r["attention"]) == ("tpu", 4, "splash")
  # Splash attention's kernels, forward and backward, are in the program.
  assert r["tpu_kernels"] >= 2
  assert r["hbm_bytes"] == 16 * 1024**3
  assert 0 < r["param_bytes"] < r["peak_bytes"] < r["hbm_bytes"]
  # Only the adapters have Adam moments (whole-model moments: twice the
  # parameters; these: 0.12 of them, the embedding dominating).
  assert r["optimizer_bytes"] < r["param_bytes"] / 4
  assert "chip memory" in out.stdout and "fits" in out.stdout
  # Splash's kernels are counted by their blocks, every loop of the step
  # has a count read off the TPU program: the roofline bound is given.
  assert r["opaque_calls"] == 0 and r["blind_loops"] == []
  assert (r["peak_flops"], r["peak_bandwidth"]) == (197e12, 819e9)
  assert r["roofline_s"] > 0 and "roofline lower bound" in out.stdout


def test_slices_smaller_than_a_host_have_their_own_bounds():
  # One v5e chip (the size of a consumer GPU's memory) is smaller than a
  # TPU host (2x2 chips): libtpu needs the slice's own host bounds.
  from jax.experimental import topologies

  from starpo_jax.cli import compile_check as cc

  one = cc.SLICES["v5e-1"]
  topology = topologies.get_topology_desc(
    platform="tpu",
    topology_name=one,
    chips_per_host_bounds=cc._host_bounds(one),
  )
  assert len(topology.devices) == 1
  assert cc._host_bounds(cc.SLICES["v5e-8"]) == [2, 2, 1]
  assert cc._host_bounds(cc.SLICES["v5p-16"]) == [2, 2, 1]
