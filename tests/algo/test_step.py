"""The compiled training step, phase by phase, on real rollouts of Sokoban
(tiny model, StarPO-S, GAE with a critic)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import sokoban
from reference import advantages as ref
from starpo_jax.algo import advantages as adv_lib
from starpo_jax.algo import batch as batch_lib
from starpo_jax.algo import diagnostics, logprobs, losses, periodic
from starpo_jax.algo import spec as spec_lib
from starpo_jax.algo import state as state_lib
from starpo_jax.algo import step as step_lib
from starpo_jax.algo import update as update_lib
from starpo_jax.run import assembly
from starpo_jax.run.assembly import compiled as compiled_steps
from tests.helpers import (
  F32_SUM_RTOL,
  assert_close_at_scale,
  assert_same_step,
  critic_with_opinions,
  sgd_learner,
  traced_at_most_once,
)


def configure(c, **overrides):
  for key, value in overrides.items():
    section, name = key.split(".")
    c[section][name] = value
  return c


def sokoban_config(**overrides):
  """Two groups of four short episodes; StarPO-S keeps one group. With the
  critic (GAE), the path with the most parts (the tiny configs' default is
  GRPO, which the learning test runs)."""
  c = sokoban.get_config(None)
  c.algo.adv_estimator = "gae"
  c.rollout.env_groups = 2
  c.rollout.group_size = 4
  c.rollout.max_turns = 3
  c.rollout.max_actions_per_traj = 6
  c.rollout.max_context = 192
  c.algo.minibatches = 2
  c.train.eval_every = 0
  return configure(c, **overrides)


@dataclasses.dataclass
class Real:
  """One real step taken phase by phase with the step's own functions."""

  setup: Any
  spec: spec_lib.StepSpec
  learner: state_lib.Learner
  state: state_lib.TrainState  # before the update
  prepared: batch_lib.Prepared
  updated: state_lib.TrainState
  stats: dict[str, Any]

  @property
  def batch(self) -> batch_lib.Batch:
    return self.prepared.batch

  def policy(self, params=None):
    return nnx.merge(self.learner.policy_def, params or self.state.policy)

  def objective(self, params, batch, algo=None):
    s = self.setup
    return update_lib.policy_objective(
      params,
      self.learner.policy_def,
      batch,
      algo or s.config.algo,
      self.spec.distribution(s.codec),
    )


@pytest.fixture(scope="module")
def real() -> Real:
  # Both groups held, the dropped one masked: what the filter removes is
  # still there to check (the compaction tests below compare the two).
  setup = assembly.build(sokoban_config(**{"filter.capacity": 2}))
  learner = assembly.make_learner(setup)
  state = assembly.init_state(setup, learner)
  critic_with_opinions(state)
  spec = assembly.step_spec(setup, learner)
  k_roll, k_perm = step_lib.step_keys(state)
  prepared = jax.jit(
    lambda state, codec, key: step_lib.prepare(spec, state, codec, key)
  )(state, setup.codec, k_roll)
  updated, stats = jax.jit(
    lambda state, codec, batch, keep, key: update_lib.update(
      spec, state, codec, batch, keep, key
    )
  )(state, setup.codec, prepared.batch, prepared.selection.row_keep, k_perm)
  return Real(
    setup, spec, learner, state, prepared, updated, jax.device_get(stats)
  )


@jax.jit
def _logprobs(model, tokens, positions, allowed):
  return logprobs.sequence_logprobs(model, tokens, positions, 1.0, allowed, 64)


def test_the_first_minibatch_reproduces_the_sampling_logprobs(real):
  # Before any update the training forward must give back exactly what
  # the rollout sampled: ratio 1, no KL, nothing clipped.
  b, mask = real.batch, np.asarray(real.prepared.held.mask)
  logp, _ = _logprobs(
    real.policy(), b.tokens, b.positions, real.setup.codec.allowed
  )
  assert mask.sum() > 20
  np.testing.assert_allclose(
    np.asarray(logp)[mask], np.asarray(b.old_logp)[mask], atol=3e-5
  )
  first = {k: v[0, 0] for k, v in real.stats.items()}
  assert first["live"]
  assert abs(first["approx_kl"]) < 1e-6
  for name in ("clip_frac", "clip_frac_upper", "clip_frac_lower"):
    assert first[name] == 0.0, name
  assert first["dual_clip_frac"] == 0.0


