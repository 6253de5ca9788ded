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
  # Scoring and the update run at the shortest of this many static lengths
  # (evenly spaced up to rollout.max_context, multiples of 128) that holds
  # the longest kept episode; each length is one more compile of them. 1:
  # always max_context.
  length_buckets: int = 4

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
    for name in ("epochs", "minibatches", "logits_chunk", "length_buckets"):
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
  # Whether the policy trains only its LoRA adapters (models/lora.py) over
  # frozen weights, which are then also the reference.
  adapters: bool = False
  # Whether the critic is adapters and a value head on the policy's frozen
  # weights (its state holds only ``CRITIC_OWN``), not a model of its own.
  critic_shares_base: bool = False


# What a critic that shares the policy's frozen weights holds of its own.
CRITIC_OWN = nnx.Any(
  nnx.LoRAParam, nnx.PathContains("value_w"), nnx.PathContains("value_b")
)


def trainable(learner: Learner, params: Any) -> tuple[Any, Any]:
  """The policy's state split into what the optimizer updates and what
  stays frozen: (adapters, weights) with adapters, else (all, None)."""
  if not learner.adapters:
    return params, None
  return params.split(nnx.LoRAParam, ...)


def joined(part: Any, frozen: Any) -> Any:
  """``trainable``'s two parts as the policy's state again."""
  return part if frozen is None else nnx.merge_state(part, frozen)


def critic_base(learner: Learner, policy: Any) -> Any:
  """The frozen weights the critic runs on beside its own state: the
  policy's, when it shares them, else None."""
  return trainable(learner, policy)[1] if learner.critic_shares_base else None


