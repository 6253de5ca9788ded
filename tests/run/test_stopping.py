"""Early stopping: each rule fires exactly when its condition holds, and a
run it stops ends with a checkpoint and the reason."""

from __future__ import annotations

import os

import pytest

from configs import bandit
from starpo_jax.run import assembly, checkpoint, train
from starpo_jax.run import metrics as metrics_lib
from starpo_jax.run.stopping import (
  KEPT,
  RELATIVE_STD,
  REWARD_STD,
  EarlyStop,
  StopConfig,
)


def first_firing(stop, stream, feed):
  """The 1-based index of the item on which ``stop`` first fires."""
  for i, item in enumerate(stream, 1):
    if feed(stop, item) is not None:
      return i
  return None


step = lambda stop, m: stop.after_step(m)


def test_reward_std_rule_fires_after_patience_steps_below_the_fraction():
  stop = EarlyStop(StopConfig(enabled=True, success_patience=0))
  # Baseline mean 1.0; 0.09 is below 10% of it, 0.11 is not.
  stream = [{REWARD_STD: 1.0}] * 10
  stream += [{REWARD_STD: 0.09}] * 9 + [{REWARD_STD: 0.11}]
  stream += [{REWARD_STD: 0.09}] * 10
  assert first_firing(stop, stream, step) == 30


def test_reward_std_baseline_is_the_mean_of_the_first_steps():
  stop = EarlyStop(
    StopConfig(
      enabled=True,
      baseline_steps=2,
      reward_std_patience=1,
      reward_std_fraction=0.5,
      empty_patience=0,
    )
  )
  # Baseline (2 + 0) / 2 = 1: 0.6 is not below 0.5, 0.4 is.
  stream = [{REWARD_STD: 2.0}, {REWARD_STD: 0.0}, {REWARD_STD: 0.6}]
  assert first_firing(stop, [*stream, {REWARD_STD: 0.4}], step) == 4


def test_reward_std_relative_to_its_early_level_is_logged_rules_off():
  stop = EarlyStop(StopConfig(baseline_steps=2))
  a, b, c = {REWARD_STD: 2.0}, {REWARD_STD: 1.0}, {REWARD_STD: 0.3}
  for m in (a, b, c):
    assert stop.after_step(m) is None
  assert RELATIVE_STD not in a and RELATIVE_STD not in b
  assert c[RELATIVE_STD] == pytest.approx(0.2)  # 0.3 / mean(2, 1)


def test_empty_filter_rule_fires_after_patience_steps_in_a_row():
  stop = EarlyStop(StopConfig(enabled=True, reward_std_patience=0))
  stream = [{KEPT: 0.0}] * 4 + [{KEPT: 0.25}] + [{KEPT: 0.0}] * 5
  assert first_firing(stop, stream, step) == 10
  reason = EarlyStop(StopConfig(enabled=True, empty_patience=1)).after_step(
    {KEPT: 0.0}
  )
  assert "kept no episode for 1 steps" in reason


def test_success_rule_fires_after_patience_evaluations_below_the_floor():
  stop = EarlyStop(StopConfig(enabled=True))
  stream = [0.0, 0.005, 0.0, 0.0, 0.02, 0.0, 0.0, 0.0, 0.0, 0.009]
  assert first_firing(stop, stream, lambda s, x: s.after_eval(x)) == 10


def test_rules_are_off_by_default():
  cfg = StopConfig()
  assert not cfg.enabled
  stop = EarlyStop(cfg)
  collapsed = {REWARD_STD: 0.0, KEPT: 0.0}
  assert first_firing(stop, [collapsed] * 100, step) is None
  assert first_firing(stop, [0.0] * 100, lambda s, x: s.after_eval(x)) is None
  assert bandit.get_config(None).train.early_stop.to_dict() == {
    f: getattr(cfg, f) for f in cfg.__dataclass_fields__
  }


@pytest.mark.parametrize(
  "name, value", [("empty_patience", -1), ("baseline_steps", 0)]
)
def test_bad_settings_are_named(name, value):
  c = bandit.get_config(None)
  c.train.early_stop[name] = value
  with pytest.raises(assembly.ConfigError, match=f"early_stop: {name}"):
    assembly.build(c)


def test_a_stopped_run_ends_at_that_step_with_a_checkpoint(tmp_path, capsys):
  # The bandit's held-out arm names are never learned from scratch: held-out
  # success stays 0%, so the success rule fires at the second RL
  # evaluation (the untrained policy's, at step 0, does not count).
  c = bandit.get_config(None)
  c.sft.steps = 0
  c.train.steps = 6
  c.rollout.env_groups, c.rollout.group_size = 2, 4
  c.algo.minibatches = 2
  c.train.eval_every = 1
  c.train.eval_episodes = 16
  c.train.eval_temperatures = (0.5,)
  c.train.checkpoint_every = 100
  c.train.early_stop.enabled = True
  c.train.early_stop.success_patience = 2
  c.diagnostics.collapse_every = c.diagnostics.gradients_every = 0  # faster
  summary = train.run(c, str(tmp_path))
  assert summary["steps"] == 2
  assert "below 1.0% for 2 evaluations" in summary["early_stop"]
  assert "early stop at step 2" in capsys.readouterr().out
  assert "early stop at step 2" in (tmp_path / "early_stop.txt").read_text()
  records = metrics_lib.read_metrics(str(tmp_path))
  assert [r["step"] for r in records if r["step"] > 0] == [1, 2]
  ckpt = checkpoint.Checkpointer(
    os.path.join(str(tmp_path), "checkpoints"), c.train.keep_checkpoints
  )
  assert ckpt.latest_step() == 2
  ckpt.close()