def _scramble(batch: batch_lib.Batch, rows: np.ndarray, seed: int):
  """The batch with every field of episodes ``rows`` replaced by noise."""
  rng = np.random.default_rng(seed)
  noisy = {}
  for field in dataclasses.fields(batch):
    x = getattr(batch, field.name)
    if field.name == "mask" or x is None:  # None: no shared prefixes
      noisy[field.name] = x
      continue
    x = np.array(x)
    if field.name == "tokens":
      noise = rng.integers(0, 200, x.shape)
    elif field.name == "positions":
      noise = rng.integers(1, x.max() + 1, x.shape)
    else:
      noise = rng.normal(0, 5, x.shape)
    x[rows] = noise[rows].astype(x.dtype)
    noisy[field.name] = jnp.asarray(x)
  return batch_lib.Batch(**noisy)


def test_filtered_out_groups_are_masked_and_give_no_gradient(real):
  keep = np.asarray(real.prepared.selection.keep)
  mask = np.asarray(real.batch.mask)
  assert keep.sum() == 4  # StarPO-S keeps one group of the two
  assert not mask[~keep].any()
  assert mask[keep].any()
  grad = jax.jit(jax.grad(lambda p, b: real.objective(p, b)[0]))
  base = grad(real.state.policy, real.batch)
  noisy = grad(real.state.policy, _scramble(real.batch, ~keep, 0))
  same = jax.tree.map(
    lambda a, b: np.allclose(a, b, rtol=0, atol=1e-7), base, noisy
  )
  assert all(jax.tree.leaves(same))
  # The same noise on a kept episode does change the gradient.
  kept = np.flatnonzero(keep)[:1]
  changed = grad(real.state.policy, _scramble(real.batch, kept, 0))
  moved = jax.tree.map(lambda a, b: not np.allclose(a, b), base, changed)
  assert any(jax.tree.leaves(moved))


def test_the_entropy_bonus_raises_entropy(real):
  algo = dataclasses.replace(real.setup.config.algo, entropy_coef=1.0)
  batch = real.batch.replace(advantages=jnp.zeros_like(real.batch.advantages))
  entropy = jax.jit(lambda p: real.objective(p, batch, algo)[1]["entropy"])
  grad = jax.jit(jax.grad(lambda p: real.objective(p, batch, algo)[0]))
  before = float(entropy(real.state.policy))
  stepped = jax.tree.map(
    lambda p, g: p - 0.05 * g, real.state.policy, grad(real.state.policy)
  )
  assert float(entropy(stepped)) > before + 1e-4


def test_gae_on_a_real_rollout_matches_numpy(real):
  algo, b = real.setup.config.algo, real.batch
  assert algo.adv_estimator == "gae" and algo.uses_critic
  rewards = np.asarray(real.prepared.held.rewards)
  values, mask = np.asarray(b.values), np.asarray(b.mask)
  assert np.abs(values[mask]).max() > 0  # the critic's own estimates
  raw = ref.gae(rewards, values, mask, algo.gamma, algo.lam)
  np.testing.assert_allclose(
    b.returns, np.where(mask, raw + values, 0), atol=1e-5
  )
  np.testing.assert_allclose(b.advantages, ref.whiten(raw, mask), atol=1e-4)


@pytest.mark.parametrize("name", ["gae", "bi_level_gae"])
def test_estimators_with_discounts_on_a_real_rollout_match_numpy(real, name):
  s = real.prepared.held
  mask = np.asarray(real.batch.mask)
  turn_end = np.asarray(s.turn_end) & mask
  assert turn_end.sum() >= mask.any(axis=1).sum()  # a turn end per episode
  settings = dataclasses.replace(
    real.setup.config.algo, gamma=0.9, lam=0.8, turn_gamma=0.7
  )
  inputs = adv_lib.Inputs(
    rewards=s.rewards,
    values=real.batch.values,
    mask=jnp.asarray(mask),
    turn_end=jnp.asarray(turn_end),
    scores=s.scores,
  )
  got, _ = adv_lib.compute(name, inputs, 2, settings)
  args = (np.asarray(s.rewards), np.asarray(real.batch.values), mask)
  if name == "gae":
    raw = ref.gae(*args, 0.9, 0.8)
  else:
    raw = ref.bi_level_gae(*args, turn_end, 0.9, 0.8, 0.7)
  np.testing.assert_allclose(got, ref.whiten(raw, mask), atol=1e-4)


