"""The step trains only what the filter kept, at the length it needs:
compaction (the kept groups gathered into a smaller batch) and length
buckets give the same update as the masked, full-length step on the same
rollout (Sokoban, tiny model, GAE with a critic).

The optimizer is SGD: compaction and buckets promise the same losses and
gradients (float32 sums over the same terms in another order), and SGD's
step is linear in the gradient. Adam's first step, ``lr * g / (|g| +
eps)``, would turn rounding noise in a near-zero gradient element into a
step anywhere in ``[-lr, lr]``: what one CPU's kernels round differently
from another's (``tests/helpers.assert_same_step``)."""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import sokoban
from starpo_jax.algo import batch as batch_lib
from starpo_jax.algo import filtering
from starpo_jax.algo import step as step_lib
from starpo_jax.algo import update as update_lib
from starpo_jax.run import assembly
from tests.helpers import (
  assert_close_at_scale,
  assert_same_step,
  critic_with_opinions,
  sgd_learner,
)

GROUPS, GROUP_SIZE = 4, 2


def config():
  """Four groups of two; a minibatch is one group (four of them)."""
  c = sokoban.get_config(None)
  c.algo.adv_estimator = "gae"
  c.algo.minibatches = 4
  c.algo.length_buckets = 1
  c.rollout.env_groups, c.rollout.group_size = GROUPS, GROUP_SIZE
  c.rollout.max_turns = 3
  c.rollout.max_actions_per_traj = 6
  c.rollout.max_context = 384
  c.train.eval_every = 0
  return c


@functools.cache
def played():
  """One rollout, and the state that played it (critic with opinions)."""
  setup = assembly.build(config())
  learner = sgd_learner(setup)
  state = assembly.init_state(setup, learner)
  critic_with_opinions(state)
  spec = assembly.step_spec(setup, learner)
  k_roll, _ = step_lib.step_keys(state)
  traj = jax.jit(
    lambda state, codec, key: step_lib.collect(spec, state, codec, key)
  )(state, setup.codec, k_roll)
  # An untrained policy earns the same in every episode; these returns give
  # the groups reward spreads 0, 1.41, 0.71 and 2.12.
  returns = jnp.asarray([1, 1, 0, 2, 0.5, -0.5, 3, 0], jnp.float32)
  return setup, spec, state, traj.replace(episode_return=returns)


def train_on(filter_cfg, algo=None):
  """The step after the rollout: prepare_batch and update, jitted."""
  setup, spec, state, traj = played()
  spec = dataclasses.replace(spec, filter=filter_cfg, algo=algo or spec.algo)

  def fn(state, codec, traj, key):
    p = step_lib.prepare_batch(spec, state, codec, traj)
    new, stats = update_lib.update(
      spec, state, codec, p.batch, p.selection.row_keep, key
    )
    return p, new, stats

  _, k_perm = step_lib.step_keys(state)
  return jax.device_get(jax.jit(fn)(state, setup.codec, traj, k_perm))


def params(state) -> list:
  return jax.tree.leaves(
    (nnx.to_pure_dict(state.policy), nnx.to_pure_dict(state.critic))
  )


def assert_same_update(got, want, advantages=None):
  """The same step of the parameters (policy and critic), and the same
  loss and gradient norm in every minibatch that trained.

  The policy loss is a mean of ratio x advantage terms whose advantages
  cancel (a group's sum to about zero): it is held to the scale of its
  terms, the batch's ``advantages`` (by default ``want``'s), not to its
  own. On a 2-core AMD EPYC a loss of -3.6e-4 moved by 3e-8 between the
  two layouts, twice the tolerance at its own scale (1.4e-8).
  """
  (_, new, stats), (_, want_new, want_stats) = got, want
  if advantages is None:
    advantages = want[0].batch.advantages
  terms = float(np.max(np.abs(np.asarray(advantages))))
  live = np.asarray(stats["live"]).ravel()
  want_live = np.asarray(want_stats["live"]).ravel()
  assert live.sum() == want_live.sum() > 0
  for name in ("pg_loss", "grad_norm", "value_loss", "critic_grad_norm"):
    if name not in want_stats:  # no critic
      continue
    assert_close_at_scale(
      np.asarray(stats[name]).ravel()[live],
      np.asarray(want_stats[name]).ravel()[want_live],
      err_msg=name,
      terms=terms if name == "pg_loss" else 0.0,
    )
  assert_same_step(params(played()[2]), params(new), params(want_new))


