"""The training driver: config errors, resume after SIGKILL."""

from __future__ import annotations

import itertools
import os
import random
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx

from configs import bandit
from starpo_jax.algo import advantages as adv_lib
from starpo_jax.cli import report
from starpo_jax.run import assembly, checkpoint, preemption, train
from starpo_jax.run import metrics as metrics_lib
from tests.helpers import read_tensorboard

SMALL = [
  "--config.sft.steps=0",
  "--config.rollout.env_groups=2",
  "--config.rollout.group_size=4",
  "--config.algo.minibatches=2",
  "--config.filter.value=1.0",
  "--config.train.eval_every=0",
  "--config.train.checkpoint_every=2",
]


def main_cmd(workdir, *flags):
  return [
    sys.executable,
    "-m",
    "starpo_jax.main",
    "--config=configs/bandit.py",
    f"--workdir={workdir}",
    *flags,
  ]


def test_unknown_config_key_is_rejected_by_name_before_compiling(tmp_path):
  start = time.perf_counter()
  result = subprocess.run(
    main_cmd(tmp_path, "--config.rollout.group_sise=4"),
    capture_output=True,
    text=True,
  )
  assert result.returncode != 0
  assert "group_sise" in result.stderr
  assert time.perf_counter() - start < 60
  assert not (tmp_path / "checkpoints").exists()


def test_wrongly_typed_config_value_is_rejected_by_name(tmp_path):
  result = subprocess.run(
    main_cmd(tmp_path, "--config.rollout.group_size=many"),
    capture_output=True,
    text=True,
  )
  assert result.returncode != 0
  assert "group_size" in result.stderr


def test_a_run_does_not_import_pytorch_for_its_tensorboard_writer():
  """tensorboardX would import torch at import (seconds of every run's
  start); the writer hides it, and torch still imports after."""
  code = (
    "import sys; import starpo_jax.run.metrics as m; "
    "assert 'torch' not in sys.modules, 'torch imported'; "
    "import torch; print(m.SummaryWriter.__name__)"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == "SummaryWriter"


def test_a_setting_that_cannot_work_says_so_without_a_traceback(tmp_path):
  result = subprocess.run(
    main_cmd(tmp_path, "--config.algo.minibatches=3"),
    capture_output=True,
    text=True,
  )
  assert result.returncode == 2
  assert result.stderr.startswith("error: config.algo.minibatches=3"), (
    result.stderr
  )
  assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
  "section, name, value, message",
  [
    ("algo", "adv_estimator", "ppo", "adv_estimator"),
    ("algo", "minibatches", 3, "minibatches"),
    ("filter", "strategy", "best", "strategy"),
    ("rollout", "max_turns", 0, "max_turns"),
    ("rollout", "top_p", 1.5, "top_p"),
    ("model", "preset", "gpt-5", "preset"),
    ("model", "num_kv_heads", 3, "num_kv_heads"),
    ("train", "profile", "5", "train.profile"),
    ("train", "profile", "3:2", "train.profile"),
    ("train", "profile", "0:2", "train.profile"),
  ],
)
def test_bad_values_fail_before_compiling_naming_the_setting(
  section, name, value, message
):
  c = bandit.get_config(None)
  c[section][name] = value
  with pytest.raises(assembly.ConfigError, match=message):
    assembly.build(c)


def test_bad_environment_arguments_are_named():
  c = bandit.get_config(None)
  c.env.kwargs.split = "validation"
  with pytest.raises(assembly.ConfigError, match="split"):
    assembly.build(c)