def test_value_loss_and_explained_variance_match_numpy(real):
  b = real.batch
  mask = np.asarray(b.mask)
  ret, values = np.asarray(b.returns), np.asarray(b.values)
  loss, stats = jax.jit(
    lambda p: update_lib.critic_objective(
      p,
      real.learner.critic_def,
      b,
      real.setup.config.algo,
      real.spec.distribution(real.setup.codec),
    )
  )(real.state.critic)
  # At the rollout's own critic the new values are the old ones: no clip.
  # The tiny configs average per episode, then over episodes.
  assert real.setup.config.algo.loss_agg == "seq-mean-token-mean"
  per_token = np.where(mask, np.square(values - ret), 0.0)
  rows = mask.any(axis=1)
  per_seq = per_token.sum(1)[rows] / mask.sum(1)[rows]
  want = 0.5 * per_seq.mean()
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  assert float(stats["value_clip_frac"]) == 0.0
  # Untrained episodes often share one return; spread them to measure.
  ret = ret + np.random.default_rng(1).normal(size=(ret.shape[0], 1))
  got = diagnostics.explained_variance(
    jnp.asarray(ret, jnp.float32), b.values, b.mask
  )
  np.testing.assert_allclose(
    got, 1 - np.var((ret - values)[mask]) / np.var(ret[mask]), rtol=1e-4
  )


def test_the_update_steps_policy_and_critic_downhill(real):
  # The kept group is the one minibatch that trained, so the batch's
  # objectives are the minibatch's: a little of each update lowers them.
  def toward(old, new, eps=0.01):
    return jax.tree.map(lambda a, b: a + eps * (b - a), old, new)

  objectives = (
    (lambda p: real.objective(p, real.batch)[0], "policy"),
    (
      lambda p: update_lib.critic_objective(
        p,
        real.learner.critic_def,
        real.batch,
        real.setup.config.algo,
        real.spec.distribution(real.setup.codec),
      )[0],
      "critic",
    ),
  )
  for objective, name in objectives:
    old, new = getattr(real.state, name), getattr(real.updated, name)
    loss = jax.jit(objective)
    assert float(loss(toward(old, new))) < float(loss(old)), name
  assert np.isfinite(real.stats["critic_grad_norm"][0, 0])


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_give_the_whole_batchs_loss_and_gradient(
  real, aggregation
):
  # The batch holds the kept group and the dropped one: with 2 micro-batches
  # one may have nothing to train on (its weight is then 0).
  algo = dataclasses.replace(real.setup.config.algo, loss_agg=aggregation)

  def at_once(micro):
    fn = update_lib.batch_gradients(
      lambda p, b: real.objective(p, b, algo), real.batch, micro, aggregation
    )
    return jax.jit(fn)(real.state.policy)

  (want_loss, want_stats), want = at_once(1)
  assert float(want_loss) != 0.0
  # Token means in another order: to float32 rounding at the scale of
  # their terms (ratio * advantage; log-probability differences).
  mask = np.asarray(real.batch.mask)
  adv = np.abs(np.asarray(real.batch.advantages)[mask]).max()
  logp = np.abs(np.asarray(real.batch.old_logp)[mask]).max()
  for micro in (2, 8):
    (loss, stats), grads = at_once(micro)
    np.testing.assert_allclose(loss, want_loss, atol=F32_SUM_RTOL * adv)
    if aggregation == "token-mean":
      np.testing.assert_allclose(
        stats["approx_kl"], want_stats["approx_kl"], atol=F32_SUM_RTOL * logp
      )
    for got, ref_grad in zip(
      jax.tree.leaves(grads), jax.tree.leaves(want), strict=True
    ):
      scale = float(np.max(np.abs(ref_grad))) + 1e-12
      np.testing.assert_allclose(got, ref_grad, atol=1e-5 * scale, rtol=1e-4)


