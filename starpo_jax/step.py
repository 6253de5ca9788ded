"""The one compiled training step, in named phases:

  collect -> score (rewards, values, reference) -> select (StarPO-S filter)
  -> make_batch (advantages) -> update (epochs x minibatches) -> metrics

  step = make_step(env=..., rollout_cfg=..., algo=..., filter_cfg=...,
                   learner=...)        # static pieces closed over
  step = jax.jit(step, donate_argnums=0)
  state, metrics = step(state, codec)  # codec: the text tables

Each phase is a module-level function over typed structs, so tests call the
same code the step runs. Parameters live in the ``TrainState`` (an
argument), never in the closure. The RNG of step ``n`` is
``fold_in(state.key, n)``, so a resumed run replays exactly the steps an
uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from envs import Env
from starpo_jax import advantages as adv_lib
from starpo_jax import diagnostics, filtering, losses, sharding
from starpo_jax.rollout import (
  RolloutConfig,
  Trajectory,
  context_needed,
  rollout,
)
from starpo_jax.text import Codec


@dataclasses.dataclass(frozen=True)
class AlgoConfig:
  """The update rule (RAGEN / verl defaults where they have them)."""

  adv_estimator: str = "gae"
  gamma: float = 1.0
  lam: float = 1.0
  turn_gamma: float = 0.95  # bi-level GAE's turn-level discount
  norm_adv_by_std: bool = True  # GRPO; False is Dr.GRPO
  use_turn_scores: bool = False
  clip_low: float = 0.2
  clip_high: float = 0.28
  dual_clip: float = 3.0
  entropy_coef: float = 0.001
  loss_agg: str = "token-mean"
  kl_coef: float = 0.0
  kl_estimator: str = "k3"
  kl_in_reward: bool = False
  value_clip: float = 0.5
  epochs: int = 1
  minibatches: int = 4
  # Tokens a forward and backward pass may hold at once: each minibatch is
  # cut into as many micro-batches as that needs, their gradients summed
  # (the same update, less memory). 0: the whole minibatch at once.
  micro_batch_tokens: int = 0
  logits_chunk: int = 512  # sequence chunk for log-probabilities

  def __post_init__(self) -> None:
    for name, known in (
      ("adv_estimator", tuple(adv_lib.ESTIMATORS)),
      ("loss_agg", losses.AGGREGATIONS),
      ("kl_estimator", losses.KL_ESTIMATORS),
    ):
      if getattr(self, name) not in known:
        raise ValueError(
          f"algo: {name}={getattr(self, name)!r}; expected one of {known}"
        )
    for name in ("epochs", "minibatches", "logits_chunk"):
      if getattr(self, name) < 1:
        raise ValueError(f"algo: {name} must be >= 1")
    if self.micro_batch_tokens < 0:
      raise ValueError("algo: micro_batch_tokens must be >= 0 (0: no limit)")

  @property
  def uses_critic(self) -> bool:
    return self.adv_estimator in adv_lib.NEEDS_CRITIC

  @property
  def uses_reference(self) -> bool:
    return self.kl_coef > 0


@struct.dataclass
class TrainState:
  step: jax.Array  # [] int32
  policy: Any  # nnx.State of the policy's parameters
  policy_opt: Any
  critic: Any  # nnx.State, or None without a critic
  critic_opt: Any
  reference: Any  # nnx.State of the frozen reference, or None
  key: jax.Array
  nonfinite: jax.Array  # [] int32 consecutive steps with a skipped update


@dataclasses.dataclass(frozen=True)
class Learner:
  """The models' graph definitions and their optimizers (static)."""

  policy_def: Any
  policy_tx: optax.GradientTransformation
  critic_def: Any = None  # None without a critic
  critic_tx: optax.GradientTransformation | None = None


@struct.dataclass
class Scored:
  """A rollout on its generated tokens, packed to the front: ``[B, G]``."""

  positions: jax.Array  # [B, G] int32 where each token sits in the episode
  mask: jax.Array  # [B, G] bool: a generated token
  old_logp: jax.Array  # [B, G] sampling log-probabilities
  entropy: jax.Array  # [B, G] entropy of each sampling distribution
  rewards: jax.Array  # [B, G] token rewards (a KL penalty included)
  turn_end: jax.Array  # [B, G] bool: a turn's last token
  ref_logp: jax.Array  # [B, G] reference log-probabilities (0 without)
  kl: jax.Array  # [B, G] KL(sampling policy || reference) estimate
  values: jax.Array  # [B, G] the critic's values (0 without a critic)

  @property
  def scores(self) -> jax.Array:
    """[B] each episode's summed reward."""
    return jnp.sum(self.rewards, axis=1)

  @property
  def lengths(self) -> jax.Array:
    """[B] generated tokens per episode."""
    return jnp.sum(self.mask, axis=1)

  @property
  def episode_entropy(self) -> jax.Array:
    """[B] mean sampling entropy per episode."""
    m = self.mask.astype(jnp.float32)
    return jnp.sum(self.entropy * m, 1) / jnp.maximum(jnp.sum(m, 1), 1)


