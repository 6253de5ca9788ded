"""The compiled training step: compiles once, trains, skips bad updates."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from configs import bandit
from starpo_jax import losses, train
from starpo_jax import step as step_lib


def small_config(**overrides):
  c = bandit.get_config(None)
  c.rollout.env_groups = 2
  c.rollout.group_size = 4
  c.algo.minibatches = 2
  c.filter.value = 1.0  # keep every group, so every minibatch trains
  c.train.eval_every = 0
  for key, value in overrides.items():
    section, name = key.split(".")
    c[section][name] = value
  return c


@functools.cache
def _compiled(penalty: float):
  setup = train.build(small_config(**{"rollout.format_penalty": penalty}))
  state, pdef, cdef, ptx, ctx = train.init_state(setup)
  return setup, train.compile_step(setup, state, pdef, cdef, ptx, ctx), pdef


def compiled(penalty: float):
  """The driver's own jitted step (explicit in and out shardings) and a
  fresh state: the step donates the one it is given."""
  setup, step, pdef = _compiled(penalty)
  return setup, train.init_state(setup)[0], step, pdef


def params_of(state):
  return jax.tree.map(np.asarray, nnx.to_pure_dict(state.policy))


def test_step_compiles_once_and_moves_the_parameters():
  setup, state, step, _ = compiled(-0.1)
  before = params_of(state)
  state, metrics = step(state, setup.codec)
  state, metrics = step(state, setup.codec)
  assert step._cache_size() == 1  # the second call reused the first's
  assert int(state.step) == 2
  after = params_of(state)
  changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), before, after)
  assert any(jax.tree.leaves(changed))
  metrics = jax.device_get(metrics)
  assert metrics["train/updates"] == 2  # two minibatches, both trained
  for name in (
    "train/pg_loss",
    "train/entropy",
    "train/grad_norm",
    "rollout/success",
    "rollout/in_group_reward_std",
    "filter/kept_ratio",
    "train/clip_frac_upper",
  ):
    assert np.isfinite(metrics[name]), name


def test_a_nonfinite_loss_skips_the_update_and_is_counted():
  # An infinite penalty makes the advantages NaN.
  setup, state, step, _ = compiled(float("-inf"))
  before = params_of(state)
  state, metrics = step(state, setup.codec)
  chex_equal = jax.tree.map(np.array_equal, before, params_of(state))
  assert all(jax.tree.leaves(chex_equal))
  metrics = jax.device_get(metrics)
  assert metrics["train/skipped_nonfinite"] == 2
  assert metrics["train/nonfinite_streak"] == 1
  state, metrics = step(state, setup.codec)
  assert jax.device_get(metrics)["train/nonfinite_streak"] == 2


def test_gradients_flow_only_through_loss_masked_tokens():
  setup, state, _, pdef = compiled(-0.1)
  rng = np.random.default_rng(0)
  b, length, g = 3, 48, 6
  tokens = jnp.asarray(rng.integers(0, setup.tokenizer.vocab_size, (b, length)))
  positions = jnp.asarray(np.sort(rng.choice(np.arange(1, length), (b, g)), 1))
  mask = jnp.asarray(rng.random((b, g)) < 0.5)
  old, adv = (
    jnp.asarray(rng.normal(size=(b, g)), jnp.float32) for _ in range(2)
  )

  def loss(params, old, adv):
    logp, _, _ = step_lib.sequence_logprobs(
      nnx.merge(pdef, params), tokens, positions, 1.0, setup.codec.allowed, 4
    )
    return losses.policy_loss(
      logp,
      old,
      adv,
      mask,
      clip_low=0.2,
      clip_high=0.28,
      dual_clip=3.0,
      aggregation="token-mean",
    )[0]

  grad = jax.jit(jax.grad(loss))
  noise = jnp.asarray(rng.normal(size=(b, g)) * 5, jnp.float32)
  base = grad(state.policy, old, adv)
  # Changing anything off the mask changes nothing...
  moved = grad(
    state.policy, jnp.where(mask, old, noise), jnp.where(mask, adv, noise)
  )
  assert all(
    jax.tree.leaves(
      jax.tree.map(lambda a, b: np.allclose(a, b, atol=1e-7), base, moved)
    )
  )
  # ...while changing a masked token's advantage does.
  moved = grad(state.policy, old, jnp.where(mask, adv + 1.0, adv))
  assert not all(jax.tree.leaves(jax.tree.map(np.allclose, base, moved)))


def test_generated_positions_pack_the_mask():
  mask = jnp.asarray([[0, 1, 1, 0, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 1]], bool)
  got = np.asarray(step_lib.generated_positions(mask, 3))
  np.testing.assert_array_equal(got, [[1, 2, 4], [0, 0, 0], [0, 4, 0]])
