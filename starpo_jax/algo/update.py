"""Phase 5 of the step: the PPO-style update, epochs x minibatches (each
optionally in micro-batches of a token budget), of the policy and the
critic, with their objectives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from starpo_jax.agent.codec import Codec
from starpo_jax.algo import losses
from starpo_jax.algo.batch import (
  Batch,
  at_length,
  bucket_lengths,
  needed_length,
)
from starpo_jax.algo.config import AlgoConfig
from starpo_jax.algo.logprobs import (
  micro_batches,
  sequence_logprobs,
  sequence_values,
)
from starpo_jax.algo.spec import Distribution, StepSpec
from starpo_jax.algo.state import (
  TrainState,
  critic_base,
  joined,
  trainable,
)

Objective = Callable[[Any, Batch], tuple[jax.Array, dict[str, jax.Array]]]
GradFn = Callable[[Any], tuple[tuple[jax.Array, dict[str, jax.Array]], Any]]


def policy_objective(
  params: Any,
  policy_def: Any,
  batch: Batch,
  algo: AlgoConfig,
  dist: Distribution,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clipped policy loss - entropy bonus (+ KL to the reference), the
  log-probabilities under ``dist``."""
  model = nnx.merge(policy_def, params)
  logp, ent = sequence_logprobs(
    model,
    batch.tokens,
    batch.positions,
    dist.temperature,
    dist.allowed,
    algo.logits_chunk,
    dist.context(batch.turns),
  )
  m = batch.mask
  pg, stats = losses.policy_loss(
    logp,
    batch.old_logp,
    batch.advantages,
    m,
    clip_low=algo.clip_low,
    clip_high=algo.clip_high,
    dual_clip=algo.dual_clip,
    aggregation=algo.loss_agg,
  )
  entropy = losses.aggregate(ent, m, algo.loss_agg)
  loss = pg - algo.entropy_coef * entropy
  kl_loss = jnp.zeros(())
  if algo.uses_reference and not algo.kl_in_reward:
    kl = losses.kl(logp, batch.ref_logp, algo.kl_estimator)
    kl_loss = losses.aggregate(kl, m, algo.loss_agg)
    loss = loss + algo.kl_coef * kl_loss
  return loss, dict(stats, pg_loss=pg, entropy=entropy, kl_loss=kl_loss)


def critic_objective(
  params: Any,
  critic_def: Any,
  batch: Batch,
  algo: AlgoConfig,
  dist: Distribution,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The clipped value loss on the batch's returns (the critic sees what
  the policy saw: ``dist.context``)."""
  v = sequence_values(
    nnx.merge(critic_def, params),
    batch.tokens,
    batch.positions,
    dist.context(batch.turns),
  )
  loss, clip_frac = losses.value_loss(
    v,
    batch.values,
    batch.returns,
    batch.mask,
    clip=algo.value_clip,
    aggregation=algo.loss_agg,
  )
  return loss, {"value_loss": loss, "value_clip_frac": clip_frac}


def batch_gradients(
  objective: Objective, batch: Batch, micro: int, aggregation: str
) -> GradFn:
  """``params -> ((loss, stats), grads)`` of ``objective(params, batch)``.

  With ``micro > 1`` the batch is cut into ``micro`` equal micro-batches
  whose gradients are computed one after another and summed, each weighted
  by its share of the loss's normaliser (``losses.normaliser``): the same
  loss and gradient as the whole batch at once (to float32 rounding), with
  the activations of one micro-batch alive at a time. Statistics are
  averaged with the same weights (exact for token means).
  """
  grad = jax.value_and_grad(objective, has_aux=True)
  if micro == 1:
    return lambda params: grad(params, batch)

  def fn(params):
    parts = jax.tree.map(
      lambda x: x.reshape(micro, x.shape[0] // micro, *x.shape[1:]), batch
    )
    total = jnp.maximum(losses.normaliser(batch.mask, aggregation), 1.0)

    def add(acc, mb):
      w = losses.normaliser(mb.mask, aggregation) / total
      out = grad(params, mb)
      out = jax.tree.map(lambda x: w * x.astype(jnp.float32), out)
      return jax.tree.map(jnp.add, acc, out), None

    shapes = jax.eval_shape(grad, params, jax.tree.map(lambda x: x[0], parts))
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), shapes)
    out, _ = jax.lax.scan(add, zeros, parts)
    (loss, stats), grads = out
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    return (loss, stats), grads

  return fn


def apply_gradients(
  tx: optax.GradientTransformation,
  grad_fn: GradFn,
  params: Any,
  opt: Any,
  live: jax.Array,
) -> tuple[Any, Any, dict[str, jax.Array], jax.Array]:
  """One optimizer step along ``grad_fn(params) -> ((loss, stats), grads)``.

  A non-finite loss or gradient leaves parameters and optimizer state as
  they were; with nothing to train on (``live`` false) no work is done.

  Returns:
    New parameters, optimizer state, statistics (``grad_norm`` added) and
    whether the step was finite.
  """

  def step(params, opt):
    (loss, stats), grads = grad_fn(params)
    norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(norm)
    updates, new_opt = tx.update(grads, opt, params)
    new_params = optax.apply_updates(params, updates)
    pick = lambda a, b: jax.tree.map(lambda x, y: jnp.where(finite, x, y), a, b)
    stats = dict(stats, grad_norm=norm)
    return pick(new_params, params), pick(new_opt, opt), stats, finite

  def skip(params, opt):
    shapes = jax.eval_shape(step, params, opt)[2]
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
    return params, opt, zeros, jnp.ones((), bool)

  return jax.lax.cond(live, step, skip, params, opt)


def minibatches(
  batch: Batch, keep: jax.Array, size: int, key: jax.Array, episodes: int
) -> Batch:
  """The batch shuffled and cut into ``[B / size, size, ...]``.

  The shuffle is a permutation of the rollout's ``episodes`` (rows follow
  their episode's place in it), so a batch holding only the kept groups
  gets the same minibatches as the whole rollout would. Kept episodes move
  to the front, so minibatches with nothing to train on come last and are
  skipped.
  """
  b = keep.shape[0]
  rank = jnp.argsort(jax.random.permutation(key, episodes))
  order = jnp.argsort(rank[batch.episode])
  order = order[jnp.argsort(~keep[order], stable=True)]
  return jax.tree.map(
    lambda x: x[order].reshape(b // size, size, *x.shape[1:]), batch
  )


def _losses(
  spec: StepSpec, state: TrainState, dist: Distribution
) -> tuple[Callable[..., Any], Callable[..., Any]]:
  """The policy's and the critic's objectives of (what they train, a
  minibatch). With adapters only they are differentiated; the frozen
  weights are closed over."""
  learner, algo = spec.learner, spec.algo
  frozen = trainable(learner, state.policy)[1]
  shared = critic_base(learner, state.policy)
  policy_loss = lambda p, b: policy_objective(
    joined(p, frozen), learner.policy_def, b, algo, dist
  )
  critic_loss = lambda p, b: critic_objective(
    joined(p, shared), learner.critic_def, b, algo, dist
  )
  return policy_loss, critic_loss


def _minibatch_update(spec: StepSpec, carry, grads, losses, live):
  """One minibatch's policy (and critic) update; ``grads(objective)`` is
  the minibatch's gradient of ``objective``."""
  learner, (policy_loss, critic_loss) = spec.learner, losses
  params, opt, c_params, c_opt = carry
  params, opt, stats, finite = apply_gradients(
    learner.policy_tx, grads(policy_loss), params, opt, live
  )
  if spec.algo.uses_critic:
    c_params, c_opt, c_stats, c_finite = apply_gradients(
      learner.critic_tx, grads(critic_loss), c_params, c_opt, live
    )
    stats.update(c_stats, critic_grad_norm=c_stats.pop("grad_norm"))
    finite = finite & c_finite
  stats.update(live=live, skipped=live & ~finite)
  return (params, opt, c_params, c_opt), stats