@struct.dataclass
class Selection:
  """Which rollout groups the update trains on (StarPO-S)."""

  group_scores: jax.Array  # [groups] the filter metric
  keep_group: jax.Array  # [groups] bool
  keep: jax.Array  # [B] bool, per episode

  @property
  def kept_fraction(self) -> jax.Array:
    return jnp.mean(self.keep_group.astype(jnp.float32))


@struct.dataclass
class Batch:
  """What the update trains on; ``[B, G]`` unless noted."""

  tokens: jax.Array  # [B, L] whole episodes
  positions: jax.Array  # [B, G] where the generated tokens are
  mask: jax.Array  # [B, G] bool: generated and kept by the filter
  old_logp: jax.Array
  ref_logp: jax.Array
  advantages: jax.Array
  returns: jax.Array  # the critic's targets (0 without a critic)
  values: jax.Array  # the critic's values at rollout time


def generated_positions(mask: jax.Array, size: int) -> jax.Array:
  """Positions of generated tokens, packed: ``[B, L]`` bool -> ``[B, G]``.

  Unused slots hold position 0 (which is never a generated token).
  """
  length = mask.shape[1]
  idx = jnp.where(mask, jnp.cumsum(mask, axis=1) - 1, size)
  rows = jnp.arange(mask.shape[0])[:, None]
  out = jnp.zeros((mask.shape[0], size), jnp.int32)
  return out.at[rows, idx].set(
    jnp.broadcast_to(jnp.arange(length), mask.shape), mode="drop"
  )


def pack_generated(traj: Trajectory, size: int) -> tuple[jax.Array, jax.Array]:
  """Where an episode's generated tokens are, packed to the front:
  positions ``[B, size]`` int32 and which slots hold one, ``[B, size]``."""
  positions = generated_positions(traj.loss_mask, size)
  count = jnp.sum(traj.loss_mask, 1)[:, None]
  return positions, jnp.arange(size) < count


def _before_each(
  model: Any, tokens: jax.Array, positions: jax.Array
) -> jax.Array:
  """Hidden states ``[B, G, D]`` that predict the tokens at ``positions``:
  the token at position p is predicted from the hidden state at p - 1."""
  h, _ = model.hidden(tokens)
  before = jnp.maximum(positions - 1, 0)
  return jnp.take_along_axis(h, before[..., None], axis=1)


def sequence_logprobs(
  model: Any,
  tokens: jax.Array,
  positions: jax.Array,
  temperature: float,
  allowed: jax.Array | None,
  chunk: int,
) -> tuple[jax.Array, jax.Array]:
  """Log-probabilities and entropies of the generated tokens.

  The backbone runs over the whole sequence; logits are formed only for
  the generated tokens (``positions``), ``chunk`` at a time under
  rematerialisation, so a large vocabulary never needs ``[B, L, V]``.

  Args:
    tokens: ``[B, L]``.
    positions: ``[B, G]`` where the generated tokens are.

  Returns:
    ``logp`` and ``entropy``, ``[B, G]``.
  """
  h_prev = _before_each(model, tokens, positions)
  targets = jnp.take_along_axis(tokens, positions, axis=1)
  b, g, d = h_prev.shape
  chunk = min(chunk, g)
  pad = -g % chunk
  hp = jnp.pad(h_prev, ((0, 0), (0, pad), (0, 0)))
  tp = jnp.pad(targets, ((0, 0), (0, pad)))
  n = hp.shape[1] // chunk

  @jax.checkpoint
  def one(hc, tc):
    return losses.token_logprobs(model.logits(hc), tc, temperature, allowed)

  hc = hp.reshape(b, n, chunk, d).swapaxes(0, 1)
  tc = tp.reshape(b, n, chunk).swapaxes(0, 1)
  logp, ent = jax.lax.map(lambda xs: one(*xs), (hc, tc))
  unchunk = lambda x: x.swapaxes(0, 1).reshape(b, -1)[:, :g]
  return unchunk(logp), unchunk(ent)


