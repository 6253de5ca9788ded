"""Passes that compute a group's shared prompt once (``algo.share_prefix``,
``algo/prefix.py``) against the same passes over whole episodes: the
reference's log-probabilities, the critic's values, the update (GRPO and
GAE) and the warm start, on the same rollout; the suffix length at its
bound; what refuses to share and why; minibatches that keep a unit's rows
together; the tokens saved in the metrics.

The update runs one minibatch (its loss sums over all rows, so the order
in which sharing and not sharing shuffle rows does not matter) with SGD,
as in test_compaction."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from configs import sokoban
from starpo_jax.algo import prefix as prefix_lib
from starpo_jax.algo import step as step_lib
from starpo_jax.algo import update as update_lib
from starpo_jax.algo.batch import Batch
from starpo_jax.algo.logprobs import sequence_logprobs
from starpo_jax.models import presets, transformer
from starpo_jax.run import assembly
from starpo_jax.run.assembly import compiled
from tests.helpers import (
  assert_close_at_scale,
  assert_same_step,
  critic_with_opinions,
  sgd_learner,
)

GROUPS, GROUP_SIZE = 2, 3


def config(estimator: str):
  c = sokoban.get_config(None)
  c.algo.adv_estimator = estimator
  c.algo.minibatches = 1
  c.algo.kl_coef = 0.05  # a reference to score
  c.filter.value = 1.0
  c.rollout.env_groups, c.rollout.group_size = GROUPS, GROUP_SIZE
  c.rollout.max_turns = 2
  c.rollout.max_context = 256
  c.train.eval_every = 0
  return c


@functools.cache
def played(estimator: str):
  setup = assembly.build(config(estimator))
  learner = sgd_learner(setup)
  state = assembly.init_state(setup, learner)
  if estimator == "gae":
    critic_with_opinions(state)
  # A reference that differs from the policy, so the KL is not all 0.
  state = state.replace(
    reference=jax.tree.map(lambda x: x * 1.01, state.policy)
  )
  spec = assembly.step_spec(setup, learner)
  k_roll, _ = step_lib.step_keys(state)
  traj = jax.jit(lambda s, c, k: step_lib.collect(spec, s, c, k))(
    state, setup.codec, k_roll
  )
  returns = jnp.asarray([1, 0, 2, 0.5, -0.5, 3], jnp.float32)
  return setup, spec, state, traj.replace(episode_return=returns)


def train_on(estimator: str, share: str):
  setup, spec, state, traj = played(estimator)
  spec = dataclasses.replace(
    spec, algo=dataclasses.replace(spec.algo, share_prefix=share)
  )

  def fn(state, codec, traj, key):
    p = step_lib.prepare_batch(spec, state, codec, traj)
    new, stats = update_lib.update(
      spec, state, codec, p.batch, p.selection.row_keep, key
    )
    return p, new, stats

  _, k_perm = step_lib.step_keys(state)
  return jax.device_get(jax.jit(fn)(state, setup.codec, traj, k_perm))


def params(state) -> list:
  models = (state.policy, state.critic)
  return jax.tree.leaves([nnx.to_pure_dict(m) for m in models if m is not None])


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_sharing_scores_and_trains_as_whole_episodes_do(estimator):
  (p, new, stats) = train_on(estimator, "on")
  (want_p, want_new, want_stats) = train_on(estimator, "off")
  mask = np.asarray(want_p.batch.mask)
  for name in ("ref_logp", "values", "advantages"):
    got, want = np.asarray(getattr(p.batch, name)), getattr(want_p.batch, name)
    assert_close_at_scale(got * mask, np.asarray(want) * mask, err_msg=name)
  for name in ("pg_loss", "grad_norm", "kl_loss"):
    assert_close_at_scale(
      stats[name], want_stats[name], err_msg=name, terms=1.0
    )
  assert_same_step(params(played(estimator)[2]), params(new), params(want_new))
  # Each group's rows computed its prompt once: two of three rows saved
  # what their group shares, at least the system prompt.
  system = len(played(estimator)[0].codec.fragments.system)
  assert float(np.ravel(stats["prefix_tokens_saved"])[0]) >= (
    GROUPS * (GROUP_SIZE - 1) * system
  )
  assert float(np.ravel(want_stats["prefix_tokens_saved"])[0]) == 0.0


def test_the_warm_start_imitates_the_same_with_its_system_prompt_shared(
  monkeypatch,
):
  # SGD, as for the update (the warm start's own optimizer is Adam).
  monkeypatch.setattr(
    compiled, "sft_optimizer", lambda setup: optax.sgd(setup.config.sft.lr)
  )
  c = config("grpo")
  c.sft.steps, c.sft.episodes = 1, 6
  got = {}
  for share in ("on", "off"):
    c.algo.share_prefix = share
    setup = assembly.build(c)
    learner = sgd_learner(setup)
    state = assembly.init_state(setup, learner)
    # The step donates the state.
    before = jax.device_get(jax.tree.leaves(nnx.to_pure_dict(state.policy)))
    step = assembly.compile_sft_step(setup, state, learner)
    new, metrics = step(state, setup.codec)
    got[share] = (jax.tree.leaves(nnx.to_pure_dict(new.policy)), metrics)
  assert_same_step(before, got["on"][0], got["off"][0])
  assert_close_at_scale(
    got["on"][1]["sft/loss"], got["off"][1]["sft/loss"], err_msg="loss"
  )


def _plan_batch(shared: int, last: int):
  """Two units of two rows sharing ``shared`` tokens of a 4-slot prefix;
  row 0 scores one token at ``last``, the others one after the prompt."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 61, (4, 24))
  tokens[1, :shared] = tokens[0, :shared]
  tokens[3, :shared] = tokens[2, :shared]
  tokens[1, shared] = (tokens[0, shared] + 1) % 61
  positions = np.array([[shared + 1, last]] + [[shared + 1, shared + 1]] * 3)
  mask = np.array([[True, True]] + [[True, False]] * 3)
  return (
    jnp.asarray(tokens, jnp.int32),
    jnp.asarray(positions, jnp.int32),
    jnp.asarray(mask),
  )