def test_micro_batch_count_follows_the_token_budget():
  assert update_lib.micro_batches(32, 1280, 0) == 1
  assert update_lib.micro_batches(32, 1280, 32 * 1280) == 1
  # One token under the whole minibatch: two halves.
  assert update_lib.micro_batches(32, 1280, 32 * 1280 - 1) == 2
  # 6 sequences fit in 8192 tokens; 4 a micro-batch is the largest that
  # divides 32.
  assert update_lib.micro_batches(32, 1280, 8192) == 8
  assert update_lib.micro_batches(32, 1280, 1280) == 32
  # One sequence is the least a micro-batch holds: one token under, refused.
  with pytest.raises(ValueError, match="micro_batch_tokens=1279"):
    update_lib.micro_batches(32, 1280, 1279)


def test_forward_passes_run_in_micro_batches_of_rows():
  seen = []

  def fn(tokens, positions):
    seen.append(tokens.shape)
    return jnp.sum(tokens, 1) * 10 + positions[:, 0], positions * 2

  tokens = jnp.arange(8 * 6).reshape(8, 6)
  positions = jnp.arange(8 * 3).reshape(8, 3)
  want = fn(tokens, positions)
  seen.clear()
  # 12 tokens hold 2 rows of 6: 4 micro-batches, in order.
  got = jax.jit(logprobs.in_micro_batches(fn, 12))(tokens, positions)
  assert seen == [(2, 6)]
  for g, w in zip(got, want, strict=True):
    np.testing.assert_array_equal(g, w)
  with pytest.raises(ValueError, match="micro_batch_tokens=5"):
    logprobs.in_micro_batches(fn, 5)(tokens, positions)


def test_scoring_within_a_token_budget_gives_the_same_values(real):
  # The critic's values of the held rows, one row at a time.
  tokens, held = real.batch.tokens, real.prepared.held
  budget = tokens.shape[1]
  algo = dataclasses.replace(real.spec.algo, micro_batch_tokens=budget)
  assert logprobs.micro_batches(tokens.shape[0], budget, budget) > 1

  def score(spec):
    fn = lambda state, codec: step_lib.score_models(
      spec, state, codec, tokens, real.batch.turns, held
    )
    return jax.jit(fn)(real.state, real.setup.codec).values

  want = score(real.spec)
  assert float(jnp.max(jnp.abs(want))) > 0.0
  got = score(dataclasses.replace(real.spec, algo=algo))
  assert_close_at_scale(got, want)


def test_a_token_budget_trains_the_same_step():
  """Micro-batches sum the same gradient in another order; with SGD
  (linear in the gradient, ``helpers.assert_same_step``) the step is the
  same to float32 rounding. Without the periodic diagnostics (none runs
  at step 1): half the compile."""

  def one_step(budget):
    setup = assembly.build(
      sokoban_config(
        **{
          "algo.micro_batch_tokens": budget,
          "diagnostics.collapse_every": 0,
          "diagnostics.gradients_every": 0,
        }
      )
    )
    learner = sgd_learner(setup)
    state = assembly.init_state(setup, learner)
    params = lambda s: [
      np.asarray(x)
      for x in jax.tree.leaves((params_of(s), nnx.to_pure_dict(s.critic)))
    ]
    before = params(state)
    step = assembly.compile_step(setup, state, learner)
    state, metrics = step(state, setup.codec)
    return before, params(state), jax.device_get(metrics)

  old, got, metrics = one_step(192)
  want_old, want, want_metrics = one_step(0)
  for a, b in zip(old, want_old, strict=True):
    np.testing.assert_array_equal(a, b)
  assert metrics["train/updates"] == want_metrics["train/updates"] == 1
  for name in ("train/pg_loss", "train/grad_norm"):
    assert_close_at_scale(metrics[name], want_metrics[name], err_msg=name)
  assert_same_step(old, got, want)


@functools.cache
def _driver_step():
  setup = assembly.build(sokoban_config())
  learner = assembly.make_learner(setup)
  state = assembly.init_state(setup, learner)
  # Every call of this step in the tests must reuse its one trace.
  with traced_at_most_once(compiled_steps, "make_step"):
    return setup, learner, assembly.compile_step(setup, state, learner)


def compiled():
  """The driver's own jitted step (explicit in and out shardings) and a
  fresh state: the step donates the one it is given."""
  setup, learner, step = _driver_step()
  return setup, assembly.init_state(setup, learner), step