def sequence_values(
  critic: Any, tokens: jax.Array, positions: jax.Array
) -> jax.Array:
  """The critic's value ``[B, G]`` of the state before each generated
  token (``tokens [B, L]``, ``positions [B, G]``)."""
  return critic.values(_before_each(critic, tokens, positions))


def token_rewards(traj: Trajectory, use_turn_scores: bool) -> jax.Array:
  """Rewards ``[B, L]`` on generated tokens: per turn, or the episode's sum
  on its last generated token (RAGEN's two modes)."""
  if use_turn_scores:
    return traj.rewards
  mask = traj.loss_mask
  last = mask.shape[1] - 1 - jnp.argmax(mask[:, ::-1], axis=1)
  rows = jnp.arange(mask.shape[0])
  out = jnp.zeros(mask.shape, jnp.float32)
  has = jnp.any(mask, axis=1)
  return out.at[rows, last].set(jnp.where(has, traj.episode_return, 0.0))


def turn_ends(traj: Trajectory) -> jax.Array:
  """[B, L] bool: the last generated token of each turn."""
  mask = traj.loss_mask
  nxt_mask = jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], 1)
  nxt_turn = jnp.concatenate(
    [traj.turn_ids[:, 1:], jnp.full_like(traj.turn_ids[:, :1], -1)], 1
  )
  return mask & ~(nxt_mask & (nxt_turn == traj.turn_ids))


# ---------------------------------------------------------------------------
# Phase 1: collect


def collect(
  learner: Learner,
  state: TrainState,
  codec: Codec,
  env: Env,
  cfg: RolloutConfig,
  key: jax.Array,
  constrain: Callable[[Any], Any] = lambda tree: tree,
) -> Trajectory:
  """Plays ``cfg.batch`` episodes with the current policy (no gradient)."""
  policy = nnx.merge(learner.policy_def, state.policy)
  return jax.lax.stop_gradient(rollout(policy, codec, env, cfg, key, constrain))


# ---------------------------------------------------------------------------
# Phase 2: score


def score(
  learner: Learner,
  state: TrainState,
  traj: Trajectory,
  codec: Codec,
  cfg: RolloutConfig,
  algo: AlgoConfig,
) -> Scored:
  """Token rewards, the reference's log-probabilities and the critic's
  values on the generated tokens."""
  positions, mask = pack_generated(traj, cfg.max_generated)
  take = lambda x: jnp.take_along_axis(x, positions, axis=1)
  old_logp = take(traj.logprobs)
  rewards = take(token_rewards(traj, algo.use_turn_scores))
  chunk = algo.logits_chunk
  ref_logp = jnp.zeros_like(old_logp)
  if algo.uses_reference:
    reference = nnx.merge(learner.policy_def, state.reference)
    ref_logp, _ = sequence_logprobs(
      reference, traj.tokens, positions, cfg.temperature, codec.allowed, chunk
    )
    ref_logp = jax.lax.stop_gradient(ref_logp)
  kl = losses.kl(old_logp, ref_logp, algo.kl_estimator) * mask
  if algo.uses_reference and algo.kl_in_reward:
    rewards = rewards - algo.kl_coef * kl
  values = jnp.zeros_like(old_logp)
  if algo.uses_critic:
    critic = nnx.merge(learner.critic_def, state.critic)
    values = sequence_values(critic, traj.tokens, positions)
    values = jax.lax.stop_gradient(values) * mask
  return Scored(
    positions=positions,
    mask=mask,
    old_logp=old_logp,
    entropy=take(traj.entropy),
    rewards=rewards,
    turn_end=take(turn_ends(traj)) & mask,
    ref_logp=ref_logp,
    kl=kl,
    values=values,
  )


# ---------------------------------------------------------------------------
# Phase 3: select


