"""The PyTorch baseline of the benchmarks computes what the JAX step does:
same loss and gradients on the same batch, same advantages, and its two
generation loops agree with each other."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from benchmarks.compare import workload
from benchmarks.compare.pytorch import starpo as tb
from starpo_jax.algo import advantages, filtering, logprobs, losses


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  pair = workload.Pair("tiny", "smoke", str(tmp_path_factory.mktemp("pair")))
  pair.init_jax()
  pair.init_torch("cpu")
  return pair


def _batch(pair, seed=0):
  rng = np.random.default_rng(seed)
  b, length, gen = 3, 40, 12
  vocab = pair.setup.tokenizer.vocab_size
  tokens = rng.integers(0, vocab, (b, length))
  positions = np.sort(
    np.stack(
      [rng.choice(np.arange(1, length), gen, replace=False) for _ in range(b)]
    ),
    axis=1,
  )
  allowed = np.flatnonzero(pair.allowed)
  np.put_along_axis(tokens, positions, rng.choice(allowed, positions.shape), 1)
  mask = rng.random((b, gen)) < 0.8
  old_logp = -rng.uniform(0.5, 6.0, (b, gen))
  adv = rng.normal(size=(b, gen)) * mask
  return (
    tokens,
    positions,
    mask,
    old_logp.astype(np.float32),
    adv.astype(np.float32),
  )


def test_loss_and_gradient_norm_agree_with_the_jax_step(pair):
  tokens, positions, mask, old_logp, adv = _batch(pair)
  algo, cfg = pair.setup.config.algo, pair.torch_cfg
  allowed = pair.setup.codec.allowed

  def jax_loss(params):
    model = nnx.merge(pair.policy_def, params)
    logp, ent = logprobs.sequence_logprobs(
      model, jnp.asarray(tokens), jnp.asarray(positions), 1.0, allowed, 5
    )
    pg, _ = losses.policy_loss(
      logp,
      old_logp,
      adv,
      mask,
      clip_low=algo.clip_low,
      clip_high=algo.clip_high,
      dual_clip=algo.dual_clip,
      aggregation="token-mean",
    )
    entropy = losses.aggregate(ent, mask, "token-mean")
    return pg - algo.entropy_coef * entropy, logp

  (want, want_logp), grads = jax.value_and_grad(jax_loss, has_aux=True)(
    pair.state.policy
  )
  model = pair.torch_model
  model.zero_grad()
  logp, ent = tb.sequence_logprobs(
    model,
    torch.as_tensor(tokens),
    torch.ones(tokens.shape, dtype=torch.long),
    torch.as_tensor(positions),
    1.0,
    torch.as_tensor(pair.allowed),
  )
  m = torch.as_tensor(mask)
  loss = tb.policy_loss(
    logp,
    torch.as_tensor(old_logp),
    torch.as_tensor(adv),
    m,
    cfg.clip_low,
    cfg.clip_high,
    cfg.dual_clip,
  )
  loss = loss - cfg.entropy_coef * (ent * m).sum() / m.sum()
  loss.backward()
  np.testing.assert_allclose(
    logp.detach().numpy(), want_logp, rtol=1e-5, atol=1e-5
  )
  np.testing.assert_allclose(float(loss), float(want), rtol=1e-5, atol=1e-6)
  torch_norm = torch.sqrt(
    sum(p.grad.square().sum() for p in model.parameters() if p.grad is not None)
  )
  assert float(optax.tree.norm(grads)) > 0
  np.testing.assert_allclose(
    float(torch_norm), float(optax.tree.norm(grads)), rtol=1e-4
  )


@settings(max_examples=30, deadline=None)
@given(
  st.lists(
    st.sampled_from([-1.2, -0.1, 0.0, 0.9, 10.9, 11.7]),
    min_size=12,
    max_size=12,
  ),
  st.sampled_from([1, 2, 3, 4, 6]),
)
def test_grpo_advantages_agree_with_jax(scores, group_size):
  groups = len(scores) // group_size
  s = np.asarray(scores, np.float32)
  want = advantages.grpo(
    jnp.asarray(s), jnp.ones((len(s), 1), bool), groups, True
  )[:, 0]
  got = tb.grpo_advantages(torch.as_tensor(s), groups)
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(
  st.lists(
    st.sampled_from([-1.2, -0.1, 0.0, 0.9, 10.9]), min_size=16, max_size=16
  ),
  st.sampled_from([(8, 2, 0.25), (4, 4, 0.5), (2, 8, 0.5), (8, 2, 0.6)]),
)
def test_the_baselines_filter_keeps_the_groups_starpo_s_keeps(scores, shape):
  groups, size, fraction = shape
  # Groups whose spreads differ by float rounding alone (equal in exact
  # arithmetic, e.g. [0, .9, .9, -.1] and [-1.2, -1.2, -1.2, -.1]) may
  # rank either way in float32; the two implementations then disagree
  # about a tie, not about the rule.
  spreads = sorted(np.std(np.reshape(scores, (groups, size)), axis=1))
  assume(all(b - a > 1e-6 for a, b in itertools.pairwise(spreads)))
  cfg = tb.Config(
    env_groups=groups,
    group_size=size,
    max_turns=1,
    max_new_tokens=1,
    keep_fraction=fraction,
  )
  s = np.asarray(scores, np.float32)
  batch = {"score": torch.as_tensor(s), "row": torch.arange(len(s))}
  kept, count = tb.keep_groups(batch, cfg)
  jax_cfg = filtering.FilterConfig(strategy="top_k", value=fraction)
  std = filtering.group_scores(
    "reward_std", jnp.asarray(s), jnp.zeros(16), jnp.zeros(16), groups
  )
  want = np.flatnonzero(
    np.repeat(np.asarray(filtering.keep_groups(std, jax_cfg)), size)
  )
  assert count == len(want) // size
  np.testing.assert_array_equal(kept["row"].numpy(), want)


def test_static_cache_loop_generates_what_generate_does(pair):
  # Greedy decoding: both loops must pick the same tokens with the same
  # log-probabilities, turn after turn.
  import dataclasses

  cfg = dataclasses.replace(pair.torch_cfg, temperature=0.0)
  played = {}
  for kind in ("dynamic", "static"):
    loop = tb.Loop(
      pair.torch_model,
      pair.setup.tokenizer,
      pair.setup.env.spec,
      cfg,
      pair.allowed,
      kind=kind,
      seed=3,
    )
    played[kind] = loop.rollout()
  a, b = played["dynamic"].episodes, played["static"].episodes
  assert played["dynamic"].generated_tokens > 0
  for x, y in zip(a, b, strict=True):
    assert x.ids == y.ids
    assert x.mask == y.mask
    np.testing.assert_allclose(x.logp, y.logp, atol=1e-4)


def test_a_torch_iteration_updates_the_weights(pair):
  loop = pair.torch_loop("static")
  before = [p.detach().clone() for p in pair.torch_model.parameters()]
  stats = loop.iteration()
  assert np.isfinite(stats["loss"]) and stats["generated_tokens"] > 0
  after = list(pair.torch_model.parameters())
  assert any(not torch.equal(x, y) for x, y in zip(before, after, strict=True))


def test_the_loops_clock_times_each_part_inside_its_phase(pair):
  loop = pair.torch_loop("static")
  loop.iteration()
  seconds = dict(loop.clock.seconds)
  rollout = (
    "new levels",
    "render prompt",
    "prefill",
    "decode: forward",
    "decode: sample",
    "decode: writes, stops",
    "parse",
    "environment",
  )
  assert set(seconds) == {
    "collect",
    "batch",
    "select",
    "advantages",
    "update",
  }.union(rollout)
  assert all(s > 0 for s in seconds.values()), seconds
  # The rollout's parts lie inside the collect, and hold most of it.
  parts = sum(seconds[p] for p in rollout)
  assert 0.5 * seconds["collect"] < parts <= seconds["collect"]