# Which groups each rule keeps is checked against NumPy in test_filtering;
# compaction sees only the kept groups and the capacity. These cover a
# held batch of half the groups, of one group, one with a padding row
# (min_p keeps 2 groups in a capacity of 3), and the least spread kept.
FILTERS = {
  "top_k": dict(strategy="top_k", value=0.5),
  "top_k_abs": dict(strategy="top_k_abs", value=1),
  "min_p": dict(strategy="min_p", value=0.5, capacity=3),
  "lowest_std": dict(strategy="top_k", value=0.5, largest=False),
}


@pytest.mark.parametrize("name", FILTERS)
def test_the_compacted_step_equals_the_masked_step(name):
  cfg = filtering.FilterConfig(**FILTERS[name])
  masked = dataclasses.replace(cfg, capacity=GROUPS)
  got, want = train_on(cfg), train_on(masked)
  p, want_p = got[0], want[0]
  held = filtering.capacity(cfg, GROUPS)
  assert held < GROUPS
  assert p.batch.tokens.shape[0] == held * GROUP_SIZE
  assert want_p.batch.tokens.shape[0] == GROUPS * GROUP_SIZE
  np.testing.assert_array_equal(
    p.selection.keep_group, want_p.selection.keep_group
  )
  assert int(p.selection.over_capacity) == 0
  # Each held row is its episode of the whole rollout.
  rows = np.asarray(p.selection.rows)
  np.testing.assert_array_equal(p.batch.tokens, want_p.batch.tokens[rows])
  np.testing.assert_allclose(
    p.batch.advantages, want_p.batch.advantages[rows], atol=1e-5
  )
  assert_same_update(got, want)


def test_compacted_grpo_advantages_come_from_the_held_groups():
  setup = played()[0]
  grpo = dataclasses.replace(setup.config.algo, adv_estimator="grpo")
  cfg = filtering.FilterConfig(strategy="top_k", value=0.5)
  got = train_on(cfg, grpo)
  want = train_on(dataclasses.replace(cfg, capacity=GROUPS), grpo)
  rows = np.asarray(got[0].selection.rows)
  np.testing.assert_allclose(
    got[0].batch.advantages, want[0].batch.advantages[rows], atol=1e-5
  )
  assert np.abs(np.asarray(got[0].batch.advantages)).max() > 0.1
  assert_same_update(got, want)


def test_groups_beyond_the_capacity_are_dropped_least_preferred_first():
  # min_p with value 0 keeps every group; a capacity of one holds the
  # best: the same as keeping the top one.
  over = filtering.FilterConfig(strategy="min_p", value=0.0, capacity=1)
  top = filtering.FilterConfig(strategy="top_k_abs", value=1, capacity=GROUPS)
  got, want = train_on(over), train_on(top)
  assert int(got[0].selection.over_capacity) == GROUPS - 1
  assert int(want[0].selection.over_capacity) == 0
  np.testing.assert_array_equal(
    got[0].selection.keep_group, want[0].selection.keep_group
  )
  assert got[0].selection.keep_group.sum() == 1
  assert_same_update(got, want)


def test_a_filter_that_keeps_everything_holds_every_group():
  cfg = filtering.FilterConfig()
  assert filtering.capacity(cfg, GROUPS) == GROUPS
  p = train_on(cfg)[0]
  np.testing.assert_array_equal(p.selection.rows, np.arange(8))


@pytest.mark.parametrize(
  "kwargs, groups, want",
  [
    (dict(strategy="top_k", value=0.25), 8, 2),
    (dict(strategy="top_k", value=0.01), 8, 1),
    (dict(strategy="top_k_abs", value=3), 8, 3),
    (dict(strategy="top_k_abs", value=30), 8, 8),
    (dict(strategy="top_p", value=0.9), 8, 8),
    (dict(strategy="top_p", value=0.5), 8, 4),
    (dict(strategy="top_p", value=0.3), 8, 3),
    (dict(strategy="top_p", value=1.0), 8, 8),
    (dict(strategy="min_p", value=0.5), 8, 8),
    (dict(strategy="min_p", value=0.5, capacity=2), 8, 2),
    (dict(strategy="top_k", value=0.25, capacity=20), 8, 8),
  ],
)
def test_capacity(kwargs, groups, want):
  assert filtering.capacity(filtering.FilterConfig(**kwargs), groups) == want