def select(
  scored: Scored, cfg: filtering.FilterConfig, groups: int
) -> Selection:
  """StarPO-S: whole groups kept or masked, never sliced."""
  group_scores = filtering.group_scores(
    cfg.metric, scored.scores, scored.lengths, scored.episode_entropy, groups
  )
  keep_group = filtering.keep_groups(group_scores, cfg)
  keep = jnp.repeat(keep_group, scored.mask.shape[0] // groups)
  return Selection(group_scores=group_scores, keep_group=keep_group, keep=keep)


# ---------------------------------------------------------------------------
# Phase 4: advantages


def make_batch(
  traj: Trajectory,
  scored: Scored,
  selection: Selection,
  algo: AlgoConfig,
  filter_cfg: filtering.FilterConfig,
  groups: int,
) -> Batch:
  """Advantages over the kept episodes, and everything the update reads."""
  train_mask = scored.mask & selection.keep[:, None]
  advantages, returns = adv_lib.compute(
    algo.adv_estimator,
    adv_lib.Inputs(
      rewards=scored.rewards,
      values=scored.values,
      mask=train_mask,
      turn_end=scored.turn_end & train_mask,
      scores=scored.scores,
    ),
    groups,
    algo,
  )
  scale = filtering.loss_scale(selection.kept_fraction, filter_cfg)
  return Batch(
    tokens=traj.tokens,
    positions=scored.positions,
    mask=train_mask,
    old_logp=scored.old_logp,
    ref_logp=scored.ref_logp,
    advantages=advantages * scale,
    returns=returns,
    values=scored.values,
  )


# ---------------------------------------------------------------------------
# Phase 5: update


def policy_objective(
  params: Any,
  policy_def: Any,
  batch: Batch,
  algo: AlgoConfig,
  temperature: float,
  allowed: jax.Array | None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clipped policy loss - entropy bonus (+ KL to the reference)."""
  model = nnx.merge(policy_def, params)
  logp, ent = sequence_logprobs(
    model,
    batch.tokens,
    batch.positions,
    temperature,
    allowed,
    algo.logits_chunk,
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
  params: Any, critic_def: Any, batch: Batch, algo: AlgoConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The clipped value loss on the batch's returns."""
  v = sequence_values(
    nnx.merge(critic_def, params), batch.tokens, batch.positions
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


Objective = Callable[[Any, Batch], tuple[jax.Array, dict[str, jax.Array]]]
GradFn = Callable[[Any], tuple[tuple[jax.Array, dict[str, jax.Array]], Any]]


def micro_batches(sequences: int, length: int, tokens: int) -> int:
  """How many micro-batches a minibatch of ``sequences`` x ``length``
  tokens is cut into so that each holds at most ``tokens`` (0: one).

  Raises:
    ValueError: naming ``algo.micro_batch_tokens`` when one sequence is
      already over the budget.
  """
  if tokens <= 0:
    return 1
  if length > tokens:
    raise ValueError(
      f"algo: micro_batch_tokens={tokens} is less than one sequence of "
      f"{length} tokens (rollout.max_context)"
    )
  per_micro = tokens // length
  return next(
    m
    for m in range(1, sequences + 1)
    if sequences % m == 0 and sequences // m <= per_micro
  )


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
  batch: Batch, keep: jax.Array, count: int, key: jax.Array
) -> Batch:
  """The batch shuffled and cut into ``[count, B / count, ...]``.

  Kept episodes move to the front, so minibatches with nothing to train on
  come last and are skipped (RAGEN slices the kept episodes instead).
  """
  b = keep.shape[0]
  order = jax.random.permutation(key, b)
  order = order[jnp.argsort(~keep[order], stable=True)]
  return jax.tree.map(
    lambda x: x[order].reshape(count, b // count, *x.shape[1:]), batch
  )


def update(
  learner: Learner,
  state: TrainState,
  batch: Batch,
  keep: jax.Array,
  algo: AlgoConfig,
  temperature: float,
  allowed: jax.Array | None,
  key: jax.Array,
  constrain: Callable[[Any], Any] = lambda tree: tree,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """``algo.epochs`` x ``algo.minibatches`` clipped policy (and value)
  updates.

  Returns:
    The state with new parameters and optimizer states, and per-minibatch
    statistics ``[epochs, minibatches]`` (``live``: it had tokens to train
    on; ``skipped``: its update was not finite).
  """
  b, length = batch.tokens.shape
  micro = micro_batches(b // algo.minibatches, length, algo.micro_batch_tokens)

  def train_minibatch(carry, mb: Batch):
    params, opt, c_params, c_opt = carry
    mb = constrain(mb)
    live = jnp.any(mb.mask)
    grads = lambda objective: batch_gradients(
      objective, mb, micro, algo.loss_agg
    )
    params, opt, stats, finite = apply_gradients(
      learner.policy_tx,
      grads(
        lambda p, b: policy_objective(
          p, learner.policy_def, b, algo, temperature, allowed
        )
      ),
      params,
      opt,
      live,
    )
    if algo.uses_critic:
      c_params, c_opt, c_stats, c_finite = apply_gradients(
        learner.critic_tx,
        grads(lambda p, b: critic_objective(p, learner.critic_def, b, algo)),
        c_params,
        c_opt,
        live,
      )
      stats.update(c_stats, critic_grad_norm=c_stats.pop("grad_norm"))
      finite = finite & c_finite
    stats.update(live=live, skipped=live & ~finite)
    return (params, opt, c_params, c_opt), stats

  def epoch(carry, k):
    return jax.lax.scan(
      train_minibatch, carry, minibatches(batch, keep, algo.minibatches, k)
    )

  carry = (state.policy, state.policy_opt, state.critic, state.critic_opt)
  (params, opt, c_params, c_opt), stats = jax.lax.scan(
    epoch, carry, jax.random.split(key, algo.epochs)
  )
  new_state = state.replace(
    policy=params, policy_opt=opt, critic=c_params, critic_opt=c_opt
  )
  return new_state, stats


# ---------------------------------------------------------------------------
# Diagnostics: the policy gradient taken apart (before the update)

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
  temperature: float,
  allowed: jax.Array | None,
  weights: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """``policy_objective``'s terms weighted by ``weights`` ``[3]``: the task
  (clipped policy) loss, the entropy bonus ``-entropy_coef * H`` and the
  KL loss ``kl_coef * KL``. Weights of ones give the objective itself."""
  _, s = policy_objective(params, policy_def, batch, algo, temperature, allowed)
  loss = (
    weights[0] * s["pg_loss"]
    - weights[1] * algo.entropy_coef * s["entropy"]
    + weights[2] * algo.kl_coef * s["kl_loss"]
  )
  return loss, {}


def gradient_split(
  learner: Learner,
  state: TrainState,
  batch: Batch,
  group_std: jax.Array,
  algo: AlgoConfig,
  temperature: float,
  allowed: jax.Array | None,
  buckets: int,
) -> dict[str, jax.Array]:
  """Norms of the policy gradient's parts on the whole batch (what the
  filter kept), at the parameters that played it: each term of the loss
  alone (``grads/task``, ``grads/entropy``, ``grads/kl``), and the task
  term of each reward-std bucket of groups alone (``grads/task_std_qK``,
  ``K = 1`` the lowest std; ``grads/std_qK`` its groups' mean std; a
  bucket with no kept token has norm 0). RAGEN-2's gradient analysis: the
  task gradient of low-spread groups is small, so there regularisers
  dominate the update.
  """
  b, length = batch.tokens.shape
  groups = group_std.shape[0]
  buckets = min(buckets, groups)
  bucket = diagnostics.std_buckets(group_std, buckets)
  of_episode = jnp.repeat(bucket, b // groups)[:, None]
  weights = [*TERMS.values()] + [TERMS["task"]] * buckets
  masks = [batch.mask] * len(TERMS) + [
    batch.mask & (of_episode == k) for k in range(buckets)
  ]
  # Never more at once than the update holds: a minibatch, or its micro-batch.
  per_minibatch = b // algo.minibatches
  micro = algo.minibatches * micro_batches(
    per_minibatch, length, algo.micro_batch_tokens
  )

  def norm(args):
    w, mask = args
    objective = lambda p, mb: term_objective(
      p, learner.policy_def, mb, algo, temperature, allowed, w
    )
    grad_fn = batch_gradients(
      objective, batch.replace(mask=mask), micro, algo.loss_agg
    )
    return optax.tree.norm(grad_fn(state.policy)[1])

  norms = jax.lax.map(norm, (jnp.asarray(weights), jnp.stack(masks)))
  out = {f"grads/{name}": norms[i] for i, name in enumerate(TERMS)}
  for k in range(buckets):
    in_k = bucket == k
    out[f"grads/task_std_q{k + 1}"] = norms[len(TERMS) + k]
    out[f"grads/std_q{k + 1}"] = jnp.sum(jnp.where(in_k, group_std, 0.0)) / (
      jnp.maximum(jnp.sum(in_k), 1)
    )
  return out


# ---------------------------------------------------------------------------
# The step


@struct.dataclass
class Prepared:
  """Phases 1-4 of a step: what was played and what the update reads."""

  traj: Trajectory
  scored: Scored
  selection: Selection
  batch: Batch


def prepare(
  learner: Learner,
  state: TrainState,
  codec: Codec,
  env: Env,
  rollout_cfg: RolloutConfig,
  algo: AlgoConfig,
  filter_cfg: filtering.FilterConfig,
  key: jax.Array,
  constrain: Callable[[Any], Any] = lambda tree: tree,
) -> Prepared:
  """collect -> score -> select -> make_batch, with the rollout key."""
  traj = collect(learner, state, codec, env, rollout_cfg, key, constrain)
  scored = score(learner, state, traj, codec, rollout_cfg, algo)
  groups = rollout_cfg.env_groups
  selection = select(scored, filter_cfg, groups)
  batch = make_batch(traj, scored, selection, algo, filter_cfg, groups)
  return Prepared(traj, scored, selection, constrain(batch))


def diagnose(
  learner: Learner,
  state: TrainState,
  codec: Codec,
  p: Prepared,
  rollout_cfg: RolloutConfig,
  algo: AlgoConfig,
  cfg: diagnostics.DiagnosticsConfig,
) -> dict[str, jax.Array]:
  """The periodic diagnostics of the step after ``state.step``, at the
  parameters that played ``p``: the collapse diagnostics every
  ``cfg.collapse_every`` steps, the gradient split every
  ``cfg.gradients_every`` (``diagnostics.periodic``: zeros elsewhere)."""
  out = {}
  number = state.step + 1
  if cfg.collapse_every:
    policy = nnx.merge(learner.policy_def, state.policy)
    logp_fn = lambda tokens, positions: sequence_logprobs(
      policy,
      tokens,
      positions,
      rollout_cfg.temperature,
      codec.allowed,
      algo.logits_chunk,
    )[0]
    out.update(
      diagnostics.collapse(
        logp_fn,
        p.traj,
        rollout_cfg.env_groups,
        rollout_cfg.max_new_tokens,
        context_needed(codec, rollout_cfg, 1),
        number % cfg.collapse_every == 0,
      )
    )
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
      learner,
      state,
      p.batch,
      group_std,
      algo,
      rollout_cfg.temperature,
      codec.allowed,
      cfg.buckets,
    )
    out.update(
      diagnostics.periodic(compute, number % cfg.gradients_every == 0, "grads")
    )
  return out


def step_keys(state: TrainState) -> tuple[jax.Array, jax.Array]:
  """The rollout key and the minibatch-shuffling key of ``state.step``."""
  k_roll, k_perm = jax.random.split(jax.random.fold_in(state.key, state.step))
  return k_roll, k_perm


def make_step(
  *,
  env: Env,
  rollout_cfg: RolloutConfig,
  algo: AlgoConfig,
  filter_cfg: filtering.FilterConfig,
  learner: Learner,
  mesh: Any = None,
  diag_cfg: diagnostics.DiagnosticsConfig | None = None,
):
  """Builds ``step(state, codec) -> (state, metrics)`` (jit it).

  With a ``mesh``, episode-batch arrays are sharded over its data and fsdp
  axes (parameters follow the shardings the state arrives with). With a
  ``diag_cfg``, every ``collapse_every`` steps the metrics include the
  collapse diagnostics of the step's rollout scored by the policy that
  played it (``diagnostics.collapse``), and every ``gradients_every`` steps
  the policy gradient split by term and bucket (``gradient_split``).
  """
  b = rollout_cfg.batch
  if b % algo.minibatches:
    raise ValueError(
      f"algo: minibatches={algo.minibatches} must divide the "
      f"{b} episodes of a step"
    )
  on_batch = sharding.batch_constraint(mesh, b)
  on_minibatch = sharding.batch_constraint(mesh, b // algo.minibatches)

  def step(state: TrainState, codec: Codec):
    k_roll, k_perm = step_keys(state)
    p = prepare(
      learner,
      state,
      codec,
      env,
      rollout_cfg,
      algo,
      filter_cfg,
      k_roll,
      on_batch,
    )
    new_state, stats = update(
      learner,
      state,
      p.batch,
      p.selection.keep,
      algo,
      rollout_cfg.temperature,
      codec.allowed,
      k_perm,
      on_minibatch,
    )
    skipped = jnp.any(stats["skipped"])
    new_state = new_state.replace(
      step=state.step + 1,
      nonfinite=jnp.where(skipped, state.nonfinite + 1, 0),
    )
    metrics = diagnostics.step_metrics(
      p.traj,
      p.scored,
      p.selection,
      p.batch,
      stats,
      rollout_cfg.group_size,
      algo,
    )
    metrics["train/nonfinite_streak"] = new_state.nonfinite.astype(jnp.float32)
    if diag_cfg is not None:
      metrics.update(
        diagnose(learner, state, codec, p, rollout_cfg, algo, diag_cfg)
      )
    return new_state, metrics

  return sharding.traced_for(mesh, step)
