"""The one compiled training step, in named phases:

  collect -> score (rewards, values, reference) -> select (StarPO-S filter)
  -> make_batch (advantages) -> update (epochs x minibatches) -> metrics

  spec = StepSpec(env=..., rollout=..., algo=..., filter=..., learner=...)
  step = jax.jit(make_step(spec), donate_argnums=0)  # spec closed over
  state, metrics = step(state, codec)  # codec: the text tables

Each phase is a module-level function over typed structs, so tests call the
same code the step runs. Parameters live in the ``TrainState`` (an
argument), never in the closure. The RNG of step ``n`` is
``fold_in(state.key, n)``, so a resumed run replays exactly the steps an
uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from starpo_jax import sharding
from starpo_jax.agent import mixture
from starpo_jax.agent.codec import Codec
from starpo_jax.agent.rollout import RolloutConfig, Trajectory
from starpo_jax.algo import advantages as adv_lib
from starpo_jax.algo import diagnostics, filtering, losses
from starpo_jax.algo.batch import (
  Batch,
  Prepared,
  Scored,
  Selection,
  at_length,
)
from starpo_jax.algo.config import AlgoConfig
from starpo_jax.algo.logprobs import (
  in_micro_batches,
  pack_generated,
  sequence_logprobs,
  sequence_values,
)
from starpo_jax.algo.periodic import diagnose
from starpo_jax.algo.spec import StepSpec
from starpo_jax.algo.state import (
  TrainState,
  critic_base,
  frozen_base,
  joined,
)
from starpo_jax.algo.update import passes, sharing, update


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


def collect(
  spec: StepSpec,
  state: TrainState,
  codec: Codec,
  key: jax.Array,
  constrain: Callable[[Any], Any] = lambda tree: tree,
) -> Trajectory:
  """Plays ``rollout.batch`` episodes with the current policy (no
  gradient), of every part where the environment is a ``Mixture``."""
  policy = nnx.merge(spec.learner.policy_def, state.policy)
  return jax.lax.stop_gradient(
    mixture.play(policy, codec, spec.env, spec.rollout, key, constrain)
  )


def score_rewards(
  traj: Trajectory, rollout_cfg: RolloutConfig, algo: AlgoConfig
):
  """The rollout's generated tokens, their sampling log-probabilities and
  rewards (no model runs; the reference and critic fields are 0)."""
  positions, mask = pack_generated(traj, rollout_cfg.max_generated)
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


@dataclasses.dataclass(frozen=True)
class SharedPrompts:
  """How the passes over a batch compute its rows' shared prompts once
  (``algo.prefix``): each row's shared tokens (``prefix [B]``), what a
  pass is given for them (``share(prefix)``), and the micro-batches that
  keep the passes within the token budget (``micro``)."""

  prefix: jax.Array
  share: Callable[[jax.Array], Any]
  micro: int


def score_models(
  spec: StepSpec,
  state: TrainState,
  codec: Codec,
  tokens: jax.Array,
  turns: jax.Array,
  scored: Scored,
  shared: SharedPrompts | None = None,
) -> Scored:
  """``scored`` with the reference's log-probabilities (and the KL, in the
  rewards if ``algo.kl_in_reward``) and the critic's values on the
  episodes ``tokens [B, L']`` (``L'`` holding every generated token;
  ``turns [B, L]``, their tokens' turns, at least as long), the rows'
  shared prompts computed once as ``shared`` says (None: each row whole,
  in the micro-batches ``algo.micro_batch_tokens`` asks for)."""
  learner, algo, dist = spec.learner, spec.algo, spec.distribution(codec)
  positions, mask = scored.positions, scored.mask
  ref_logp, rewards, values = scored.ref_logp, scored.rewards, scored.values
  if shared is None:
    shared = SharedPrompts(
      jnp.zeros(tokens.shape[:1], jnp.int32), lambda prefix: None, 0
    )
  share = shared.share
  # Forward passes only, within the update's token budget.
  passes = lambda fn: in_micro_batches(
    fn, algo.micro_batch_tokens, shared.micro
  )(tokens, positions, turns, shared.prefix)
  if algo.uses_reference:
    reference = nnx.merge(
      learner.policy_def,
      frozen_base(state.policy) if learner.adapters else state.reference,
    )
    ref_fn = lambda t, p, u, s: sequence_logprobs(
      reference,
      t,
      p,
      dist.temperature,
      dist.allowed,
      algo.logits_chunk,
      dist.context(u),
      share(s),
    )[0]
    ref_logp = jax.lax.stop_gradient(passes(ref_fn))
  kl = losses.kl(scored.old_logp, ref_logp, algo.kl_estimator) * mask
  if algo.uses_reference and algo.kl_in_reward:
    rewards = rewards - algo.kl_coef * kl
  if algo.uses_critic:
    critic = nnx.merge(
      learner.critic_def,
      joined(state.critic, critic_base(learner, state.policy)),
    )
    values_fn = lambda t, p, u, s: sequence_values(
      critic, t, p, dist.context(u), share(s)
    )
    values = jax.lax.stop_gradient(passes(values_fn)) * mask
  return scored.replace(
    ref_logp=ref_logp, kl=kl, rewards=rewards, values=values
  )


def score_batch(
  spec: StepSpec,
  state: TrainState,
  codec: Codec,
  tokens: jax.Array,
  turns: jax.Array,
  scored: Scored,
  mask: jax.Array,
) -> Scored:
  """``score_models`` at the shortest static length that holds the
  tokens ``mask [B, G]`` marks (a bucket, or a suffix after the rows'
  shared prompts: ``update.passes``)."""
  plan, micro = sharing(spec, state, codec, tokens.shape[0], tokens.shape[1])
  prefix, lengths, needed, cut = passes(
    plan, tokens, scored.positions, mask, spec.algo.length_buckets
  )

  def fn(t: jax.Array, n: int) -> Scored:
    if plan is None:
      return score_models(spec, state, codec, t, turns, scored)
    share = lambda prefix: plan.shared(prefix, n)
    return score_models(
      spec,
      state,
      codec,
      t,
      turns,
      scored,
      SharedPrompts(prefix, share, micro),
    )

  return at_length(lengths, needed, fn, tokens, cut)[0]


def held_groups(spec: StepSpec) -> int:
  """Rollout groups the update holds: the filter's capacity (summed over
  the parts it ranks apart), rounded up so that they fill whole
  minibatches (a minibatch is ``batch / algo.minibatches`` episodes, kept
  or not, as without compaction)."""
  groups, size = spec.rollout.env_groups, spec.rollout.group_size
  per_minibatch = spec.rollout.batch // spec.algo.minibatches
  parts = filtered_parts(spec)
  if spec.filter.capacity:
    parts = (groups,)
  held = sum(filtering.capacity(spec.filter, n) for n in parts)
  while (held * size) % per_minibatch:
    held += 1
  return held


def filtered_parts(spec: StepSpec) -> tuple[int, ...]:
  """The group counts the filter ranks apart: each part's, for a
  ``Mixture`` with ``filter.by_part``; else all groups together."""
  if spec.filter.by_part and isinstance(spec.env, mixture.Mixture):
    return tuple(p.groups for p in spec.env.parts)
  return (spec.rollout.env_groups,)


def select(
  scored: Scored,
  cfg: filtering.FilterConfig,
  groups: int,
  held: int,
  parts: tuple[int, ...] = (),
) -> Selection:
  """StarPO-S: whole groups kept, and the ``held`` groups the update
  holds: the kept ones first, in the filter's order of preference (a kept
  group past ``held`` is dropped and counted). ``parts``: group counts
  the filter ranks apart (``filtered_parts``; empty: all together)."""
  group_scores = filtering.group_scores(
    cfg.metric, scored.scores, scored.lengths, scored.episode_entropy, groups
  )
  if len(parts) > 1:
    wanted = filtering.by_parts(group_scores, cfg, parts)
  else:
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


def make_batch(
  spec: StepSpec,
  tokens: jax.Array,
  turns: jax.Array,
  scored: Scored,
  selection: Selection,
) -> Batch:
  """Advantages over the kept episodes, and everything the update reads.
  ``tokens``, ``turns`` ``[rows, L]`` and ``scored`` hold the selection's
  rows."""
  algo, keep = spec.algo, selection.row_keep
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
  scale = filtering.loss_scale(selection.kept_fraction, spec.filter)
  return Batch(
    tokens=tokens,
    turns=turns,
    positions=scored.positions,
    mask=train_mask,
    old_logp=scored.old_logp,
    ref_logp=scored.ref_logp,
    advantages=advantages * scale,
    returns=returns,
    values=scored.values,
    episode=selection.rows,
  )


def prepare(
  spec: StepSpec,
  state: TrainState,
  codec: Codec,
  key: jax.Array,
  constrain: Callable[[Any], Any] = lambda tree: tree,
) -> Prepared:
  """collect -> score -> select -> make_batch, with the rollout key."""
  with jax.named_scope("collect"):
    traj = collect(spec, state, codec, key, constrain)
  return prepare_batch(spec, state, codec, traj, constrain)


def prepare_batch(
  spec: StepSpec,
  state: TrainState,
  codec: Codec,
  traj: Trajectory,
  constrain: Callable[[Any], Any] = lambda tree: tree,
) -> Prepared:
  """score -> select -> make_batch on a rollout.

  The filter reads only the rollout (rewards, lengths, sampling entropy),
  so the reference and the critic score just the held groups, at the
  shortest bucket length that holds their kept tokens; only a KL in the
  reward must be known before selecting, and then they score every
  episode.
  """
  algo, groups = spec.algo, spec.rollout.env_groups
  held = held_groups(spec)

  def by_models(tokens, turns, scored: Scored, mask: jax.Array):
    if not (algo.uses_reference or algo.uses_critic):
      return scored
    with jax.named_scope("score"):
      return score_batch(spec, state, codec, tokens, turns, scored, mask)

  with jax.named_scope("score"):
    scored = score_rewards(traj, spec.rollout, algo)
  reward_needs_models = algo.uses_reference and algo.kl_in_reward
  if reward_needs_models:
    scored = by_models(traj.tokens, traj.turn_ids, scored, scored.mask)
  with jax.named_scope("select"):
    selection = select(scored, spec.filter, groups, held, filtered_parts(spec))
  rows = lambda x: x if held == groups else x[selection.rows]
  tokens, turns = rows(traj.tokens), rows(traj.turn_ids)
  rows_scored = jax.tree.map(rows, scored)
  if not reward_needs_models:
    kept = rows_scored.mask & selection.row_keep[:, None]
    rows_scored = by_models(tokens, turns, rows_scored, kept)
  with jax.named_scope("advantages"):
    batch = make_batch(spec, tokens, turns, rows_scored, selection)
  return Prepared(traj, scored, selection, rows_scored, constrain(batch))


def part_sizes(spec: StepSpec) -> set[int]:
  """The batch sizes the rollout plays apart: a chunk's, and each part's
  (and its chunk's) where the environment is a ``Mixture``."""
  cfg = spec.rollout
  sizes = {cfg.batch // cfg.chunks}
  if isinstance(spec.env, mixture.Mixture):
    for part in spec.env.configs(cfg):
      sizes |= {part.batch, part.batch // part.chunks}
  return sizes


def step_keys(state: TrainState) -> tuple[jax.Array, jax.Array]:
  """The rollout key and the minibatch-shuffling key of ``state.step``."""
  k_roll, k_perm = jax.random.split(jax.random.fold_in(state.key, state.step))
  return k_roll, k_perm


def make_step(spec: StepSpec, mesh: Any = None):
  """Builds ``step(state, codec) -> (state, metrics)`` (jit it).

  With a ``mesh``, episode-batch arrays are sharded over its data and fsdp
  axes (parameters follow the shardings the state arrives with). With
  ``spec.diagnostics``, every ``collapse_every`` steps the metrics include
  the collapse diagnostics of the step's rollout scored by the policy that
  played it (``diagnostics.collapse``), and every ``gradients_every`` steps
  the policy gradient split by term and bucket (``gradient_split``).
  """
  b, algo = spec.rollout.batch, spec.algo
  if b % algo.minibatches:
    raise ValueError(
      f"algo: minibatches={algo.minibatches} must divide the "
      f"{b} episodes of a step"
    )
  held = held_groups(spec) * spec.rollout.group_size
  on_rollout = sharding.batch_constraint(mesh, b)
  parts = [sharding.batch_constraint(mesh, n) for n in part_sizes(spec)]
  on_part = lambda tree: functools.reduce(lambda t, f: f(t), parts, tree)
  on_held = sharding.batch_constraint(mesh, held)
  on_batch = lambda tree: on_held(on_part(on_rollout(tree)))
  on_minibatch = sharding.batch_constraint(mesh, b // algo.minibatches)

  def step(state: TrainState, codec: Codec):
    k_roll, k_perm = step_keys(state)
    p = prepare(spec, state, codec, k_roll, on_batch)
    new_state, stats = update(
      spec, state, codec, p.batch, p.selection.row_keep, k_perm, on_minibatch
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
        spec.rollout.group_size,
        algo,
      )
      metrics.update(
        diagnostics.part_metrics(
          spec.env, p.traj, p.scored, p.selection, spec.rollout.group_size
        )
      )
    metrics["train/nonfinite_streak"] = new_state.nonfinite.astype(jnp.float32)
    if spec.diagnostics is not None:
      with jax.named_scope("diagnostics"):
        metrics.update(diagnose(spec, state, codec, p))
    return new_state, metrics

  return sharding.traced_for(mesh, step)
