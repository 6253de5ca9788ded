"""The compiled steps (RL and warm start), each jitted with its state
donated and its shardings explicit, and the train state's abstract form
for compiling ahead of time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from starpo_jax import sharding
from starpo_jax.algo import sft
from starpo_jax.algo.spec import StepSpec
from starpo_jax.algo.state import CRITIC_OWN, Learner, TrainState, trainable
from starpo_jax.algo.step import make_step
from starpo_jax.run.assembly.setup import Setup, warm_start_replies
from starpo_jax.run.assembly.state import (
  abstract_model,
  keeps_reference,
  optimizer_shardings,
  sft_optimizer,
)


def abstract_state(setup: Setup, learner: Learner) -> TrainState:
  """``init_state``'s result as ``jax.ShapeDtypeStruct`` with shardings,
  allocating nothing (for ahead-of-time compilation)."""
  mesh = setup.mesh
  place = lambda shapes, shardings: jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
    shapes,
    shardings,
  )

  def model_and_opt(value_head, tx):
    _, abstract, shardings = abstract_model(setup, value_head)
    if value_head and learner.critic_shares_base:
      abstract, shardings = (
        abstract.filter(CRITIC_OWN),
        shardings.filter(CRITIC_OWN),
      )
    params = place(abstract, shardings)
    if value_head or not learner.adapters:
      return params, place(*optimizer_shardings(tx, params, shardings, mesh))
    part, _ = trainable(learner, params)
    part_shardings, _ = trainable(learner, shardings)
    return params, place(*optimizer_shardings(tx, part, part_shardings, mesh))

  policy, policy_opt = model_and_opt(False, learner.policy_tx)
  critic = critic_opt = None
  if learner.critic_def is not None:
    critic, critic_opt = model_and_opt(True, learner.critic_tx)
  everywhere = sharding.replicated(mesh)
  scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=everywhere)
  key = jax.eval_shape(lambda: jax.random.key(0))
  return TrainState(
    step=scalar,
    policy=policy,
    policy_opt=policy_opt,
    critic=critic,
    critic_opt=critic_opt,
    reference=policy if keeps_reference(setup, learner) else None,
    key=jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=everywhere),
    nonfinite=scalar,
  )


def _jit_step(fn, state: TrainState, mesh):
  """``fn(state, codec) -> (state, metrics)`` jitted with the state donated
  and explicit shardings (the state keeps its own, metrics replicated)."""
  state_sharding = jax.tree.map(lambda x: x.sharding, state)
  everywhere = sharding.replicated(mesh)
  return jax.jit(
    fn,
    donate_argnums=0,
    in_shardings=(state_sharding, everywhere),
    out_shardings=(state_sharding, everywhere),
  )


def step_spec(setup: Setup, learner: Learner) -> StepSpec:
  """The static pieces of the run's RL step."""
  return StepSpec(
    env=setup.env,
    rollout=setup.config.rollout,
    algo=setup.config.algo,
    filter=setup.config.filter,
    learner=learner,
    diagnostics=setup.config.diagnostics,
  )


def compile_step(setup: Setup, state: TrainState, learner: Learner):
  """The jitted RL step."""
  step = make_step(step_spec(setup, learner), setup.mesh)
  return _jit_step(step, state, setup.mesh)


def compile_sft_step(setup: Setup, state: TrainState, learner: Learner):
  """The jitted supervised warm-start step."""
  spec = sft.WarmStartSpec(
    env=setup.env,
    rollout=setup.config.rollout,
    sft=setup.config.sft,
    policy_def=learner.policy_def,
    tx=sft_optimizer(setup),
    replies=warm_start_replies(
      setup.tokenizer, setup.env, setup.config.rollout.enable_think
    ),
    logits_chunk=setup.config.algo.logits_chunk,
    share_prefix=setup.config.algo.share_prefix,
    length_buckets=setup.config.algo.length_buckets,
  )
  step = sft.make_sft_step(spec, setup.codec, setup.mesh)
  return _jit_step(step, state, setup.mesh)