def test_linear_top_p_never_keeps_more_than_its_capacity():
  # The bound the capacity rests on: the top k of any scores hold at
  # least k / n of their sum, so linear top_p stops by ceil(value * n).
  rng = np.random.default_rng(0)
  for n in (3, 8, 11):
    scores = np.abs(rng.standard_cauchy((100, n))) * (
      rng.random((100, n)) < 0.8
    )
    for value in (0.1, 0.3, 0.5, 0.75, 0.95):
      cfg = filtering.FilterConfig(strategy="top_p", value=value)
      kept = jax.vmap(lambda s, cfg=cfg: filtering.keep_groups(s, cfg))(
        jnp.asarray(scores, jnp.float32)
      )
      most = int(np.asarray(kept).sum(axis=1).max())
      assert 0 < most <= filtering.capacity(cfg, n), (n, value)


def test_capacity_rounds_up_to_whole_minibatches():
  spec = played()[1]
  spec = dataclasses.replace(
    spec, filter=filtering.FilterConfig(strategy="top_k_abs", value=3)
  )
  # Minibatches of 4 episodes (two groups of two): 3 groups become 4.
  algo = dataclasses.replace(spec.algo, minibatches=2)
  assert step_lib.held_groups(dataclasses.replace(spec, algo=algo)) == 4
  assert step_lib.held_groups(spec) == 3


def test_bucket_lengths():
  assert batch_lib.bucket_lengths(768, 4) == (256, 384, 640, 768)
  assert batch_lib.bucket_lengths(320, 4) == (128, 256, 320)
  assert batch_lib.bucket_lengths(2048, 4) == (512, 1024, 1536, 2048)
  assert batch_lib.bucket_lengths(384, 1) == (384,)


def test_the_bucketed_update_equals_the_full_length_one():
  setup = played()[0]
  cfg = filtering.FilterConfig(strategy="top_k", value=0.5)
  bucketed = dataclasses.replace(setup.config.algo, length_buckets=3)
  got, want = train_on(cfg, bucketed), train_on(cfg)
  length = np.asarray(got[2]["length"]).ravel()[0]
  assert length < setup.config.rollout.max_context  # a shorter bucket ran
  assert np.asarray(want[2]["length"]).ravel()[0] == 384
  assert_same_update(got, want)


def test_batches_needing_other_buckets_reuse_one_compile():
  setup, spec, state, traj = played()
  algo = dataclasses.replace(spec.algo, length_buckets=3)
  spec = dataclasses.replace(
    spec, algo=algo, filter=filtering.FilterConfig(strategy="top_k", value=0.5)
  )
  p = jax.jit(
    lambda state, codec, traj: step_lib.prepare_batch(spec, state, codec, traj)
  )(state, setup.codec, traj)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def update(state, codec, batch, keep, key):
    return update_lib.update(spec, state, codec, batch, keep, key)

  key = jax.random.key(0)
  keep = p.selection.row_keep
  _, stats = update(state, setup.codec, p.batch, keep, key)
  assert int(np.asarray(stats["length"]).ravel()[0]) > 128
  full = dataclasses.replace(
    spec, algo=dataclasses.replace(algo, length_buckets=1)
  )
  full_update = jax.jit(
    lambda state, codec, batch, keep, key: update_lib.update(
      full, state, codec, batch, keep, key
    )
  )
  # The same batch trained up to position 100 fits the shortest bucket.
  # Trained up to 128, the first token past it, it needs the next one: the
  # last trained token of one episode moved to 128 (an equivalence needs
  # no real rollout, only the same batch both ways).
  short = p.batch.mask & (p.batch.positions < 100)
  edge = p.batch.mask & (p.batch.positions <= 128)
  row = int(np.flatnonzero(np.asarray(edge).any(1))[0])
  last = int(np.flatnonzero(np.asarray(edge[row]))[-1])
  batches = {
    128: p.batch.replace(mask=short),
    256: p.batch.replace(
      mask=edge, positions=p.batch.positions.at[row, last].set(128)
    ),
  }
  for want_len, batch in batches.items():
    got, got_stats = update(state, setup.codec, batch, keep, key)
    assert int(np.asarray(got_stats["length"]).ravel()[0]) == want_len
    assert want_len < setup.config.rollout.max_context
    want = full_update(state, setup.codec, batch, keep, key)
    assert_same_update((None, got, got_stats), (None, *want), batch.advantages)


def test_the_needed_length_holds_the_last_trained_token():
  positions = jnp.asarray([[3, 4, 9], [5, 127, 128]])
  mask = jnp.asarray([[True, True, True], [True, True, False]])
  assert int(batch_lib.needed_length(mask, positions)) == 128
  assert int(batch_lib.needed_length(jnp.ones((2, 3), bool), positions)) == 129