def params_of(state):
  return jax.tree.map(np.asarray, nnx.to_pure_dict(state.policy))


def test_the_default_step_compiles_once_and_trains_only_kept_groups():
  setup, state, step = compiled()
  before = params_of(state)
  state, metrics = step(state, setup.codec)
  state, metrics = step(state, setup.codec)
  # (A second trace would have raised: the second call reused the first's.)
  assert int(state.step) == 2
  after = params_of(state)
  changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), before, after)
  assert any(jax.tree.leaves(changed))
  metrics = jax.device_get(metrics)
  # One group of four kept: one minibatch of the two has tokens to train.
  assert metrics["filter/kept_ratio"] == 0.5
  assert metrics["train/updates"] == 1
  for name in (
    "train/pg_loss",
    "train/entropy",
    "train/grad_norm",
    "train/value_loss",
    "train/critic_grad_norm",
    "train/explained_variance",
    "rollout/success",
    "rollout/in_group_reward_std",
    "train/clip_frac_upper",
  ):
    assert np.isfinite(metrics[name]), name
  assert "rollout/kl_to_reference" not in metrics  # no reference model


def test_a_nonfinite_loss_skips_the_update_and_is_counted():
  # A NaN parameter makes every logit, hence the loss, NaN.
  setup, state, step = compiled()
  pure = nnx.to_pure_dict(state.policy)
  pure["final_norm"]["scale"] = pure["final_norm"]["scale"].at[0].set(jnp.nan)
  nnx.replace_by_pure_dict(state.policy, pure)
  before = params_of(state)
  state, metrics = step(state, setup.codec)
  same = jax.tree.map(
    lambda a, b: np.array_equal(a, b, equal_nan=True), before, params_of(state)
  )
  assert all(jax.tree.leaves(same))
  metrics = jax.device_get(metrics)
  assert metrics["train/skipped_nonfinite"] == 1  # the one live minibatch
  assert metrics["train/updates"] == 0
  assert metrics["train/nonfinite_streak"] == 1
  state, metrics = step(state, setup.codec)
  assert jax.device_get(metrics)["train/nonfinite_streak"] == 2


