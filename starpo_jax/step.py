"""The one compiled training step: rollout -> rewards -> filter ->
advantages -> epochs x minibatches of the clipped policy (and value)
update -> (state, metrics).

  step = make_step(...)                    # static pieces closed over
  step = jax.jit(step, donate_argnums=0)
  state, metrics = step(state, codec)      # codec: the text tables

Parameters live in the ``TrainState`` (an argument), never in the closure.
The RNG of step ``n`` is ``fold_in(state.key, n)``, so a resumed run
replays exactly the steps an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from envs import Env
from starpo_jax import advantages as adv_lib
from starpo_jax import evaluate, filtering, losses, sharding
from starpo_jax.rollout import RolloutConfig, Trajectory, rollout
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
  logits_chunk: int = 512  # sequence chunk for log-probabilities

  def __post_init__(self) -> None:
    if self.adv_estimator not in adv_lib.ESTIMATORS:
      raise ValueError(
        f"algo: adv_estimator={self.adv_estimator!r}; expected one of "
        f"{adv_lib.ESTIMATORS}"
      )
    if self.loss_agg not in losses.AGGREGATIONS:
      raise ValueError(
        f"algo: loss_agg={self.loss_agg!r}; expected one of "
        f"{losses.AGGREGATIONS}"
      )
    if self.kl_estimator not in losses.KL_ESTIMATORS:
      raise ValueError(
        f"algo: kl_estimator={self.kl_estimator!r}; expected one of "
        f"{losses.KL_ESTIMATORS}"
      )
    for name in ("epochs", "minibatches", "logits_chunk"):
      if getattr(self, name) < 1:
        raise ValueError(f"algo: {name} must be >= 1")

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


def sequence_logprobs(
  model: Any,
  tokens: jax.Array,
  positions: jax.Array,
  temperature: float,
  allowed: jax.Array | None,
  chunk: int,
  with_values: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """Log-probabilities, entropies (and values) of the generated tokens.

  The backbone runs over the whole sequence; logits are formed only for
  the generated tokens (``positions``), ``chunk`` at a time under
  rematerialisation, so a large vocabulary never needs ``[B, L, V]``.

  Args:
    tokens: ``[B, L]``.
    positions: ``[B, G]`` where the generated tokens are.

  Returns:
    ``logp``, ``entropy`` and, for a critic, the value of the state before
    each generated token, all ``[B, G]``.
  """
  h, _ = model.hidden(tokens)
  # The token at position p is predicted from the hidden state at p - 1.
  before = jnp.maximum(positions - 1, 0)
  h_prev = jnp.take_along_axis(h, before[..., None], axis=1)  # [B, G, D]
  targets = jnp.take_along_axis(tokens, positions, axis=1)
  b, g, d = h_prev.shape
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
  values = model.values(h_prev) if with_values else None
  return unchunk(logp), unchunk(ent), values


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


def _turn_ends(traj: Trajectory) -> jax.Array:
  """[B, L] bool: the last generated token of each turn."""
  mask = traj.loss_mask
  nxt_mask = jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], 1)
  nxt_turn = jnp.concatenate(
    [traj.turn_ids[:, 1:], jnp.full_like(traj.turn_ids[:, :1], -1)], 1
  )
  return mask & ~(nxt_mask & (nxt_turn == traj.turn_ids))


def make_step(
  *,
  env: Env,
  rollout_cfg: RolloutConfig,
  algo: AlgoConfig,
  filter_cfg: filtering.FilterConfig,
  policy_def: Any,
  critic_def: Any,
  policy_tx: optax.GradientTransformation,
  critic_tx: optax.GradientTransformation | None,
  mesh: Any = None,
):
  """Builds ``step(state, codec) -> (state, metrics)`` (jit it).

  With a ``mesh``, episode-batch arrays are sharded over its data and fsdp
  axes (parameters follow the shardings the state arrives with).
  """
  b = rollout_cfg.batch
  groups = rollout_cfg.env_groups
  temperature = rollout_cfg.temperature
  if b % algo.minibatches:
    raise ValueError(
      f"algo: minibatches={algo.minibatches} must divide the "
      f"{b} episodes of a step"
    )
  mb = b // algo.minibatches
  on_batch = sharding.batch_constraint(mesh, b)
  on_minibatch = sharding.batch_constraint(mesh, mb)
  # Most tokens an episode can generate.
  gen = rollout_cfg.max_turns * rollout_cfg.max_new_tokens

  def step(state: TrainState, codec: Codec):
    key = jax.random.fold_in(state.key, state.step)
    k_roll, k_perm = jax.random.split(key)
    policy = nnx.merge(policy_def, state.policy)
    traj = jax.lax.stop_gradient(
      rollout(policy, codec, env, rollout_cfg, k_roll, on_batch)
    )
    # Everything below lives on the generated tokens only: [B, G].
    positions = generated_positions(traj.loss_mask, gen)
    take = lambda x: jnp.take_along_axis(x, positions, axis=1)
    mask = take(traj.loss_mask) & (
      jnp.arange(gen) < jnp.sum(traj.loss_mask, 1)[:, None]
    )
    tokens = traj.tokens
    old_logp = take(traj.logprobs)
    allowed = codec.allowed
    chunk = min(algo.logits_chunk, gen)
    rewards = take(token_rewards(traj, algo.use_turn_scores))
    turn_end = take(_turn_ends(traj)) & mask

    ref_logp = jnp.zeros_like(old_logp)
    if algo.uses_reference:
      reference = nnx.merge(policy_def, state.reference)
      ref_logp, _, _ = sequence_logprobs(
        reference, tokens, positions, temperature, allowed, chunk
      )
      ref_logp = jax.lax.stop_gradient(ref_logp)
    kl_reward = losses.kl(old_logp, ref_logp, algo.kl_estimator) * mask
    if algo.uses_reference and algo.kl_in_reward:
      rewards = rewards - algo.kl_coef * kl_reward
    values = jnp.zeros_like(old_logp)
    if algo.uses_critic:
      critic = nnx.merge(critic_def, state.critic)
      _, _, values = sequence_logprobs(
        critic, tokens, positions, temperature, None, chunk, with_values=True
      )
      values = jax.lax.stop_gradient(values) * mask

    # StarPO-S filtering: whole groups kept or masked.
    scores = jnp.sum(rewards, axis=1)
    entropy = take(traj.entropy)
    ep_entropy = jnp.sum(entropy * mask, 1) / jnp.maximum(jnp.sum(mask, 1), 1)
    group_score = filtering.group_scores(
      filter_cfg.metric, scores, jnp.sum(mask, 1), ep_entropy, groups
    )
    keep_group = filtering.keep_groups(group_score, filter_cfg)
    keep = jnp.repeat(keep_group, b // groups)
    kept_fraction = jnp.mean(keep_group.astype(jnp.float32))
    train_mask = mask & keep[:, None]

    est = algo.adv_estimator
    returns = jnp.zeros_like(old_logp)
    if est == "gae":
      advs, returns = adv_lib.gae(
        rewards, values, train_mask, algo.gamma, algo.lam
      )
    elif est == "bi_level_gae":
      advs, returns = adv_lib.bi_level_gae(
        rewards,
        values,
        train_mask,
        turn_end & train_mask,
        algo.gamma,
        algo.lam,
        algo.turn_gamma,
      )
    elif est == "grpo":
      advs = adv_lib.grpo(scores, train_mask, groups, algo.norm_adv_by_std)
    elif est == "rloo":
      advs = adv_lib.rloo(scores, train_mask, groups)
    elif est == "reinforce_plus_plus":
      advs, returns = adv_lib.reinforce_plus_plus(
        rewards, train_mask, algo.gamma
      )
    else:
      advs = adv_lib.reinforce_plus_plus_baseline(scores, train_mask, groups)
    advs = advs * filtering.loss_scale(kept_fraction, filter_cfg)

    batch = dict(
      tokens=tokens,
      positions=positions,
      mask=train_mask,
      old_logp=old_logp,
      ref_logp=ref_logp,
      adv=advs,
      returns=returns,
      values=values,
    )

    def policy_loss_fn(params, mb_batch):
      model = nnx.merge(policy_def, params)
      logp, ent, _ = sequence_logprobs(
        model,
        mb_batch["tokens"],
        mb_batch["positions"],
        temperature,
        allowed,
        chunk,
      )
      m = mb_batch["mask"]
      pg, stats = losses.policy_loss(
        logp,
        mb_batch["old_logp"],
        mb_batch["adv"],
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
        kl_loss = losses.aggregate(
          losses.kl(logp, mb_batch["ref_logp"], algo.kl_estimator),
          m,
          algo.loss_agg,
        )
        loss = loss + algo.kl_coef * kl_loss
      stats.update(pg_loss=pg, entropy=entropy, kl_loss=kl_loss)
      return loss, stats

    def critic_loss_fn(params, mb_batch):
      model = nnx.merge(critic_def, params)
      _, _, v = sequence_logprobs(
        model,
        mb_batch["tokens"],
        mb_batch["positions"],
        temperature,
        None,
        chunk,
        with_values=True,
      )
      loss, clip_frac = losses.value_loss(
        v,
        mb_batch["values"],
        mb_batch["returns"],
        mb_batch["mask"],
        clip=algo.value_clip,
        aggregation=algo.loss_agg,
      )
      return loss, {"value_loss": loss, "value_clip_frac": clip_frac}

    def apply(tx, loss_fn, params, opt, mb_batch, live):
      def update(params, opt):
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(
          params, mb_batch
        )
        norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(norm)
        updates, new_opt = tx.update(grads, opt, params)
        new_params = optax.apply_updates(params, updates)
        # A non-finite update leaves parameters and optimizer state alone.
        pick = lambda a, b: jax.tree.map(
          lambda x, y: jnp.where(finite, x, y), a, b
        )
        stats = dict(stats, grad_norm=norm)
        return pick(new_params, params), pick(new_opt, opt), stats, finite

      def skip(params, opt):
        # Nothing to train on (every episode filtered out): no work at all.
        shapes = jax.eval_shape(update, params, opt)[2]
        zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
        return params, opt, zeros, jnp.ones((), bool)

      return jax.lax.cond(live, update, skip, params, opt)

    def epoch(carry, k):
      # Shuffle, then move kept episodes to the front so that empty
      # minibatches come last (RAGEN slices the kept episodes instead).
      order = jax.random.permutation(k, b)
      order = order[jnp.argsort(~keep[order], stable=True)]
      shuffled = on_batch(jax.tree.map(lambda x: x[order], batch))
      minis = jax.tree.map(
        lambda x: x.reshape(algo.minibatches, mb, *x.shape[1:]), shuffled
      )

      def minibatch(carry, mb_batch):
        params, opt, c_params, c_opt = carry
        mb_batch = on_minibatch(mb_batch)
        live = jnp.any(mb_batch["mask"])
        params, opt, stats, finite = apply(
          policy_tx, policy_loss_fn, params, opt, mb_batch, live
        )
        if algo.uses_critic:
          c_params, c_opt, c_stats, c_finite = apply(
            critic_tx, critic_loss_fn, c_params, c_opt, mb_batch, live
          )
          c_stats["critic_grad_norm"] = c_stats.pop("grad_norm")
          stats.update(c_stats)
          finite = finite & c_finite
        stats.update(live=live, skipped=live & ~finite)
        return (params, opt, c_params, c_opt), stats

      return jax.lax.scan(minibatch, carry, minis)

    carry = (state.policy, state.policy_opt, state.critic, state.critic_opt)
    (params, opt, c_params, c_opt), stats = jax.lax.scan(
      epoch, carry, jax.random.split(k_perm, algo.epochs)
    )
    stats = jax.tree.map(lambda x: x.reshape(-1), stats)
    live = stats.pop("live")
    skipped = stats.pop("skipped")
    ok = live & ~skipped
    count = jnp.maximum(jnp.sum(ok), 1)
    metrics = {
      f"train/{k}": jnp.sum(jnp.where(ok, v, 0.0)) / count
      for k, v in stats.items()
    }
    any_skipped = jnp.any(skipped)
    metrics.update(
      {
        f"rollout/{k}": v
        for k, v in evaluate.summary(traj, rollout_cfg.group_size).items()
      }
    )
    in_group_std = filtering.group_scores(
      "reward_std", scores, jnp.sum(mask, 1), ep_entropy, groups
    )
    metrics.update(
      {
        "rollout/in_group_reward_std": jnp.mean(in_group_std),
        "rollout/in_group_reward_std_min": jnp.min(in_group_std),
        "rollout/in_group_reward_std_max": jnp.max(in_group_std),
        "rollout/entropy": jnp.sum(entropy * mask)
        / jnp.maximum(jnp.sum(mask), 1),
        "rollout/generated_tokens": jnp.sum(traj.response_lengths).astype(
          jnp.float32
        ),
        "rollout/kl_to_reference": jnp.sum(kl_reward)
        / jnp.maximum(jnp.sum(mask), 1),
        "filter/kept_ratio": kept_fraction,
        "train/updates": jnp.sum(ok).astype(jnp.float32),
        "train/skipped_nonfinite": jnp.sum(skipped).astype(jnp.float32),
      }
    )
    if algo.uses_critic:
      m = train_mask.astype(jnp.float32)
      resid = jnp.where(train_mask, returns - values, 0.0)
      var = lambda x: adv_lib.masked_mean(
        jnp.square(x - adv_lib.masked_mean(x, m)), m
      )
      metrics["train/explained_variance"] = 1.0 - var(resid) / jnp.maximum(
        var(jnp.where(train_mask, returns, 0.0)), 1e-8
      )
    new_state = state.replace(
      step=state.step + 1,
      policy=params,
      policy_opt=opt,
      critic=c_params,
      critic_opt=c_opt,
      nonfinite=jnp.where(any_skipped, state.nonfinite + 1, 0),
    )
    metrics["train/nonfinite_streak"] = new_state.nonfinite.astype(jnp.float32)
    return new_state, metrics

  return step
