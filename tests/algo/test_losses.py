"""Losses against NumPy references (verl's formulas, written out)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from starpo_jax.algo import losses

B, T = 5, 9


def batch(seed):
  rng = np.random.default_rng(seed)
  logp = rng.normal(-1.0, 0.5, (B, T)).astype(np.float32)
  old = (logp + rng.normal(0, 0.4, (B, T))).astype(np.float32)
  advs = rng.normal(size=(B, T)).astype(np.float32)
  mask = rng.random((B, T)) < 0.6
  mask[0] = False  # a sequence with nothing to train on
  return logp, old, advs, mask


def np_aggregate(x, mask, mode):
  if mode == "token-mean":
    return (x * mask).sum() / mask.sum()
  per = (x * mask).sum(-1)
  if mode == "seq-mean-token-mean":
    per = per / np.maximum(mask.sum(-1), 1)
  present = mask.any(-1)
  return per[present].mean()


@pytest.mark.parametrize("mode", losses.AGGREGATIONS)
def test_clipped_policy_loss_matches_numpy(mode):
  logp, old, advs, mask = batch(0)
  lo, hi, c = 0.2, 0.28, 3.0
  ratio = np.exp(logp - old)
  l1 = -advs * ratio
  l2 = -advs * np.clip(ratio, 1 - lo, 1 + hi)
  clipped = np.maximum(l1, l2)
  dual = np.minimum(-advs * c, clipped)
  per = np.where(advs < 0, dual, clipped)
  got, stats = losses.policy_loss(
    jnp.asarray(logp),
    jnp.asarray(old),
    jnp.asarray(advs),
    jnp.asarray(mask),
    clip_low=lo,
    clip_high=hi,
    dual_clip=c,
    aggregation=mode,
  )
  np.testing.assert_allclose(got, np_aggregate(per, mask, mode), rtol=1e-5)
  frac = lambda x: (x & mask).sum() / mask.sum()
  np.testing.assert_allclose(stats["clip_frac"], frac(l2 > l1), rtol=1e-6)
  np.testing.assert_allclose(
    stats["clip_frac_upper"], frac((ratio > 1 + hi) & (advs > 0)), rtol=1e-6
  )
  np.testing.assert_allclose(
    stats["clip_frac_lower"], frac((ratio < 1 - lo) & (advs < 0)), rtol=1e-6
  )
  np.testing.assert_allclose(
    stats["dual_clip_frac"], frac((clipped > -advs * c) & (advs < 0)), rtol=1e-6
  )
  np.testing.assert_allclose(
    stats["approx_kl"], ((old - logp) * mask).sum() / mask.sum(), rtol=1e-5
  )
  assert 0 < stats["clip_frac"] < 1


def test_dual_clip_bounds_the_loss_of_negative_advantages():
  # Ratios far above 1 + clip with negative advantages: the dual clip caps
  # the loss at -advantage x dual_clip (and its gradient at zero).
  ratio = np.asarray([[0.5, 1.0, 2.0, 3.5, 6.0, 40.0]], np.float32)
  advs = np.asarray([[-1.0, -1.0, -2.0, -1.0, -0.5, 1.0]], np.float32)
  logp = jnp.log(jnp.asarray(ratio))
  old = jnp.zeros_like(logp)
  mask = jnp.ones_like(logp, bool)
  c = 3.0
  per = np.maximum(-advs * ratio, -advs * np.clip(ratio, 0.8, 1.28))
  per = np.where(advs < 0, np.minimum(per, -advs * c), per)
  loss, stats = losses.policy_loss(
    logp,
    old,
    jnp.asarray(advs),
    mask,
    clip_low=0.2,
    clip_high=0.28,
    dual_clip=c,
    aggregation="token-mean",
  )
  np.testing.assert_allclose(loss, per.mean(), rtol=1e-5)
  np.testing.assert_allclose(stats["dual_clip_frac"], 2 / 6)  # 3.5 and 6.0
  grad = jax.grad(
    lambda lp: losses.policy_loss(
      lp,
      old,
      jnp.asarray(advs),
      mask,
      clip_low=0.2,
      clip_high=0.28,
      dual_clip=c,
      aggregation="token-mean",
    )[0]
  )(logp)
  # Capped by the dual clip (3.5, 6.0) or clipped (0.5 below 1 - 0.2, 40
  # above 1 + 0.28 with a positive advantage): no gradient.
  np.testing.assert_array_equal(np.asarray(grad)[0] != 0, [0, 1, 1, 0, 0, 0])


def test_policy_loss_gradient_is_zero_off_the_mask():
  logp, old, advs, mask = batch(1)
  grad = jax.grad(
    lambda lp: losses.policy_loss(
      lp,
      jnp.asarray(old),
      jnp.asarray(advs),
      jnp.asarray(mask),
      clip_low=0.2,
      clip_high=0.28,
      dual_clip=3.0,
      aggregation="token-mean",
    )[0]
  )(jnp.asarray(logp))
  assert np.all(np.asarray(grad)[~mask] == 0)
  assert np.any(np.asarray(grad)[mask] != 0)


def test_kl_estimators():
  rng = np.random.default_rng(2)
  logp = rng.normal(-1, 0.3, 20).astype(np.float32)
  ref = rng.normal(-1, 0.3, 20).astype(np.float32)
  d = logp - ref
  np.testing.assert_allclose(losses.kl(logp, ref, "k1"), d, rtol=1e-6)
  np.testing.assert_allclose(losses.kl(logp, ref, "k2"), 0.5 * d**2, rtol=1e-5)
  np.testing.assert_allclose(
    losses.kl(logp, ref, "k3"), np.exp(-d) + d - 1, rtol=1e-4, atol=1e-7
  )
  assert np.all(np.asarray(losses.kl(logp, ref, "k3")) >= 0)


def test_clipped_value_loss_matches_numpy():
  rng = np.random.default_rng(3)
  v, old, ret = (rng.normal(size=(B, T)).astype(np.float32) for _ in range(3))
  mask = rng.random((B, T)) < 0.7
  clip = 0.5
  vc = old + np.clip(v - old, -clip, clip)
  l1, l2 = (v - ret) ** 2, (vc - ret) ** 2
  got, frac = losses.value_loss(
    jnp.asarray(v),
    jnp.asarray(old),
    jnp.asarray(ret),
    jnp.asarray(mask),
    clip=clip,
    aggregation="token-mean",
  )
  np.testing.assert_allclose(
    got, 0.5 * (np.maximum(l1, l2) * mask).sum() / mask.sum(), rtol=1e-5
  )
  np.testing.assert_allclose(frac, ((l2 > l1) & mask).sum() / mask.sum())


def test_token_logprobs_respect_temperature_and_allowed_tokens():
  rng = np.random.default_rng(4)
  logits = rng.normal(size=(3, 7)).astype(np.float32)
  tokens = np.asarray([1, 4, 2])
  allowed = np.asarray([0, 1, 1, 0, 1, 0, 0], bool)
  logp, ent = losses.token_logprobs(
    jnp.asarray(logits), jnp.asarray(tokens), 0.5, jnp.asarray(allowed)
  )
  z = np.where(allowed, logits / 0.5, -np.inf)
  ref = z - np.log(np.exp(z).sum(-1, keepdims=True))
  np.testing.assert_allclose(logp, ref[np.arange(3), tokens], rtol=1e-5)
  p = np.exp(ref)
  safe = np.where(allowed, ref, 0.0)
  np.testing.assert_allclose(ent, -(p * safe).sum(-1), rtol=1e-5)