@pytest.mark.parametrize("suffix", [12, 11])
def test_a_pass_at_the_suffix_its_tokens_need_reads_them_and_one_less_cannot(
  suffix,
):
  # The units share the whole prefix (4 tokens); row 0's last scored token
  # sits 11 tokens past it: it needs a suffix of 12 (its token read from
  # slot 4 + 11 of the tokens a pass cuts, its state from the own slot 10).
  tokens, positions, mask = _plan_batch(4, 15)
  plan = prefix_lib.Plan(unit=2, prefix=4, suffixes=(suffix,))
  lengths = plan.lengths(tokens, positions, mask)
  np.testing.assert_array_equal(lengths, [4, 4, 4, 4])
  assert int(plan.needed(lengths, positions, mask)) == 12
  cfg = presets.preset("tiny", vocab_size=61, num_layers=2)
  model = transformer.create(cfg, seed=3)
  cut = tokens[:, : plan.cut(tokens.shape[1], suffix)]
  shared = plan.shared(lengths, suffix)
  got = sequence_logprobs(model, cut, positions, 1.0, None, 8, shared=shared)
  want = sequence_logprobs(model, tokens, positions, 1.0, None, 8)
  same = np.allclose(np.asarray(got[0])[0, 1], np.asarray(want[0])[0, 1])
  assert same == (suffix == 12)


def test_only_a_full_context_and_groups_share():
  cfg = presets.preset("tiny", vocab_size=61)
  model = transformer.create(cfg)
  setup = played("grpo")[0]
  args = (model, setup.codec, setup.config.rollout)
  # The tiny model shares when asked to, not by default.
  assert prefix_lib.plan("on", *args, unit=3, buckets=2) is not None
  assert prefix_lib.plan("auto", *args, unit=3, buckets=2) is None
  assert prefix_lib.plan("off", *args, unit=3, buckets=2) is None
  big = cfg.replace(hidden_size=1024, intermediate_size=4096, num_layers=1)
  big = transformer.create(big)
  assert big.cfg.num_params() >= prefix_lib.AUTO_MIN_PARAMS
  assert prefix_lib.plan("auto", big, *args[1:], unit=3, buckets=2)
  assert prefix_lib.plan("auto", big, *args[1:], unit=1, buckets=2) is None
  assert (
    prefix_lib.plan("auto", big, *args[1:], unit=3, buckets=2, window=2) is None
  )
  with pytest.raises(ValueError, match=r"share_prefix='on'.*group_size 1"):
    prefix_lib.plan("on", *args, unit=1, buckets=2)
  with pytest.raises(ValueError, match=r"share_prefix='on'.*context window"):
    prefix_lib.plan("on", *args, unit=3, buckets=2, window=2)
  xla = transformer.create(cfg.replace(attention="xla"))
  assert prefix_lib.plan("on", xla, *args[1:], unit=3, buckets=2)


def test_suffix_lengths_are_spaced_up_to_the_span_then_a_whole_row():
  assert prefix_lib.suffix_lengths(514, 683, 4) == (192, 320, 448, 576, 683)
  assert prefix_lib.suffix_lengths(100, 120, 1) == (120,)
  assert prefix_lib.suffix_lengths(200, 300, 2) == (128, 256, 300)


def test_minibatches_keep_a_units_rows_together_in_order():
  b = 12
  batch = Batch(
    tokens=jnp.arange(b)[:, None] * jnp.ones((1, 3), jnp.int32),
    turns=jnp.zeros((b, 3), jnp.int32),
    positions=jnp.zeros((b, 1), jnp.int32),
    mask=jnp.ones((b, 1), bool),
    old_logp=jnp.zeros((b, 1)),
    ref_logp=jnp.zeros((b, 1)),
    advantages=jnp.zeros((b, 1)),
    returns=jnp.zeros((b, 1)),
    values=jnp.zeros((b, 1)),
    episode=jnp.arange(b, dtype=jnp.int32),
  )
  keep = jnp.ones(b, bool)
  for seed in range(5):
    mbs = update_lib.minibatches(
      batch, keep, 6, jax.random.key(seed), b, unit=3
    )
    rows = np.asarray(mbs.episode).reshape(-1, 3)
    assert (rows[:, 0] % 3 == 0).all() and (np.diff(rows, axis=1) == 1).all()
    assert sorted(np.asarray(mbs.episode).ravel()) == list(range(b))
