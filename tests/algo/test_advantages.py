"""Advantage estimators against NumPy references written as plain loops."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import advantages as ref
from starpo_jax.algo import advantages as adv

B, L, GROUPS = 6, 12, 2


def random_batch(seed):
  rng = np.random.default_rng(seed)
  mask = rng.random((B, L)) < 0.6
  mask[:, 0] = False  # position 0 is never generated
  rewards = np.where(
    mask & (rng.random((B, L)) < 0.3), rng.normal(size=(B, L)), 0.0
  )
  values = rng.normal(size=(B, L)) * mask
  return mask, rewards.astype(np.float32), values.astype(np.float32)


@pytest.mark.parametrize("seed, gamma, lam", [(0, 1.0, 1.0), (1, 0.9, 0.8)])
def test_gae_matches_the_reverse_recursion(seed, gamma, lam):
  mask, rewards, values = random_batch(seed)
  got_adv, got_ret = adv.gae(
    jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), gamma, lam
  )
  raw = ref.gae(rewards, values, mask, gamma, lam)
  np.testing.assert_allclose(
    got_ret, np.where(mask, raw + values, 0), atol=1e-5
  )
  np.testing.assert_allclose(got_adv, ref.whiten(raw, mask), atol=1e-4)


def test_bi_level_gae_matches_ragens_two_loops():
  mask, rewards, values = random_batch(2)
  turn_end = np.zeros_like(mask)
  for b in range(B):
    steps = np.flatnonzero(mask[b])
    turn_end[b, steps[steps % 4 == 3]] = True  # some turn ends
    if steps.size:
      turn_end[b, steps[-1]] = True
  rewards = np.where(turn_end, rewards + 1.0, 0.0).astype(np.float32)
  gamma, lam, turn_gamma = 0.99, 0.95, 0.9
  want = ref.bi_level_gae(
    rewards, values, mask, turn_end, gamma, lam, turn_gamma
  )
  got, _ = adv.bi_level_gae(
    jnp.asarray(rewards),
    jnp.asarray(values),
    jnp.asarray(mask),
    jnp.asarray(turn_end),
    gamma,
    lam,
    turn_gamma,
  )
  np.testing.assert_allclose(got, ref.whiten(want, mask), atol=1e-4)


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_normalises_within_groups(norm):
  rng = np.random.default_rng(3)
  scores = rng.normal(size=B).astype(np.float32)
  mask = rng.random((B, L)) < 0.5
  got = np.asarray(
    adv.grpo(jnp.asarray(scores), jnp.asarray(mask), GROUPS, norm)
  )
  for b in range(B):
    group = scores[(b // 3) * 3 : (b // 3) * 3 + 3]
    a = scores[b] - group.mean()
    if norm:
      a /= group.std(ddof=1) + 1e-6
    np.testing.assert_allclose(
      got[b], np.where(mask[b], a, 0.0), rtol=1e-5, atol=1e-6
    )


def test_grpo_group_of_one_uses_mean_zero_and_std_one():
  scores = jnp.asarray([0.5, -2.0])
  got = adv.grpo(scores, jnp.ones((2, 3), bool), 2, True)
  np.testing.assert_allclose(
    got[:, 0], np.asarray(scores) / (1 + 1e-6), rtol=1e-6
  )


def test_rloo_subtracts_the_mean_of_the_others():
  rng = np.random.default_rng(4)
  scores = rng.normal(size=B).astype(np.float32)
  got = np.asarray(
    adv.rloo(jnp.asarray(scores), jnp.ones((B, 2), bool), GROUPS)
  )
  for b in range(B):
    start = (b // 3) * 3
    others = [scores[i] for i in range(start, start + 3) if i != b]
    np.testing.assert_allclose(
      got[b, 0], scores[b] - np.mean(others), atol=1e-5
    )


def test_reinforce_plus_plus_returns_to_go_then_whitens():
  mask, rewards, _ = random_batch(5)
  gamma = 0.97
  want = np.zeros_like(rewards)
  for b in range(B):
    running = 0.0
    for p in np.flatnonzero(mask[b])[::-1]:
      running = rewards[b, p] + gamma * running
      want[b, p] = running
  got_adv, got_ret = adv.reinforce_plus_plus(
    jnp.asarray(rewards), jnp.asarray(mask), gamma
  )
  np.testing.assert_allclose(got_ret, want, atol=1e-5)
  np.testing.assert_allclose(got_adv, ref.whiten(want, mask), atol=1e-4)


def test_reinforce_plus_plus_baseline_subtracts_group_mean_then_whitens():
  rng = np.random.default_rng(6)
  scores = rng.normal(size=B).astype(np.float32)
  mask = rng.random((B, L)) < 0.5
  raw = np.stack(
    [
      np.where(
        mask[b], scores[b] - scores[(b // 3) * 3 : (b // 3) * 3 + 3].mean(), 0
      )
      for b in range(B)
    ]
  )
  got = adv.reinforce_plus_plus_baseline(
    jnp.asarray(scores), jnp.asarray(mask), GROUPS
  )
  np.testing.assert_allclose(got, ref.whiten(raw, mask), atol=1e-4)


@pytest.mark.parametrize("groups,size", [(1, 16), (4, 5)])
@settings(max_examples=30, deadline=None)
@given(value=st.floats(-20, 20, allow_nan=False, width=32))
def test_equal_rewards_give_exactly_zero_advantages(groups, size, value):
  # Rounding in a plain mean would turn "no signal" into advantages of
  # order 1 after division by a near-zero std, differently on each mesh.
  scores = jnp.full((groups * size,), value, jnp.float32)
  mask = jnp.ones((groups * size, 3), bool)
  for norm in (True, False):
    assert not np.any(np.asarray(adv.grpo(scores, mask, groups, norm)))
  assert not np.any(np.asarray(adv.rloo(scores, mask, groups)))
  assert not np.any(np.asarray(adv.group_std(scores.reshape(groups, size))))
  tokens = jnp.full((groups * size, 3), value, jnp.float32)
  ragged = mask.at[:, 2].set(False)
  assert not np.any(np.asarray(adv.masked_whiten(tokens, ragged)))
