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
from starpo_jax.algo import prefix as prefix_lib
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
from starpo_jax.models.shared import Shared

Objective = Callable[[Any, Batch], tuple[jax.Array, dict[str, jax.Array]]]
GradFn = Callable[[Any], tuple[tuple[jax.Array, dict[str, jax.Array]], Any]]


Share = Callable[[Batch], Shared | None]


def policy_objective(
  params: Any,
  policy_def: Any,
  batch: Batch,
  algo: AlgoConfig,
  dist: Distribution,
  share: Share = lambda batch: None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clipped policy loss - entropy bonus (+ KL to the reference), the
  log-probabilities under ``dist``, each row's shared prompt computed
  once per unit where ``share(batch)`` says so."""
  model = nnx.merge(policy_def, params)
  logp, ent = sequence_logprobs(
    model,
    batch.tokens,
    batch.positions,
    dist.temperature,
    dist.allowed,
    algo.logits_chunk,
    dist.context(batch.turns),
    share(batch),
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
  share: Share = lambda batch: None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The clipped value loss on the batch's returns (the critic sees what
  the policy saw: ``dist.context``; ``share`` as the policy's)."""
  v = sequence_values(
    nnx.merge(critic_def, params),
    batch.tokens,
    batch.positions,
    dist.context(batch.turns),
    share(batch),
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
  batch: Batch,
  keep: jax.Array,
  size: int,
  key: jax.Array,
  episodes: int,
  unit: int = 1,
) -> Batch:
  """The batch shuffled and cut into ``[B / size, size, ...]``.

  The shuffle is a permutation of the rollout's ``episodes`` in units of
  ``unit`` consecutive ones (rows follow their episode's place in it; a
  unit's rows stay together, in order), so a batch holding only the kept
  groups gets the same minibatches as the whole rollout would. Kept
  episodes move to the front, so minibatches with nothing to train on
  come last and are skipped.
  """
  b = keep.shape[0]
  rank = jnp.argsort(jax.random.permutation(key, episodes // unit))
  place = rank[batch.episode // unit] * unit + batch.episode % unit
  order = jnp.argsort(place)
  order = order[jnp.argsort(~keep[order], stable=True)]
  return jax.tree.map(
    lambda x: x[order].reshape(b // size, size, *x.shape[1:]), batch
  )


def _losses(
  spec: StepSpec, state: TrainState, dist: Distribution, share: Share
) -> tuple[Callable[..., Any], Callable[..., Any]]:
  """The policy's and the critic's objectives of (what they train, a
  minibatch). With adapters only they are differentiated; the frozen
  weights are closed over."""
  learner, algo = spec.learner, spec.algo
  frozen = trainable(learner, state.policy)[1]
  base = critic_base(learner, state.policy)
  policy_loss = lambda p, b: policy_objective(
    joined(p, frozen), learner.policy_def, b, algo, dist, share
  )
  critic_loss = lambda p, b: critic_objective(
    joined(p, base), learner.critic_def, b, algo, dist, share
  )
  return policy_loss, critic_loss


def sharing(
  spec: StepSpec, state: TrainState, codec: Codec, rows: int, length: int
) -> tuple[prefix_lib.Plan | None, int]:
  """How passes over ``rows`` rows of ``length`` tokens share their
  groups' prompts (``algo.share_prefix``; None: they do not), and the
  micro-batches they run in (``algo.micro_batch_tokens``), fixed for every
  length a pass may run at so that no unit straddles two."""
  algo = spec.algo
  micro = micro_batches(rows, length, algo.micro_batch_tokens)
  plan = prefix_lib.plan(
    algo.share_prefix,
    nnx.merge(spec.learner.policy_def, state.policy),
    codec,
    spec.rollout,
    prefix_lib.unit_of(spec.rollout.group_size, rows // micro),
    algo.length_buckets,
    spec.distribution(codec).window,
  )
  return plan, micro


def passes(
  plan: prefix_lib.Plan | None,
  tokens: jax.Array,
  positions: jax.Array,
  mask: jax.Array,
  buckets: int,
) -> tuple[jax.Array | None, tuple[int, ...], jax.Array, Callable[[int], int]]:
  """Where passes over the rows ``tokens [B, L]`` may run to read their
  tokens ``mask [B, G]`` marks at ``positions [B, G]``: each row's
  shared tokens under ``plan`` (None without one), the static lengths
  (``buckets`` of them; suffixes under ``plan``), the one they need, and
  the tokens a pass at each length reads."""
  context = tokens.shape[1]
  if plan is None:
    needed = needed_length(mask, positions)
    return None, bucket_lengths(context, buckets), needed, lambda n: n
  prefix = plan.lengths(tokens, positions, mask)
  needed = plan.needed(prefix, positions, mask)
  return prefix, plan.suffixes, needed, lambda n: plan.cut(context, n)


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
  shortest of ``bucket_lengths`` holding the batch's kept tokens, or with
  ``algo.share_prefix`` each group's prompt once and each row's own
  tokens at the shortest suffix that holds them (``algo.prefix``).

  Returns:
    The state with new parameters and optimizer states, and per-minibatch
    statistics ``[epochs, minibatches]`` (``live``: it had tokens to train
    on; ``skipped``: its update was not finite; ``length``: the tokens a
    row ran at, its own beyond the shared prompt where one is shared;
    ``prefix_tokens_saved``: tokens computed once per unit, not per row).
  """
  learner, algo = spec.learner, spec.algo
  size = spec.rollout.batch // algo.minibatches
  plan, micro = sharing(spec, state, codec, size, batch.tokens.shape[1])
  prefix, lengths, needed, cut = passes(
    plan, batch.tokens, batch.positions, batch.mask, algo.length_buckets
  )
  batch = batch.replace(prefix=prefix)
  part, frozen = trainable(learner, state.policy)
  losses = lambda n: _losses(
    spec,
    state,
    spec.distribution(codec),
    lambda mb: None if plan is None else plan.shared(mb.prefix, n),
  )

  def at(tokens: jax.Array, n: int):
    if plan is None:  # each length its own micro-batches
      micro_n = micro_batches(size, tokens.shape[1], algo.micro_batch_tokens)
    else:  # one count for all, that no unit straddles two
      micro_n = micro
    carry = (part, state.policy_opt, state.critic, state.critic_opt)
    batch_n = batch.replace(tokens=tokens)
    passes_n = (plan, micro_n)
    return _epochs(
      spec, carry, batch_n, keep, key, passes_n, losses(n), constrain
    )

  with jax.named_scope("update"):
    out, length = at_length(lengths, needed, at, batch.tokens, cut)
  (params, opt, c_params, c_opt), stats = out
  stats["length"] = jnp.broadcast_to(length, stats["live"].shape)
  policy = joined(params, frozen)
  return state.replace(
    policy=policy, policy_opt=opt, critic=c_params, critic_opt=c_opt
  ), stats


def _epochs(spec, carry, batch, keep, key, passes, losses, constrain):
  """``algo.epochs`` over shuffled minibatches of ``batch``, each trained
  in ``passes``' micro-batches, its units together under ``passes``'
  plan (``update``'s)."""
  algo, (plan, micro) = spec.algo, passes
  size = spec.rollout.batch // algo.minibatches
  unit = 1 if plan is None else plan.unit

  def train_minibatch(carry, mb: Batch):
    mb = constrain(mb)
    grads = lambda objective: batch_gradients(
      objective, mb, micro, algo.loss_agg
    )
    live = jnp.any(mb.mask)
    carry, stats = _minibatch_update(spec, carry, grads, losses, live)
    saved = 0.0 if plan is None else plan.saved(mb.prefix)
    return carry, dict(stats, prefix_tokens_saved=saved * live)

  def epoch(carry, k):
    mbs = minibatches(batch, keep, size, k, spec.rollout.batch, unit)
    return jax.lax.scan(train_minibatch, carry, mbs)

  return jax.lax.scan(epoch, carry, jax.random.split(key, algo.epochs))
