"""Bandit: arm names, payouts and prompt text against a Python peer."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import envs
from envs.jax.bandit import constants
from reference import envs as ref
from tests.envs.conftest import (
  NUM_LEVELS,
  batch_reset,
  index,
  level_pool,
  play,
  text,
  to_numpy,
)


def test_train_and_test_names_are_disjoint_and_pairs_are_distinct():
  train = {n for pair in constants.TRAIN_PAIRS for n in pair}
  test = {n for pair in constants.TEST_PAIRS for n in pair}
  assert not train & test
  assert len(train) == 2 * len(constants.TRAIN_PAIRS)
  assert len(set(constants.ACTIONS)) == len(constants.ACTIONS)


@pytest.mark.parametrize("split", ["train", "test"])
def test_arms_come_from_their_split_in_either_order(split):
  env, reset = batch_reset("bandit", split=split)
  states = to_numpy(reset(jax.random.split(jax.random.key(0), NUM_LEVELS))[0])
  pairs = set(constants.SPLITS[split])
  names = env.spec.action_names
  seen = {
    (names[lo], names[hi])
    for lo, hi in zip(states.low, states.high, strict=True)
  }
  assert seen == pairs
  assert 0.4 < states.high_first.mean() < 0.6


def test_steps_match_the_python_rules_on_1024_episodes():
  env = envs.make("bandit")
  states = to_numpy(level_pool("bandit"))
  rng = np.random.default_rng(0)
  # Each episode tries the low arm, the high arm, an unavailable name or an
  # out-of-range id, then acts again after the pull.
  choice = rng.integers(0, 4, NUM_LEVELS)
  other = (states.low + 2) % len(constants.ACTIONS)
  first = np.select(
    [choice == 0, choice == 1, choice == 2],
    [states.low, states.high, other],
    len(constants.ACTIONS),
  )
  actions = np.stack([first, states.high], axis=1).astype(np.int32)
  out = play(env, level_pool("bandit"), actions)
  names = env.spec.action_names
  for i in range(NUM_LEVELS):
    s = index(states, i)
    peer = ref.Bandit(names[s.low], names[s.high], bool(s.high_first))
    assert text(env.spec, out["pieces0"][i], out["n0"][i]) == peer.text()
    for t in range(2):
      a = int(actions[i, t])
      name = names[a] if 0 <= a < len(names) else "?"
      wins = out["reward"][i, t] == 1.0
      want = peer.step(name, high_wins=wins)
      assert text(env.spec, out["pieces"][i, t], out["n"][i, t]) == peer.text()
      assert out["reward"][i, t] == pytest.approx(want.reward)
      for flag in ("terminated", "truncated", "success", "valid", "effective"):
        assert bool(out[flag][i, t]) == getattr(want, flag), (i, t, flag)


def test_high_risk_arm_pays_one_a_quarter_of_the_time():
  env = envs.make("bandit")
  state = index(level_pool("bandit"), 0)
  n = 20_000
  states = jax.vmap(lambda k: state.replace(key=k))(
    jax.random.split(jax.random.key(3), n)
  )
  _, ts = jax.vmap(env.step, in_axes=(0, None))(states, state.high)
  rewards = np.asarray(ts.reward)
  assert set(np.unique(rewards)) <= {0.0, 1.0}
  assert rewards.mean() == pytest.approx(0.25, abs=0.015)
  assert np.all(np.asarray(ts.success))
  _, ts = jax.vmap(env.step, in_axes=(0, None))(states, state.low)
  assert np.all(np.asarray(ts.reward) == np.float32(0.1))
  assert not np.any(np.asarray(ts.success))


@pytest.mark.parametrize(
  "kwargs, name",
  [
    (dict(split="validation"), "split"),
    (dict(high_risk_prob=1.5), "high_risk_prob"),
    (dict(low_risk_reward="a lot"), "low_risk_reward"),
    (dict(arms=3), "arms"),
  ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, name):
  with pytest.raises(ValueError, match=name):
    envs.make("bandit", **kwargs)