def test_gradients_flow_only_through_loss_masked_tokens(real):
  rng = np.random.default_rng(0)
  b, length, g = 3, 48, 6
  allowed = real.setup.codec.allowed
  tokens = rng.integers(0, 200, (b, length))
  positions = np.stack(
    [np.sort(rng.choice(np.arange(1, length), g, replace=False)) for _ in "abc"]
  )
  # Generated tokens are ones the policy may emit.
  choices = rng.choice(np.flatnonzero(np.asarray(allowed)), positions.shape)
  np.put_along_axis(tokens, positions, choices, 1)
  tokens, positions = jnp.asarray(tokens), jnp.asarray(positions)
  mask = jnp.asarray(rng.random((b, g)) < 0.5)
  old, adv = (
    jnp.asarray(rng.normal(size=(b, g)), jnp.float32) for _ in range(2)
  )

  def loss(params, old, adv):
    logp, _ = logprobs.sequence_logprobs(
      real.policy(params), tokens, positions, 1.0, allowed, 4
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
  base = grad(real.state.policy, old, adv)
  # Changing anything off the mask changes nothing...
  moved = grad(
    real.state.policy, jnp.where(mask, old, noise), jnp.where(mask, adv, noise)
  )
  assert all(
    jax.tree.leaves(
      jax.tree.map(lambda a, b: np.allclose(a, b, atol=1e-7), base, moved)
    )
  )
  # ...while changing a masked token's advantage does.
  moved = grad(real.state.policy, old, jnp.where(mask, adv + 1.0, adv))
  assert not all(jax.tree.leaves(jax.tree.map(np.allclose, base, moved)))


def test_generated_positions_pack_the_mask():
  mask = jnp.asarray([[0, 1, 1, 0, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 1]], bool)
  got = np.asarray(logprobs.generated_positions(mask, 3))
  np.testing.assert_array_equal(got, [[1, 2, 4], [0, 0, 0], [0, 4, 0]])


@pytest.mark.parametrize(
  ("std", "buckets", "want"),
  [
    ([0.3, 0.1, 0.2], 3, [2, 0, 1]),
    ([0.5, 0.0, 0.0, 0.2, 0.9, 0.1, 0.4, 0.3], 3, [2, 0, 0, 1, 2, 0, 1, 1]),
    ([0.0, 0.0, 0.0, 0.0], 2, [0, 0, 1, 1]),  # ties: by group index
  ],
)
def test_reward_std_buckets(std, buckets, want):
  got = diagnostics.std_buckets(jnp.asarray(std), buckets)
  assert got.tolist() == want


def test_the_gradient_split_adds_up_to_the_objective_and_follows_the_filter(
  real,
):
  s = real.setup
  algo = dataclasses.replace(s.config.algo, entropy_coef=0.05)
  spec = dataclasses.replace(real.spec, algo=algo)
  dist = spec.distribution(s.codec)

  @jax.jit
  def part(weights):
    return jax.grad(
      lambda p: periodic.term_objective(
        p, real.learner.policy_def, real.batch, algo, dist, weights
      )[0]
    )(real.state.policy)

  parts = {n: part(jnp.asarray(w)) for n, w in periodic.TERMS.items()}
  whole = jax.jit(jax.grad(lambda p: real.objective(p, real.batch, algo)[0]))(
    real.state.policy
  )
  summed = jax.tree.map(lambda *g: sum(g), *parts.values())
  # Float32 sums in another order: each leaf to 5e-6 of its largest
  # entry (an embedding row summed from cancelling parts is off by 2e-7 of
  # 0.28 on some CPUs; with the tests' XLA flags, conftest.py, a layer's
  # leaf by 1.7e-6 of its largest entry).
  close = jax.tree.map(
    lambda a, b: np.allclose(a, b, rtol=1e-5, atol=5e-6 * np.abs(b).max()),
    summed,
    whole,
  )
  assert all(jax.tree.leaves(close))
  scored = real.prepared.held
  group_std = np.asarray(scored.scores).reshape(2, 4).std(axis=1, ddof=1)
  m = jax.jit(
    lambda: periodic.gradient_split(
      spec,
      real.state,
      s.codec,
      real.batch,
      jnp.asarray(group_std, jnp.float32),
      3,
    )
  )()
  norm = lambda g: float(
    np.sqrt(sum(np.sum(np.square(x)) for x in jax.tree.leaves(g)))
  )
  assert float(m["grads/task"]) == pytest.approx(norm(parts["task"]), rel=1e-5)
  assert float(m["grads/entropy"]) == pytest.approx(
    norm(parts["entropy"]), rel=1e-5
  )
  assert float(m["grads/entropy"]) > 0
  assert float(m["grads/kl"]) == 0.0  # no reference model
  # Two groups, so two buckets; the filter kept one group: its bucket's task
  # gradient is the whole task gradient, the other bucket's is zero.
  kept = int(np.flatnonzero(np.asarray(real.prepared.selection.keep_group))[0])
  kept_bucket = int(group_std[kept] > group_std[1 - kept]) + 1
  assert "grads/task_std_q3" not in m
  assert float(m[f"grads/task_std_q{kept_bucket}"]) == pytest.approx(
    float(m["grads/task"]), rel=1e-5
  )
  assert float(m[f"grads/task_std_q{3 - kept_bucket}"]) == 0.0
  assert float(m[f"grads/std_q{kept_bucket}"]) == pytest.approx(
    group_std[kept], rel=1e-5
  )


def test_turn_ends_are_each_replys_last_token_by_its_recorded_length(real):
  # Independent of turn ids: an episode's generated tokens, in order, are
  # its replies one after another, each as long as the rollout recorded.
  traj = real.prepared.traj
  got = np.asarray(step_lib.turn_ends(traj))
  mask = np.asarray(traj.loss_mask)
  lengths = np.asarray(traj.response_lengths)
  played = np.asarray(traj.turn_played)
  want = np.zeros_like(got)
  for i in range(mask.shape[0]):
    where = np.flatnonzero(mask[i])
    replies = lengths[i][played[i] & (lengths[i] > 0)]
    assert replies.sum() == len(where)
    want[i, where[np.cumsum(replies) - 1]] = True
  assert (want.sum(axis=1) >= 2).any()  # multi-turn episodes
  np.testing.assert_array_equal(got, want)
