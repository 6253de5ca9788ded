"""The compiled step on meshes of 8 simulated CPU devices (a subprocess,
since the device count is fixed when JAX starts) against one device."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from configs import bandit
from starpo_jax import sharding
from starpo_jax.run import assembly

MESHES = ["(2, 2, 2)"]


@pytest.fixture(scope="module")
def runs():
  env = dict(
    os.environ,
    XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8",
    PYTHONPATH=os.getcwd(),
  )
  out = subprocess.run(
    [sys.executable, "-m", "tests.sharding.run_meshes"],
    env=env,
    capture_output=True,
    text=True,
    check=False,
    timeout=1200,
  )
  assert out.returncode == 0, out.stderr[-4000:]
  return json.loads(out.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES)
def test_metrics_match_one_device(runs, mesh):
  one, many = runs["(1, 1, 1)"], runs[mesh]
  assert one["metrics"].keys() == many["metrics"].keys()
  # Sanity: the update did something, so agreement is not vacuous; it
  # trained the compacted half of the groups.
  assert one["metrics"]["train/grad_norm"] > 1e-3
  assert one["metrics"]["filter/kept_ratio"] == 0.5
  assert one["metrics"]["train/updates"] == 1
  for name, value in one["metrics"].items():
    if name.startswith("time/") or name.endswith("_per_s"):
      continue
    np.testing.assert_allclose(
      many["metrics"][name], value, atol=1e-5, rtol=1e-5, err_msg=name
    )
  # The gradient the update starts from: the same on every mesh.
  g_one, g_many = np.asarray(one["grad"]), np.asarray(many["grad"])
  assert np.abs(g_one).max() > 1e-3
  np.testing.assert_allclose(
    g_many, g_one, rtol=1e-4, atol=1e-6 * np.abs(g_one).max()
  )
  # The updated parameters: equal but for coordinates where Adam's +-lr
  # first step took the sign of rounding noise (see run_meshes.py).
  lr = bandit.get_config("").optim.lr
  a, b = np.asarray(one["policy"]), np.asarray(many["policy"])
  diff = np.abs(a - b)
  assert np.mean(diff < 1e-5) > 0.999, np.mean(diff < 1e-5)
  assert diff.max() <= 2 * lr + 1e-5


@pytest.mark.slow
def test_the_shared_prefill_on_a_mesh_equals_every_episode_prefilling(runs):
  shared, alone = runs["(2, 2, 2)"]["metrics"], runs["(2, 2, 2) unshared"]
  assert shared.keys() == alone["metrics"].keys()
  for name, value in shared.items():
    if name.startswith("time/") or name.endswith("_per_s"):
      continue
    np.testing.assert_allclose(
      alone["metrics"][name], value, atol=1e-5, rtol=1e-5, err_msg=name
    )


@pytest.mark.slow
def test_a_digest_is_the_same_on_every_mesh(runs):
  # The same weights, created sharded four ways: one digest (a LoRA
  # checkpoint written on one mesh is restored on another).
  digests = {mesh: r["digest"] for mesh, r in runs.items()}
  assert len(set(digests.values())) == 1, digests


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES)
def test_parameter_shard_shapes(runs, mesh):
  data, fsdp, tensor = (int(d) for d in mesh.strip("()").split(","))
  del data
  m = bandit.get_config("").model  # the run's model: tiny, 1 layer
  hidden, heads, head_dim = m.hidden_size, m.num_heads, m.head_dim
  shards = runs[mesh]["shards"]
  assert shards["q"] == [1, hidden // fsdp, heads // tensor, head_dim]
  assert shards["mlp_up"] == [1, hidden // fsdp, 128 // tensor]
  # The vocabulary (461 tokens) is prime to every axis: only hidden splits.
  assert shards["embed"][1] == hidden // fsdp


@pytest.mark.slow
def test_parameter_memory_falls_with_fsdp_and_tensor_parallelism(runs):
  # FSDP alone: tests/cli/test_compile_check.py (a quarter with 4 devices).
  full = runs["(1, 1, 1)"]["param_bytes"]
  for mesh in MESHES:
    _, fsdp, tensor = (int(d) for d in mesh.strip("()").split(","))
    got = runs[mesh]["param_bytes"]
    # Tensor parallelism splits further than FSDP alone (not the norm
    # scales, nor the 461-token vocabulary).
    assert full / (fsdp * tensor) <= got < full / fsdp, (mesh, got, full)


@pytest.mark.parametrize(
  "shape,devices,want",
  [
    ((-1, 1, 1), 8, (8, 1, 1)),
    ((2, -1, 2), 8, (2, 2, 2)),
    ((1, 1, 1), 1, (1, 1, 1)),
  ],
)
def test_mesh_shape_fills_minus_one(shape, devices, want):
  assert sharding.mesh_shape(shape, devices) == want


@pytest.mark.parametrize(
  "shape,match",
  [
    ((3, 1, 1), "needs 3 devices"),
    ((-1, -1, 1), "at most one -1"),
    ((1, 1), "must have 3 entries"),
    ((-1, 3, 1), "does not divide"),
  ],
)
def test_bad_mesh_shape_is_named(shape, match):
  with pytest.raises(ValueError, match=match):
    sharding.mesh_shape(shape, 8)


def test_bad_mesh_fails_before_compiling():
  c = bandit.get_config("")
  c.mesh.shape = (3, 1, 1)
  with pytest.raises(assembly.ConfigError, match=r"config\.mesh\.shape"):
    assembly.build(c)


@pytest.mark.slow
def test_two_processes_agree(tmp_path):
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = str(s.getsockname()[1])
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  # The reference: the same run in one process with two devices.
  flags = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
  single = dict(env, XLA_FLAGS=flags)
  # The pair would run 60 steps; process 1 alone gets a SIGTERM once step
  # 2 is logged, and JAX's preemption service stops both at one step.
  runs = [
    (port, 0, "run", env, "60"),
    (port, 1, "run", env, "60"),
    ("single", 0, "one", single, "2"),
  ]
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        "-m",
        "tests.sharding.run_distributed",
        first,
        str(i),
        str(tmp_path / workdir),
        steps,
      ],
      env=process_env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for first, i, workdir, process_env, steps in runs
  ]
  metrics = tmp_path / "run" / "metrics.jsonl"
  deadline = time.time() + 900
  while not (metrics.exists() and '"step": 2' in metrics.read_text()):
    assert all(p.poll() is None for p in procs[:2]), "the pair ended early"
    assert time.time() < deadline
    time.sleep(0.1)
  procs[1].send_signal(signal.SIGTERM)
  outs = [p.communicate(timeout=900) for p in procs]
  for p, (_, err) in zip(procs, outs, strict=True):
    assert p.returncode == 0, err[-4000:]
  results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
  assert [r["process_count"] for r in results] == [2, 2, 1]
  assert [r["devices"] for r in results] == [2, 2, 2]
  assert [r["preempted"] for r in results] == ["SIGTERM", "SIGTERM", None]
  stop = results[0]["steps"]
  assert results[1]["steps"] == stop and 2 <= stop < 60
  assert results[0]["metrics"] == results[1]["metrics"]
  # Step 2 of the pair equals the single process's last (step 2). After
  # an Adam step, yet held tight: both runs shard the same program over
  # two devices, and a sum of two partial results is the same in either
  # order, so nothing is summed differently (any kind of CPU).
  records = [json.loads(line) for line in metrics.read_text().splitlines()]
  two = next(r for r in records if r["step"] == 2)
  one = results[2]["metrics"]
  assert {k for k in two if not k.startswith("time/")} - {"step"} == set(one)
  for name, value in one.items():
    np.testing.assert_allclose(
      two[name], value, rtol=1e-5, atol=1e-6, err_msg=name
    )
  # Only process 0 reports: one progress line, one metrics file (step 0:
  # the untrained policy's evaluation).
  assert f"stopped by SIGTERM after step {stop} of 60" in outs[0][0]
  assert "stopped by" not in outs[1][0]
  assert "done: 2 steps" in outs[2][0]
  assert [r["step"] for r in records] == list(range(stop + 1))
  # The stop was checkpointed (orbax, written by both processes).
  assert (
    sorted(map(int, os.listdir(tmp_path / "run" / "checkpoints")))[-1] == stop
  )


@pytest.mark.slow
def test_two_processes_step_their_own_python_episodes(tmp_path):
  """gym_sokoban on a two-process mesh: each process steps the episodes
  of its own batch shard (slots 0-3 and 4-7 of 8), and both report the
  same metrics (the mesh test below: per-shard stepping plays what one
  call for the batch plays)."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = str(s.getsockname()[1])
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  procs = [
    subprocess.Popen(
      [sys.executable, "-m", "tests.sharding.run_distributed", port, str(i),
       str(tmp_path / "run"), "2", "gym_sokoban"],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]  # fmt: skip
  outs = [p.communicate(timeout=900) for p in procs]
  for p, (_, err) in zip(procs, outs, strict=True):
    assert p.returncode == 0, err[-4000:]
  results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
  assert [r["slots"] for r in results] == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert [r["steps"] for r in results] == [2, 2]
  assert results[0]["metrics"] == results[1]["metrics"]
  assert results[0]["metrics"]["rollout/env_error"] == 0.0
  assert results[0]["metrics"]["rollout/num_turns"] > 0


def test_python_episodes_are_stepped_per_batch_shard_on_a_mesh():
  """gym_sokoban on a 2 x 2 x 2 mesh (data x fsdp x tensor): one host call
  per turn for each of the 4 batch shards (the tensor copies skip it),
  and trajectories equal to one device's."""
  env = dict(
    os.environ,
    PYTHONPATH=os.getcwd(),
    XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8",
  )
  out = subprocess.run(
    [sys.executable, "-m", "tests.sharding.run_host_meshes"],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-4000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["equal"]
  one, mesh = result["calls"]["(1, 1, 1)"], result["calls"]["(2, 2, 2)"]
  turns = len(one)
  assert one == [[0, 16]] * turns
  assert sorted(mesh) == sorted([[o, 4] for o in (0, 4, 8, 12)] * turns)
  # The jittable Sokoban, observations tokenized as text: the same tokens
  # as gym-sokoban's on both meshes, one host call per shard and turn.
  assert result["text_equal"]
  one, mesh = (
    result["text_calls"]["(1, 1, 1)"],
    result["text_calls"]["(2, 2, 2)"],
  )
  assert one == [[0, 16]] * turns
  assert sorted(mesh) == sorted([[o, 4] for o in (0, 4, 8, 12)] * turns)