def frozen_base(params: Any) -> Any:
  """An adapted policy's state with its adapters at zero: the frozen
  weights' model, exactly (B = 0 adds nothing), without a copy of them."""
  adapters, weights = params.split(nnx.LoRAParam, ...)
  return nnx.merge_state(jax.tree.map(jnp.zeros_like, adapters), weights)


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
  """Which rollout groups the update trains on (StarPO-S), and the
  episodes it holds: whole groups, the kept ones among them."""

  group_scores: jax.Array  # [groups] the filter metric
  keep_group: jax.Array  # [groups] bool, within the capacity
  keep: jax.Array  # [B] bool, per episode
  rows: jax.Array  # [C * group_size] int32 episodes the update holds
  over_capacity: jax.Array  # [] int32 groups kept beyond the capacity

  @property
  def kept_fraction(self) -> jax.Array:
    return jnp.mean(self.keep_group.astype(jnp.float32))

  @property
  def row_keep(self) -> jax.Array:
    """[C * group_size] bool: the held episode is kept."""
    return self.keep[self.rows]


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
  episode: jax.Array  # [B] int32 each row's episode in the rollout


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
  the token at position p is predicted from the hidden state at p - 1.
  ``positions`` must be ``_within(tokens, ...)``."""
  h, _ = model.hidden(tokens)
  before = jnp.maximum(positions - 1, 0)
  return jnp.take_along_axis(h, before[..., None], axis=1)


def _within(tokens: jax.Array, positions: jax.Array) -> jax.Array:
  """``positions`` clamped into ``tokens [B, L]``: a sequence cut to a
  length bucket may leave untrained tokens beyond it, whose values are
  then finite and masked (an out-of-range gather gives NaN, and a NaN
  times a zero mask is still NaN in the gradient)."""
  return jnp.minimum(positions, tokens.shape[1] - 1)


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
  positions = _within(tokens, positions)
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
  positions = _within(tokens, positions)
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


def score_rewards(traj: Trajectory, cfg: RolloutConfig, algo: AlgoConfig):
  """The rollout's generated tokens, their sampling log-probabilities and
  rewards (no model runs; the reference and critic fields are 0)."""
  positions, mask = pack_generated(traj, cfg.max_generated)
  take = lambda x: jnp.take_along_axis(x, positions, axis=1)
  old_logp = take(traj.logprobs)
  zeros = jnp.zeros_like(old_logp)
  return Scored(
    positions=positions,
    mask=mask,
    old_logp=old_logp,
    entropy=take(traj.entropy),
    rewards=take(token_rewards(traj, algo.use_turn_scores)),
    turn_end=take(turn_ends(traj)) & mask,
    ref_logp=zeros,
    kl=zeros,
    values=zeros,
  )


def score_models(
  learner: Learner,
  state: TrainState,
  tokens: jax.Array,
  scored: Scored,
  codec: Codec,
  cfg: RolloutConfig,
  algo: AlgoConfig,
) -> Scored:
  """``scored`` with the reference's log-probabilities (and the KL, in the
  rewards if ``algo.kl_in_reward``) and the critic's values on the
  episodes ``tokens [B, L']`` (``L'`` holding every generated token)."""
  positions, mask = scored.positions, scored.mask
  ref_logp, rewards, values = scored.ref_logp, scored.rewards, scored.values
  if algo.uses_reference:
    reference = nnx.merge(
      learner.policy_def,
      frozen_base(state.policy) if learner.adapters else state.reference,
    )
    ref_logp, _ = sequence_logprobs(
      reference,
      tokens,
      positions,
      cfg.temperature,
      codec.allowed,
      algo.logits_chunk,
    )
    ref_logp = jax.lax.stop_gradient(ref_logp)
  kl = losses.kl(scored.old_logp, ref_logp, algo.kl_estimator) * mask
  if algo.uses_reference and algo.kl_in_reward:
    rewards = rewards - algo.kl_coef * kl
  if algo.uses_critic:
    critic = nnx.merge(
      learner.critic_def,
      joined(state.critic, critic_base(learner, state.policy)),
    )
    values = sequence_values(critic, tokens, positions)
    values = jax.lax.stop_gradient(values) * mask
  return scored.replace(
    ref_logp=ref_logp, kl=kl, rewards=rewards, values=values
  )


def bucket_lengths(context: int, buckets: int) -> tuple[int, ...]:
  """The static sequence lengths scoring and the update may run at:
  ``buckets`` evenly spaced up to ``context``, rounded up to multiples of
  128 (the attention kernels' blocks), the last ``context`` itself."""
  lengths = {
    min(context, -(-context * i // buckets // 128) * 128)
    for i in range(1, buckets)
  }
  return tuple(sorted(lengths | {context}))


def needed_length(mask: jax.Array, positions: jax.Array) -> jax.Array:
  """[] int32: a sequence length holding every masked generated token
  (``mask``, ``positions`` ``[B, G]``); the attention is causal, so the
  tokens after the last of them change none of their log-probabilities."""
  return jnp.max(jnp.where(mask, positions, 0)) + 1


def at_length(
  lengths: tuple[int, ...],
  needed: jax.Array,
  fn: Callable[[jax.Array], Any],
  tokens: jax.Array,
) -> tuple[Any, jax.Array]:
  """``fn(tokens[:, :length])`` at the shortest of ``lengths`` (static,
  ascending) that is at least ``needed``, chosen on device: one compiled
  branch per length (``lax.switch``), no recompilation.

  Returns:
    ``fn``'s result and the length used, ``[]`` int32.
  """
  if len(lengths) == 1:
    return fn(tokens), jnp.asarray(lengths[0], jnp.int32)
  table = jnp.asarray(lengths, jnp.int32)
  index = jnp.minimum(jnp.searchsorted(table, needed), len(lengths) - 1)
  branches = [lambda t, n=n: fn(t[:, :n]) for n in lengths]
  return jax.lax.switch(index, branches, tokens), table[index]


# ---------------------------------------------------------------------------
# Phase 3: select


def held_groups(
  cfg: filtering.FilterConfig, rollout_cfg: RolloutConfig, algo: AlgoConfig
) -> int:
  """Rollout groups the update holds: the filter's capacity, rounded up so
  that they fill whole minibatches (a minibatch is ``batch /
  algo.minibatches`` episodes, kept or not, as without compaction)."""
  groups, size = rollout_cfg.env_groups, rollout_cfg.group_size
  per_minibatch = rollout_cfg.batch // algo.minibatches
  held = filtering.capacity(cfg, groups)
  while (held * size) % per_minibatch:
    held += 1
  return held


def select(
  scored: Scored, cfg: filtering.FilterConfig, groups: int, held: int
) -> Selection:
  """StarPO-S: whole groups kept, and the ``held`` groups the update
  holds: the kept ones first, in the filter's order of preference (a kept
  group past ``held`` is dropped and counted)."""
  group_scores = filtering.group_scores(
    cfg.metric, scored.scores, scored.lengths, scored.episode_entropy, groups
  )
  wanted = filtering.keep_groups(group_scores, cfg)
  slots = jnp.sort(
    filtering.preference(group_scores, wanted, cfg.largest)[:held]
  )
  keep_group = wanted & jnp.zeros(groups, bool).at[slots].set(True)
  size = scored.mask.shape[0] // groups
  rows = (slots[:, None] * size + jnp.arange(size)).reshape(-1)
  return Selection(
    group_scores=group_scores,
    keep_group=keep_group,
    keep=jnp.repeat(keep_group, size),
    rows=rows.astype(jnp.int32),
    over_capacity=jnp.sum(wanted) - jnp.sum(keep_group),
  )


# ---------------------------------------------------------------------------
# Phase 4: advantages


def make_batch(
  tokens: jax.Array,
  scored: Scored,
  selection: Selection,
  algo: AlgoConfig,
  filter_cfg: filtering.FilterConfig,
) -> Batch:
  """Advantages over the kept episodes, and everything the update reads.
  ``tokens [rows, L]`` and ``scored`` hold the selection's rows."""
  keep = selection.row_keep
  train_mask = scored.mask & keep[:, None]
  group_size = selection.keep.shape[0] // selection.keep_group.shape[0]
  advantages, returns = adv_lib.compute(
    algo.adv_estimator,
    adv_lib.Inputs(
      rewards=scored.rewards,
      values=scored.values,
      mask=train_mask,
      turn_end=scored.turn_end & train_mask,
      scores=scored.scores,
    ),
    keep.shape[0] // group_size,
    algo,
  )
  scale = filtering.loss_scale(selection.kept_fraction, filter_cfg)
  return Batch(
    tokens=tokens,
    positions=scored.positions,
    mask=train_mask,
    old_logp=scored.old_logp,
    ref_logp=scored.ref_logp,
    advantages=advantages * scale,
    returns=returns,
    values=scored.values,
    episode=selection.rows,
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
  learner: Learner,
  state: TrainState,
  algo: AlgoConfig,
  temperature: float,
  allowed: jax.Array | None,
) -> tuple[Callable[..., Any], Callable[..., Any]]:
  """The policy's and the critic's objectives of (what they train, a
  minibatch). With adapters only they are differentiated; the frozen
  weights are closed over."""
  frozen = trainable(learner, state.policy)[1]
  shared = critic_base(learner, state.policy)
  policy_loss = lambda p, b: policy_objective(
    joined(p, frozen), learner.policy_def, b, algo, temperature, allowed
  )
  critic_loss = lambda p, b: critic_objective(
    joined(p, shared), learner.critic_def, b, algo
  )
  return policy_loss, critic_loss


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
  episodes: int | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """``algo.epochs`` x minibatches of clipped policy (and value) updates.

  A minibatch is ``episodes / algo.minibatches`` rows (``episodes``: the
  rollout's, which the batch may hold only some of; default the batch's).
  Every minibatch runs at the shortest of ``bucket_lengths`` holding the
  batch's kept tokens.

  Returns:
    The state with new parameters and optimizer states, and per-minibatch
    statistics ``[epochs, minibatches]`` (``live``: it had tokens to train
    on; ``skipped``: its update was not finite; ``length``: the sequence
    length it ran at).
  """
  b, context = batch.tokens.shape
  episodes = episodes or b
  size = episodes // algo.minibatches
  lengths = bucket_lengths(context, algo.length_buckets)
  part, frozen = trainable(learner, state.policy)
  policy_loss, critic_loss = _losses(learner, state, algo, temperature, allowed)

  def at(tokens: jax.Array):
    micro = micro_batches(size, tokens.shape[1], algo.micro_batch_tokens)

    def train_minibatch(carry, mb: Batch):
      params, opt, c_params, c_opt = carry
      mb = constrain(mb)
      live = jnp.any(mb.mask)
      grads = lambda objective: batch_gradients(
        objective, mb, micro, algo.loss_agg
      )
      params, opt, stats, finite = apply_gradients(
        learner.policy_tx, grads(policy_loss), params, opt, live
      )
      if algo.uses_critic:
        c_params, c_opt, c_stats, c_finite = apply_gradients(
          learner.critic_tx,
          grads(critic_loss),
          c_params,
          c_opt,
          live,
        )
        stats.update(c_stats, critic_grad_norm=c_stats.pop("grad_norm"))
        finite = finite & c_finite
      stats.update(live=live, skipped=live & ~finite)
      return (params, opt, c_params, c_opt), stats

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
  group_size: int,
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
  dominate the update. ``group_std [groups]`` covers every rollout group
  (of ``group_size`` episodes), the batch's rows some of them.
  """
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
      joined(p, frozen), learner.policy_def, mb, algo, temperature, allowed, w
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


# ---------------------------------------------------------------------------
# The step


@struct.dataclass
class Prepared:
  """Phases 1-4 of a step: what was played and what the update reads."""

  traj: Trajectory
  scored: Scored  # every episode; the models' fields only with a KL reward
  selection: Selection
  held: Scored  # the selection's rows, the models' fields filled
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
  with jax.named_scope("collect"):
    traj = collect(learner, state, codec, env, rollout_cfg, key, constrain)
  return prepare_batch(
    learner, state, codec, traj, rollout_cfg, algo, filter_cfg, constrain
  )


def prepare_batch(
  learner: Learner,
  state: TrainState,
  codec: Codec,
  traj: Trajectory,
  rollout_cfg: RolloutConfig,
  algo: AlgoConfig,
  filter_cfg: filtering.FilterConfig,
  constrain: Callable[[Any], Any] = lambda tree: tree,
) -> Prepared:
  """score -> select -> make_batch on a rollout.

  The filter reads only the rollout (rewards, lengths, sampling entropy),
  so the reference and the critic score just the held groups, at the
  shortest bucket length that holds their kept tokens; only a KL in the
  reward must be known before selecting, and then they score every
  episode.
  """
  groups = rollout_cfg.env_groups
  held = held_groups(filter_cfg, rollout_cfg, algo)
  lengths = bucket_lengths(traj.tokens.shape[1], algo.length_buckets)

  def by_models(tokens: jax.Array, scored: Scored, mask: jax.Array):
    if not (algo.uses_reference or algo.uses_critic):
      return scored
    with jax.named_scope("score"):
      fn = lambda t: score_models(
        learner, state, t, scored, codec, rollout_cfg, algo
      )
      return at_length(
        lengths, needed_length(mask, scored.positions), fn, tokens
      )[0]

  with jax.named_scope("score"):
    scored = score_rewards(traj, rollout_cfg, algo)
  reward_needs_models = algo.uses_reference and algo.kl_in_reward
  if reward_needs_models:
    scored = by_models(traj.tokens, scored, scored.mask)
  with jax.named_scope("select"):
    selection = select(scored, filter_cfg, groups, held)
  rows = lambda x: x if held == groups else x[selection.rows]
  tokens, rows_scored = rows(traj.tokens), jax.tree.map(rows, scored)
  if not reward_needs_models:
    kept = rows_scored.mask & selection.row_keep[:, None]
    rows_scored = by_models(tokens, rows_scored, kept)
  with jax.named_scope("advantages"):
    batch = make_batch(tokens, rows_scored, selection, algo, filter_cfg)
  return Prepared(traj, scored, selection, rows_scored, constrain(batch))


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
      rollout_cfg.group_size,
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
  held = held_groups(filter_cfg, rollout_cfg, algo) * rollout_cfg.group_size
  on_rollout = sharding.batch_constraint(mesh, b)
  on_held = sharding.batch_constraint(mesh, held)
  on_batch = lambda tree: on_held(on_rollout(tree))
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
      p.selection.row_keep,
      algo,
      rollout_cfg.temperature,
      codec.allowed,
      k_perm,
      on_minibatch,
      episodes=b,
    )
    skipped = jnp.any(stats["skipped"])
    new_state = new_state.replace(
      step=state.step + 1,
      nonfinite=jnp.where(skipped, state.nonfinite + 1, 0),
    )
    with jax.named_scope("metrics"):
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
      with jax.named_scope("diagnostics"):
        metrics.update(
          diagnose(learner, state, codec, p, rollout_cfg, algo, diag_cfg)
        )
    return new_state, metrics

  return sharding.traced_for(mesh, step)
