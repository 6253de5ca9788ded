"""The step's periodic diagnostics, at the parameters that played the
rollout: the collapse diagnostics (``diagnostics.collapse``) and the
policy gradient taken apart (each loss term alone, and the task term of
each reward-spread bucket of groups).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from starpo_jax.agent import mixture
from starpo_jax.agent.codec import Codec
from starpo_jax.agent.rollout import context_needed
from starpo_jax.algo import diagnostics, filtering
from starpo_jax.algo.batch import Batch, Prepared
from starpo_jax.algo.config import AlgoConfig
from starpo_jax.algo.logprobs import (
  in_micro_batches,
  micro_batches,
  sequence_logprobs,
)
from starpo_jax.algo.spec import Distribution, StepSpec
from starpo_jax.algo.state import TrainState, joined, trainable
from starpo_jax.algo.update import batch_gradients, policy_objective

# Weights of (task, entropy bonus, KL loss) in ``term_objective``.
TERMS = {
  "task": (1.0, 0.0, 0.0),
  "entropy": (0.0, 1.0, 0.0),
  "kl": (0.0, 0.0, 1.0),
}


def term_objective(
  params: Any,
  policy_def: Any,
  batch: Batch,
  algo: AlgoConfig,
  dist: Distribution,
  weights: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """``policy_objective``'s terms weighted by ``weights`` ``[3]``: the task
  (clipped policy) loss, the entropy bonus ``-entropy_coef * H`` and the
  KL loss ``kl_coef * KL``. Weights of ones give the objective itself."""
  _, s = policy_objective(params, policy_def, batch, algo, dist)
  loss = (
    weights[0] * s["pg_loss"]
    - weights[1] * algo.entropy_coef * s["entropy"]
    + weights[2] * algo.kl_coef * s["kl_loss"]
  )
  return loss, {}


def gradient_split(
  spec: StepSpec,
  state: TrainState,
  codec: Codec,
  batch: Batch,
  group_std: jax.Array,
  buckets: int,
) -> dict[str, jax.Array]:
  """Norms of the policy gradient's parts on the whole batch (what the
  filter kept), at the parameters that played it: each term of the loss
  alone (``grads/task``, ``grads/entropy``, ``grads/kl``), and the task
  term of each reward-std bucket of groups alone (``grads/task_std_qK``,
  ``K = 1`` the lowest std; ``grads/std_qK`` its groups' mean std; a
  bucket with no kept token has norm 0). RAGEN-2's gradient analysis: the
  task gradient of low-spread groups is small, so there regularisers
  dominate the update. ``group_std [groups]`` covers every rollout group
  (of ``rollout.group_size`` episodes), the batch's rows some of them.
  """
  learner, algo, dist = spec.learner, spec.algo, spec.distribution(codec)
  group_size = spec.rollout.group_size
  b, length = batch.tokens.shape
  groups = group_std.shape[0]
  buckets = min(buckets, groups)
  bucket = diagnostics.std_buckets(group_std, buckets)
  of_episode = bucket[batch.episode // group_size][:, None]
  weights = [*TERMS.values()] + [TERMS["task"]] * buckets
  masks = [batch.mask] * len(TERMS) + [
    batch.mask & (of_episode == k) for k in range(buckets)
  ]
  # Never more at once than the update holds: a minibatch, or its micro-batch.
  per_minibatch = groups * group_size // algo.minibatches
  micro = (b // per_minibatch) * micro_batches(
    per_minibatch, length, algo.micro_batch_tokens
  )

  part, frozen = trainable(learner, state.policy)

  def norm(args):
    w, mask = args
    objective = lambda p, mb: term_objective(
      joined(p, frozen), learner.policy_def, mb, algo, dist, w
    )
    grad_fn = batch_gradients(
      objective, batch.replace(mask=mask), micro, algo.loss_agg
    )
    return optax.tree.norm(grad_fn(part)[1])

  norms = jax.lax.map(norm, (jnp.asarray(weights), jnp.stack(masks)))
  out = {f"grads/{name}": norms[i] for i, name in enumerate(TERMS)}
  for k in range(buckets):
    in_k = bucket == k
    out[f"grads/task_std_q{k + 1}"] = norms[len(TERMS) + k]
    out[f"grads/std_q{k + 1}"] = jnp.sum(jnp.where(in_k, group_std, 0.0)) / (
      jnp.maximum(jnp.sum(in_k), 1)
    )
  return out


def _collapse(spec, codec, p: Prepared, logp_fn, phase) -> dict:
  """The collapse diagnostics of the rollout ``p`` when ``phase`` is 0;
  of each part of a ``Mixture`` on its own (``collapse/{tag}/...``: the
  parts' prompts differ by environment, which says nothing of
  collapse)."""
  cfg, when = spec.rollout, phase == 0
  if not isinstance(spec.env, mixture.Mixture):
    context = context_needed(codec, cfg, 1)
    return diagnostics.collapse(
      logp_fn, p.traj, cfg.env_groups, cfg.max_new_tokens, context, when
    )
  out = {}
  rows = spec.env.rows(cfg.group_size)
  for (tag, start, stop), part, c in zip(
    rows, spec.env.parts, codec.parts, strict=True
  ):
    traj = mixture.slice_rows(p.traj, start, stop)
    found = diagnostics.collapse(
      logp_fn,
      traj,
      part.groups,
      cfg.max_new_tokens,
      context_needed(c, cfg, 1),
      when,
    )
    for k, v in found.items():
      section, name = k.split("/", 1)
      out[f"{section}/{tag}/{name}"] = v
  return out


def diagnose(
  spec: StepSpec, state: TrainState, codec: Codec, p: Prepared
) -> dict[str, jax.Array]:
  """The periodic diagnostics (``spec.diagnostics``) of the step after
  ``state.step``, at the parameters that played ``p``: the collapse
  diagnostics every ``collapse_every`` steps, the gradient split every
  ``gradients_every`` (``diagnostics.periodic``: zeros elsewhere)."""
  cfg, rollout_cfg = spec.diagnostics, spec.rollout
  out = {}
  number = state.step + 1
  if cfg.collapse_every:
    policy = nnx.merge(spec.learner.policy_def, state.policy)
    logp_fn = lambda tokens, positions: sequence_logprobs(
      policy,
      tokens,
      positions,
      rollout_cfg.temperature,
      codec.allowed,
      spec.algo.logits_chunk,
    )[0]
    # Each prompt's scoring within the update's token budget.
    logp_fn = in_micro_batches(logp_fn, spec.algo.micro_batch_tokens)
    out.update(_collapse(spec, codec, p, logp_fn, number % cfg.collapse_every))
  if cfg.gradients_every:
    sc = p.scored
    group_std = filtering.group_scores(
      "reward_std",
      sc.scores,
      sc.lengths,
      sc.episode_entropy,
      rollout_cfg.env_groups,
    )
    compute = lambda: gradient_split(
      spec, state, codec, p.batch, group_std, cfg.buckets
    )
    out.update(
      diagnostics.periodic(compute, number % cfg.gradients_every == 0, "grads")
    )
  return out