def update(
  spec: StepSpec,
  state: TrainState,
  codec: Codec,
  batch: Batch,
  keep: jax.Array,
  key: jax.Array,
  constrain: Callable[[Any], Any] = lambda tree: tree,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """``algo.epochs`` x minibatches of clipped policy (and value) updates
  on ``batch``, whose rows ``keep`` train.

  A minibatch is ``rollout.batch / algo.minibatches`` rows (the batch may
  hold only some of the rollout's episodes). Every minibatch runs at the
  shortest of ``bucket_lengths`` holding the batch's kept tokens.

  Returns:
    The state with new parameters and optimizer states, and per-minibatch
    statistics ``[epochs, minibatches]`` (``live``: it had tokens to train
    on; ``skipped``: its update was not finite; ``length``: the sequence
    length it ran at).
  """
  learner, algo = spec.learner, spec.algo
  context = batch.tokens.shape[1]
  episodes = spec.rollout.batch
  size = episodes // algo.minibatches
  lengths = bucket_lengths(context, algo.length_buckets)
  part, frozen = trainable(learner, state.policy)
  losses = _losses(spec, state, spec.distribution(codec))

  def at(tokens: jax.Array):
    micro = micro_batches(size, tokens.shape[1], algo.micro_batch_tokens)

    def train_minibatch(carry, mb: Batch):
      mb = constrain(mb)
      grads = lambda objective: batch_gradients(
        objective, mb, micro, algo.loss_agg
      )
      live = jnp.any(mb.mask)
      return _minibatch_update(spec, carry, grads, losses, live)

    def epoch(carry, k):
      parts = minibatches(batch.replace(tokens=tokens), keep, size, k, episodes)
      return jax.lax.scan(train_minibatch, carry, parts)

    carry = (part, state.policy_opt, state.critic, state.critic_opt)
    return jax.lax.scan(epoch, carry, jax.random.split(key, algo.epochs))

  needed = needed_length(batch.mask, batch.positions)
  with jax.named_scope("update"):
    out, length = at_length(lengths, needed, at, batch.tokens)
  (params, opt, c_params, c_opt), stats = out
  stats["length"] = jnp.broadcast_to(length, stats["live"].shape)
  policy = joined(params, frozen)
  return state.replace(
    policy=policy, policy_opt=opt, critic=c_params, critic_opt=c_opt
  ), stats
