"""Runs one training step on several meshes of 8 simulated CPU devices and
prints the metrics and parameter shard shapes as JSON (tests/test_sharding).

Run with XLA_FLAGS=--xla_force_host_platform_device_count=8.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from configs import bandit
from starpo_jax import sharding
from starpo_jax.algo import periodic
from starpo_jax.algo import step as step_lib
from starpo_jax.run import assembly, checkpoint

# One device, and all three axes at once (data, FSDP and tensor
# parallelism): each further mesh is a compile of about 30 s on 2 cores
# and covers nothing this one does not.
MESHES = [(1, 1, 1), (2, 2, 2)]
# The mesh again with every episode prefilling its own prompt (no
# rollout.share_prefix): the shared prefill, sharded, must equal it.
UNSHARED = (2, 2, 2)


def config():
  # GRPO with a reference policy, one minibatch: every metric is
  # measured before the update. (After one, meshes legitimately differ:
  # Adam's first step is +-lr on every coordinate, and the sign of a
  # gradient coordinate that is pure rounding noise depends on the
  # reduction order.) The entropy bonus keeps the gradient real. Half the
  # groups kept, gathered into a batch of one minibatch (8 of 16 episodes):
  # the compacted batch and its reference scores are sharded too.
  c = bandit.get_config("algo=grpo")
  c.algo.entropy_coef = 0.05
  c.algo.minibatches = 2
  c.filter.strategy, c.filter.value = "top_k", 0.5
  c.rollout.env_groups = 8
  c.rollout.group_size = 2
  c.model.num_layers = 1
  c.model.intermediate_size = 128
  return c


def gradient(setup, learner, state) -> np.ndarray:
  """The policy gradient of the step's objective on the step's own batch,
  before the optimizer sees it, flattened. Adam's first step turns every
  coordinate into +-lr, so coordinates whose gradient is rounding noise
  may take either sign on another mesh; the gradient itself must agree."""
  spec = assembly.step_spec(setup, learner)
  k_roll, _ = step_lib.step_keys(state)

  def grad(state, codec, key):
    p = step_lib.prepare(spec, state, codec, key)
    objective = lambda params: periodic.term_objective(
      params,
      learner.policy_def,
      p.batch,
      spec.algo,
      spec.distribution(codec),
      jnp.ones(3),
    )[0]
    return jax.grad(objective)(state.policy)

  g = jax.jit(sharding.traced_for(setup.mesh, grad))(state, setup.codec, k_roll)
  return np.concatenate(
    [np.ravel(x) for x in jax.tree.leaves(jax.device_get(g))]
  )


def main() -> None:
  assert len(jax.devices()) == 8, jax.devices()
  out = {}
  runs = [(shape, True) for shape in MESHES] + [(UNSHARED, False)]
  for shape, share in runs:
    c = config()
    c.rollout.share_prefix = share
    setup = assembly.build(c)
    mesh = sharding.make_mesh(shape, jax.devices()[: int(np.prod(shape))])
    setup = dataclasses.replace(setup, mesh=mesh)
    learner = assembly.make_learner(setup)
    state = assembly.init_state(setup, learner)
    # A LoRA run's base digest, of the weights as each mesh shards them.
    digest = checkpoint.digest(state.policy)
    # Before the step donates state; the unshared run is compared by its
    # metrics alone.
    grad = gradient(setup, learner, state) if share else np.zeros(0)
    step = assembly.compile_step(setup, state, learner)
    state, metrics = step(state, setup.codec)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    shards = {
      "q": state.policy["layers"]["attn"]["q"]
      .get_value()
      .sharding.shard_shape(
        state.policy["layers"]["attn"]["q"].get_value().shape
      ),
      "embed": state.policy["embed"]
      .get_value()
      .sharding.shard_shape(state.policy["embed"].get_value().shape),
      "mlp_up": state.policy["layers"]["mlp"]["up"]
      .get_value()
      .sharding.shard_shape(
        state.policy["layers"]["mlp"]["up"].get_value().shape
      ),
    }
    out[str(shape) + ("" if share else " unshared")] = {
      "metrics": metrics,
      "policy": np.concatenate(
        [np.ravel(x) for x in jax.tree.leaves(jax.device_get(state.policy))]
      ).tolist(),
      "grad": grad.tolist(),
      "shards": shards,
      "param_bytes": sharding.bytes_per_device(state.policy),
      "digest": digest,
    }
  json.dump(out, sys.stdout)


if __name__ == "__main__":
  main()
