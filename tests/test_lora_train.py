"""Training LoRA adapters: only they change and have optimizer state, the
frozen weights are the reference (KL 0 at the start), the step compiles
once, a run starts from a run without adapters, and the warm start is
refused with them."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from configs import bandit
from starpo_jax import sharding, train
from starpo_jax.models import lora
from tests.helpers import traced_at_most_once


def config(**lora_settings):
  c = bandit.get_config("")
  c.rollout.env_groups, c.rollout.group_size = 2, 4
  c.algo.minibatches = 2
  c.algo.kl_coef = 0.01  # a reference policy, and the KL in the loss
  c.filter.value = 1.0
  c.sft.steps = 0
  c.train.eval_every = 0
  c.model.lora.rank = 4
  c.optim.lr = 1e-2
  for k, v in lora_settings.items():
    c.model.lora[k] = v
  return c


def leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_only_adapters_train_and_the_base_is_the_reference():
  setup = train.build(config())
  learner = train.make_learner(setup)
  assert learner.adapters
  state = train.init_state(setup, learner)
  assert state.reference is None  # no copy of the weights
  adapters, weights = state.policy.split(nnx.LoRAParam, ...)
  # Adam's two moments, each shaped like the adapters only.
  shapes = sorted(x.shape for x in jax.tree.leaves(adapters))
  moments = sorted(
    x.shape for x in jax.tree.leaves(state.policy_opt) if x.ndim > 0
  )
  assert moments == sorted(shapes * 2)
  before_w, before_a = leaves(weights), leaves(adapters)
  codec = sharding.replicate(setup.codec, setup.mesh)
  with traced_at_most_once(train, "make_step"):
    step = train.compile_step(setup, state, learner)
    state, first = step(state, codec)
    for _ in range(2):
      state, metrics = step(state, codec)
  adapters, weights = state.policy.split(nnx.LoRAParam, ...)
  # The frozen weights bit for bit; every adapter moved.
  for a, b in zip(before_w, leaves(weights), strict=True):
    np.testing.assert_array_equal(a, b)
  assert all(
    not np.array_equal(a, b)
    for a, b in zip(before_a, leaves(adapters), strict=True)
  )
  # New adapters (B = 0) play the frozen weights' policy: the rollout's KL
  # to the reference is 0 exactly, and only then.
  assert float(first["rollout/kl_to_reference"]) == 0.0
  assert float(metrics["rollout/kl_to_reference"]) != 0.0


def test_a_run_starts_from_a_run_without_adapters(tmp_path):
  full = bandit.get_config("")
  full.rollout.env_groups, full.rollout.group_size = 2, 4
  full.algo.minibatches = 2
  full.sft.steps, full.train.steps = 0, 1
  full.train.eval_every = 0
  train.run(full, str(tmp_path / "full"))
  c = config()
  c.train.init_from = str(tmp_path / "full")
  setup = train.build(c)
  learner = train.make_learner(setup)
  state = train.policy_from(
    train.init_state(setup, learner), setup, c.train.init_from
  )
  _, pure = train.checkpoint.load_policy(str(tmp_path / "full"))
  weights = nnx.to_pure_dict(state.policy.filter(lora.WEIGHTS))
  same = jax.tree.map(np.array_equal, weights, pure)
  assert all(jax.tree.leaves(same))
  assert len(jax.tree.leaves(state.policy.filter(nnx.LoRAParam))) == 14


def test_the_warm_start_is_refused_with_adapters():
  c = config()
  c.sft.steps = 5
  with pytest.raises(
    train.ConfigError, match=r"config\.model\.lora: the warm start"
  ):
    train.build(c)


def test_bad_adapter_settings_are_named_before_compiling():
  with pytest.raises(
    train.ConfigError, match=r"config\.model\.lora: targets=.ffn."
  ):
    train.build(config(targets="ffn"))