def test_unwritable_workdir_gives_a_clear_error(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a directory")
  with pytest.raises(assembly.ConfigError, match="not writable"):
    train.run(bandit.get_config(None), str(blocker / "run"))


def test_repeated_nonfinite_steps_stop_the_run_keeping_the_checkpoint(
  tmp_path, monkeypatch
):
  # NaN advantages, as a reward that overflows would give (the config
  # refuses non-finite settings, so the fault is planted in the step).
  compute = adv_lib.compute
  monkeypatch.setattr(
    adv_lib,
    "compute",
    lambda *a, **k: jax.tree.map(lambda x: x * np.nan, compute(*a, **k)),
  )
  c = bandit.get_config(None)
  c.sft.steps = 0
  c.rollout.env_groups, c.rollout.group_size = 2, 4
  c.algo.minibatches = 2
  c.filter.value = 1.0
  c.train.eval_every = 0
  c.train.checkpoint_every = 1
  c.train.max_nonfinite_steps = 2
  c.diagnostics.collapse_every = c.diagnostics.gradients_every = 0  # faster
  with pytest.raises(
    train.NonFiniteError, match="last good checkpoint is step 1"
  ):
    train.run(c, str(tmp_path))
  records = metrics_lib.read_metrics(str(tmp_path))
  assert [r["train/skipped_nonfinite"] > 0 for r in records] == [True, True]
  # The checkpoint holds the untouched initial parameters.
  params = assembly.final_params(str(tmp_path), c)
  setup = assembly.build(c)
  state = assembly.init_state(setup, assembly.make_learner(setup))
  initial = jax.tree.map(np.asarray, nnx.to_pure_dict(state.policy))
  assert all(jax.tree.leaves(jax.tree.map(np.array_equal, params, initial)))


def test_a_profiled_run_writes_a_trace_of_the_chosen_steps(tmp_path, capsys):
  c = bandit.get_config(None)
  c.sft.steps = 0
  c.rollout.env_groups, c.rollout.group_size = 2, 4
  c.algo.minibatches = 2
  c.train.eval_every = 0
  c.train.steps = 3
  c.train.profile = "2:3"
  c.diagnostics.collapse_every = 0
  train.run(c, str(tmp_path))
  traces = list((tmp_path / "profile").rglob("*.xplane.pb"))
  assert len(traces) == 1 and traces[0].stat().st_size > 0
  assert f"profile of steps 2-2: {tmp_path}" in capsys.readouterr().out
  # A step's time is its run, not its asynchronous dispatch: most of the
  # wall time between two logged steps.
  logged = metrics_lib.read_metrics(str(tmp_path))
  for before, after in itertools.pairwise(logged[1:]):
    wall = after["time/elapsed_s"] - before["time/elapsed_s"]
    assert after["time/step_s"] > 0.5 * wall, (after["step"], wall)


def _comparable(records):
  return [
    {k: v for k, v in r.items() if not k.startswith("time/")} for r in records
  ]


def _wait_until(ready, proc, deadline=300):
  end = time.time() + deadline
  while not ready():
    assert proc.poll() is None, "the run ended before it could be stopped"
    assert time.time() < end
    time.sleep(0.05)


def _logged_steps(workdir) -> list[int]:
  if not (workdir / "metrics.jsonl").exists():
    return []
  return [r["step"] for r in metrics_lib.read_metrics(str(workdir))]


def test_killed_and_preempted_runs_resume_to_the_same_parameters_and_metrics(
  tmp_path,
):
  flags = [
    *SMALL,
    "--config.train.steps=12",
    "--config.diagnostics.collapse_every=3",
    "--config.diagnostics.gradients_every=3",
  ]
  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  # The runs compile the same step: JAX's persistent cache compiles it
  # once (the executable is the same, so is every result).
  env = dict(
    os.environ,
    JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax-cache"),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
  )
  first = subprocess.run(
    main_cmd(straight, *flags),
    check=True,
    capture_output=True,
    text=True,
    env=env,
  ).stdout.splitlines()
  # What the run will do comes first, before anything compiles.
  assert first[0].startswith("bandit: 12 RL steps of 8 episodes"), first
  assert first[1].startswith("algorithm: grpo advantages"), first
  # The settings the config changed, by name; then where it writes, and
  # only then a compile.
  at = lambda prefix: next(
    i for i, x in enumerate(first) if x.startswith(prefix)
  )
  changed = " ".join(first[at("settings beside") : at("writing to")])
  assert "rollout.env_groups=2" in changed and "train.steps=12" in changed
  # Set to its default (0), the warm start is not a change.
  assert "rollout.max_turns=1" in changed and "sft.steps" not in changed
  compiling = first.index(
    "compiling the RL step (once; its first call runs it)"
  )
  assert at("writing to") < compiling, first
  proc = subprocess.Popen(
    main_cmd(resumed, *flags),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
    env=env,
  )
  # Kill it hard once a checkpoint exists and before it finishes.
  _wait_until((resumed / "checkpoints" / "2").exists, proc)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait() == -signal.SIGKILL
  assert not (resumed / "checkpoints" / "12").exists()
  # Resumed, then preempted (SIGTERM) at a random moment once it runs
  # again: it finishes the step in progress, checkpoints exactly there
  # (this run checkpoints on no schedule), says so, and exits 75.
  proc = subprocess.Popen(
    main_cmd(resumed, *flags, "--config.train.checkpoint_every=100"),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    env=env,
  )
  _wait_until(lambda: max(_logged_steps(resumed), default=0) >= 4, proc)
  time.sleep(random.uniform(0.0, 0.2))
  done = _logged_steps(resumed)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == preemption.EXIT_STATUS, out[-3000:]
  stop = re.search(r"stopped by SIGTERM after step (\d+) of 12", out)
  assert stop, out[-3000:]
  stopped_at = int(stop.group(1))
  assert max(done) <= stopped_at < 12
  assert (resumed / "checkpoints" / str(stopped_at)).exists()
  out = subprocess.run(
    main_cmd(resumed, *flags),
    check=True,
    capture_output=True,
    text=True,
    env=env,
  )
  assert f"resumed from step {stopped_at}" in out.stdout
  c = bandit.get_config(None)
  c.rollout.env_groups, c.rollout.group_size = 2, 4
  c.algo.minibatches = 2
  a = assembly.final_params(str(straight), c)
  b = assembly.final_params(str(resumed), c)
  assert all(jax.tree.leaves(jax.tree.map(np.array_equal, a, b)))
  ra = _comparable(metrics_lib.read_metrics(str(straight)))
  rb = _comparable(metrics_lib.read_metrics(str(resumed)))
  assert [r["step"] for r in rb] == list(range(1, 13))
  assert ra == rb
  # Checkpoints every 2 steps, the last 3 kept; the config beside them.
  kept = sorted(int(p.name) for p in (straight / "checkpoints").iterdir())
  assert kept == [8, 10, 12]
  assert (straight / "config.json").is_file()
  # TensorBoard holds every logged metric at its step (its tags allow only
  # letters, digits and "_-/.": "pass@4" is "pass_4" there).
  events = read_tensorboard(straight / "tensorboard")
  logged = {
    (re.sub(r"[^-/\w.]", "_", k), r["step"]): v
    for r in metrics_lib.read_metrics(str(straight))
    for k, v in r.items()
    if k != "step"
  }
  assert events.keys() == logged.keys()
  for key, value in logged.items():
    assert events[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
  # The collapse diagnostics, computed and logged every 3rd step only.
  assert [r["step"] for r in ra if "collapse/mi" in r] == [3, 6, 9, 12]
  assert [r["step"] for r in ra if "grads/task" in r] == [3, 6, 9, 12]
  for r in ra:
    assert "collapse/first_turn_valid_rate" in r
    if "collapse/mi" in r:
      assert r["collapse/mi"] <= r["collapse/mi_bound"] + 1e-5
      assert 0 <= r["collapse/retrieval@1"] <= 1
      assert r["collapse/scored_replies"] == 8
  # The report reads a real run.
  drawn = report.report([str(straight)], out=str(tmp_path / "report"))
  assert {"success", "entropy", "mutual_information"} <= set(drawn["images"])


def test_init_from_starts_with_another_runs_policy(tmp_path):
  def state_of(seed, **model):
    c = bandit.get_config(None)
    c.seed = seed
    for name, value in model.items():
      c.model[name] = value
    setup = assembly.build(c)
    return setup, assembly.init_state(setup, assembly.make_learner(setup))

  pure = lambda s: jax.tree.map(np.asarray, nnx.to_pure_dict(s.policy))
  _, source = state_of(5)
  ckpt = checkpoint.Checkpointer(str(tmp_path / "src" / "checkpoints"), 2)
  ckpt.save(3, source)
  ckpt.close()
  setup, fresh = state_of(0)
  before = pure(fresh)
  started = assembly.policy_from(fresh, setup, str(tmp_path / "src"))
  same = jax.tree.map(np.array_equal, pure(started), pure(source))
  assert all(jax.tree.leaves(same))
  assert all(jax.tree.leaves(jax.tree.map(np.array_equal, pure(fresh), before)))
  with pytest.raises(assembly.ConfigError, match="does not fit"):
    assembly.policy_from(
      *state_of(0, num_layers=1)[::-1], str(tmp_path / "src")
    )
  with pytest.raises(assembly.ConfigError, match="no checkpoint"):
    assembly.policy_from(fresh, setup, str(tmp_path / "nowhere"))
  with pytest.raises(
    assembly.ConfigError, match=r"no checkpoint at step 4.*\[3\]"
  ):
    assembly.load_policy(setup, str(tmp_path / "src"), step=4)


def test_the_commands_keep_libtpu_quiet_without_tpus():
  """With libtpu installed (the test requirements) and no TPU chip, JAX's
  backend start in a command (``cli.app.quiet_libtpu`` first) prints none
  of libtpu's errors; importing the library alone changes nothing."""
  pytest.importorskip("libtpu")
  env = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith("TPU_") and k != "JAX_PLATFORMS"
  }
  # libtpu starts in this process even if another holds its lock file.
  env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
  untouched = subprocess.run(
    [
      sys.executable,
      "-c",
      "import os, starpo_jax; print(sorted(k for k in os.environ "
      "if k.startswith('TPU_')))",
    ],
    capture_output=True,
    text=True,
    env=env,
    check=True,
  )
  assert untouched.stdout.strip() == "[]", untouched.stdout
  out = subprocess.run(
    [
      sys.executable,
      "-c",
      "from starpo_jax.cli.app import quiet_libtpu; quiet_libtpu(); "
      "import jax; print(jax.devices())",
    ],
    capture_output=True,
    text=True,
    env=env,
    check=True,
  )
  assert "TPU_WORKER_HOSTNAMES" not in out.stderr, out.stderr
  assert "accelerator type" not in out.stderr, out.stderr


def test_the_progress_rate_follows_the_recent_steps(monkeypatch, capsys):
  # Steps 1 to 11 a second apart (the warm start), then 5 s apart (RL):
  # once ten RL steps are logged the line says 5.0 s/step, where the mean
  # since the first step would say 3.3.
  times = [float(t) for t in range(11)] + [10.0 + 5 * k for k in range(1, 15)]
  clock = iter(times)
  monkeypatch.setattr(metrics_lib.time, "perf_counter", lambda: next(clock))
  progress = metrics_lib.Progress(25, window=10)
  for step in range(1, 26):
    progress.update(step, {"rollout/return": 0.0})
  lines = capsys.readouterr().err.strip().splitlines()
  assert lines[10].endswith(" 1.0 s/step"), lines[10]
  assert lines[-1].endswith(" 5.0 s/step"), lines[-1]
