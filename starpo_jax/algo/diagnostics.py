"""Metrics computed on device: episode statistics of a rollout, the
per-step training metrics (rewards, their in-group spread, entropy,
filtering, losses, clipping, gradient norms, the critic's fit) and the
collapse diagnostics of RAGEN-2.

Collapse diagnostics (``collapse/*``). RAGEN's echo trap is visible in
entropy and reward spread; RAGEN-2's *template collapse* is not: replies
stay varied but stop depending on the input. It is measured by scoring
every sampled first-turn reply ``z_i`` under every group's first prompt
``x_j`` (a ``[B, G]`` log-likelihood matrix ``l[i, j] = log p(z_i | x_j)``,
per reply token) and asking how much the prompt that produced a reply
explains it:

- ``mi``: ``mean_i(l[i, g(i)] - logmeanexp_j l[i, j])``, the mutual
  information between prompt and reply under the batch's uniform prompt
  mixture, at most ``mi_bound = log G``; ``mi_seq`` the same on summed
  (not per-token) log-likelihoods. Near 0: template collapse.
- ``conditional_entropy`` ``-mean l[i, g(i)]`` (``H(Z|X)``, per token; its
  fall alone is ordinary entropy collapse) and ``marginal_entropy``
  ``-mean logmeanexp_j l[i, j]`` (``H(Z) = H(Z|X) + I(X;Z)``).
- ``retrieval@k``: how often the true prompt is among the ``k`` that
  explain the reply best (ties go to the lower group index), beside
  ``retrieval_chance@k = min(k, G) / G``.
- ``mi_zscore``: the mean matched-minus-marginal gap over the spread
  (population std) of the marginal log-likelihoods.

Reference: RAGEN-2's ``CollapseDetector``
(mll-lab-nu/RAGEN, ``ragen/trainer/collapse_metrics.py``), first-turn
sampling. The whole reply is scored (reasoning and answer; the tiny model
answers without ``<think>``). Prompts are the groups' first observations:
members of a group share their level.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from starpo_jax import settings
from starpo_jax.agent import mixture
from starpo_jax.agent.rollout import Trajectory
from starpo_jax.algo import advantages as adv_lib
from starpo_jax.algo import filtering, losses


def summary(traj: Trajectory, group_size: int) -> dict[str, jax.Array]:
  """Episode statistics of a rollout (scalars): success, pass@group,
  return, actions, turns and tool calls per episode, per-turn rates of
  valid, effective and well-formed answers, and what ended episodes
  early."""
  played = traj.turn_played
  turns = jnp.maximum(jnp.sum(played), 1)
  groups = traj.success.reshape(-1, group_size)
  return {
    "success": jnp.mean(traj.success),
    f"pass@{group_size}": jnp.mean(jnp.any(groups, axis=1)),
    "return": jnp.mean(traj.episode_return),
    "num_actions": jnp.mean(traj.num_actions),
    "num_turns": jnp.mean(jnp.sum(played, axis=1)),
    "valid_action_rate": jnp.sum(traj.turn_valid) / turns,
    "effective_action_rate": jnp.sum(traj.turn_effective) / turns,
    "format_rate": jnp.sum(traj.turn_format_ok) / turns,
    "response_length": jnp.sum(traj.response_lengths) / turns,
    # Tokens of reasoning (before "</think>") per well-formed turn.
    "think_tokens": jnp.sum(traj.turn_think_tokens)
    / jnp.maximum(jnp.sum(traj.turn_format_ok & played), 1),
    "truncated": jnp.mean(traj.truncated),
    "context_truncated": jnp.mean(traj.context_truncated),
    # Python environments (envs.host): faults that ended an episode, and
    # observations cut to their token budget, per episode.
    "env_error": jnp.mean(traj.env_error),
    "obs_truncated": jnp.mean(traj.obs_truncated),
    # Tool calls (envs.tools) per episode.
    "tool_calls": jnp.mean(jnp.sum(traj.turn_tool, axis=1)),
    **decode_waste(traj),
  }


def decode_waste(traj: Trajectory) -> dict[str, jax.Array]:
  """Shares of the rollout's decode slots (a row in a decode iteration)
  that produced no token, had the batch decoded in lockstep:
  ``decode_finished_reply``, of an episode playing the turn whose reply
  had closed (the turn decodes until its longest reply ends);
  ``decode_finished_episode``, of an episode that had ended or did not
  play the turn. ``decode_idle``: the share of the slots actually decoded
  (fewer with ``rollout.decode_shrinks``) that produced no token."""
  steps = traj.decode_steps.astype(jnp.float32)
  slots = jnp.maximum(jnp.sum(steps), 1.0)
  played = traj.turn_played
  reply = jnp.sum(jnp.where(played, steps - traj.response_lengths, 0.0))
  return {
    "decode_finished_reply": reply / slots,
    "decode_finished_episode": jnp.sum(jnp.where(played, 0.0, steps)) / slots,
    "decode_idle": 1.0
    - jnp.sum(traj.response_lengths)
    / jnp.maximum(jnp.sum(traj.decode_slots), 1),
  }


@dataclasses.dataclass(frozen=True)
class DiagnosticsConfig:
  """When the step computes the collapse diagnostics.

  ``collapse_every``: every this many RL steps (counted from the first
  step of the run, warm start included), at the cost of ``env_groups``
  forward passes over one turn of the batch; 0 never.
  ``gradients_every``: the policy gradient split by term and by reward-std
  bucket (``step.gradient_split``) every this many RL steps, at the cost of
  ``3 + buckets`` backward passes over the batch; 0 (the default) never.
  Off by default: a step that computes it costs several plain steps.
  """

  collapse_every: int = 10
  gradients_every: int = 0
  buckets: int = 3

  def __post_init__(self) -> None:
    settings.check(self, "diagnostics")
    for name in ("collapse_every", "gradients_every"):
      if getattr(self, name) < 0:
        raise ValueError(
          f"diagnostics: {name}={getattr(self, name)} must be >= 0"
        )
    if self.buckets < 1:
      raise ValueError(f"diagnostics: buckets={self.buckets} must be >= 1")


COLLAPSE_KS = (1, 2, 4, 8)
# collapse/* and grads/* metrics are in every step's dict; they mean
# something only where their "computed" is 1 (``logged`` drops them
# elsewhere).
PERIODIC = ("collapse", "grads")
EVERY_STEP = (
  "collapse/first_turn_valid_rate",
  "collapse/first_turn_format_rate",
  "collapse/valid_thinking_rate",
)


def first_turn(traj: Trajectory) -> tuple[jax.Array, jax.Array]:
  """Where each episode's first reply starts (= its first prompt's length)
  and how many tokens it has, ``[B]`` each."""
  start = jnp.argmax(traj.loss_mask, axis=1).astype(jnp.int32)
  count = jnp.sum(traj.loss_mask & (traj.turn_ids == 0), axis=1)
  return start, count.astype(jnp.int32)


LogpFn = Callable[[jax.Array, jax.Array], jax.Array]


def cross_loglik(
  logp_fn: LogpFn,
  traj: Trajectory,
  groups: int,
  reply_width: int,
  context: int,
) -> tuple[jax.Array, jax.Array]:
  """Every first reply scored after every group's first prompt.

  Args:
    logp_fn: ``(tokens [B, L], positions [B, R]) -> log-probabilities
      [B, R]`` of the tokens at ``positions`` (the policy's, as sampled).
    reply_width: a static bound on a reply's tokens (``max_new_tokens``).
    context: a static bound on a first prompt and its reply: the scored
      sequences are this long (at most the trajectory's length).

  Returns:
    ``[B, G]`` summed log-likelihoods ``log p(z_i | x_j)`` and the number
    of reply tokens each sums over (prompt and reply are cut at
    ``context``).
  """
  b = traj.tokens.shape[0]
  length = min(context, traj.tokens.shape[1])
  episodes = traj.tokens[:, :length]
  start, count = first_turn(traj)
  count = jnp.minimum(count, length - start)  # what the context holds
  offs = jnp.arange(reply_width)
  replies = jnp.take_along_axis(
    episodes, jnp.minimum(start[:, None] + offs, length - 1), axis=1
  )
  heads = jnp.arange(groups) * (b // groups)
  pos = jnp.arange(length)

  def under_prompt(j):
    prompt, p = episodes[heads[j]], start[heads[j]]
    at = pos - p  # [L] index into the reply
    in_reply = (at >= 0) & (at < count[:, None])  # [B, L]
    reply_tok = jnp.take(replies, jnp.clip(at, 0, reply_width - 1), axis=1)
    tokens = jnp.where(in_reply, reply_tok, jnp.where(pos < p, prompt, 0))
    mask = (offs < count[:, None]) & (p + offs < length)
    positions = jnp.broadcast_to(jnp.minimum(p + offs, length - 1), mask.shape)
    logp = logp_fn(tokens, positions)
    return jnp.sum(jnp.where(mask, logp, 0.0), 1), jnp.sum(mask, 1)

  total, n = jax.lax.map(under_prompt, jnp.arange(groups))
  return total.T, n.T


def collapse_metrics(
  total: jax.Array, n: jax.Array, group_size: int
) -> dict[str, jax.Array]:
  """The ``collapse/*`` metrics of a ``[B, G]`` log-likelihood matrix
  (summed over ``n`` reply tokens); replies with no token are left out."""
  b, g = total.shape
  per_token = total / jnp.maximum(n, 1)
  own = jnp.arange(b) // group_size
  valid = (jnp.take_along_axis(n, own[:, None], 1)[:, 0] > 0).astype(
    jnp.float32
  )
  mean = lambda x: jnp.sum(x * valid) / jnp.maximum(jnp.sum(valid), 1.0)

  def family(ll):
    matched = jnp.take_along_axis(ll, own[:, None], 1)[:, 0]
    marginal = jax.nn.logsumexp(ll, axis=1) - math.log(g)
    return matched, marginal

  matched, marginal = family(per_token)
  matched_seq, marginal_seq = family(total)
  gap = mean(matched - marginal)
  spread = jnp.sqrt(mean(jnp.square(marginal - mean(marginal))))
  better = per_token > matched[:, None]
  tied_before = (per_token == matched[:, None]) & (
    jnp.arange(g)[None] < own[:, None]
  )
  rank = jnp.sum(better | tied_before, axis=1)
  out = {
    "collapse/mi": gap,
    "collapse/mi_bound": jnp.asarray(math.log(g), jnp.float32),
    "collapse/mi_seq": mean(matched_seq - marginal_seq),
    "collapse/conditional_entropy": -mean(matched),
    "collapse/marginal_entropy": -mean(marginal),
    "collapse/conditional_entropy_seq": -mean(matched_seq),
    "collapse/marginal_entropy_seq": -mean(marginal_seq),
    "collapse/mi_zscore": gap / (spread + 1e-3),
    "collapse/scored_replies": jnp.sum(valid),
  }
  for k in COLLAPSE_KS:
    out[f"collapse/retrieval@{k}"] = mean(
      (rank < min(k, g)).astype(jnp.float32)
    )
    out[f"collapse/retrieval_chance@{k}"] = jnp.asarray(
      min(k, g) / g, jnp.float32
    )
  return out


def collapse(
  logp_fn: LogpFn,
  traj: Trajectory,
  groups: int,
  reply_width: int,
  context: int,
  when: jax.Array,
) -> dict[str, jax.Array]:
  """``collapse_metrics`` of the rollout where ``when`` holds (``periodic``),
  and on every step the first-turn rates and the valid-thinking rate (turns
  whose reply matched the format with a non-blank ``<think>``; 0 for
  models that answer without one)."""

  def compute():
    total, n = cross_loglik(logp_fn, traj, groups, reply_width, context)
    return collapse_metrics(total, n, traj.tokens.shape[0] // groups)

  out = periodic(compute, when, "collapse")
  out["collapse/first_turn_valid_rate"] = jnp.mean(traj.turn_valid[:, 0])
  out["collapse/first_turn_format_rate"] = jnp.mean(traj.turn_format_ok[:, 0])
  played = jnp.maximum(jnp.sum(traj.turn_played), 1)
  out["collapse/valid_thinking_rate"] = jnp.sum(traj.turn_thought) / played
  return out


def periodic(compute: Callable[[], dict], when: jax.Array, prefix: str):
  """``compute()`` where ``when`` holds, zeros elsewhere, with
  ``PREFIX/computed`` saying which."""
  shapes = jax.eval_shape(compute)
  skip = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  out = jax.lax.cond(when, compute, skip)
  out[f"{prefix}/computed"] = when.astype(jnp.float32)
  return out


def logged(metrics: dict[str, float]) -> dict[str, float]:
  """The metrics worth writing: the periodic diagnostics only on the steps
  that computed them (``EVERY_STEP`` always)."""
  skipped = tuple(
    f"{p}/" for p in PERIODIC if not metrics.get(f"{p}/computed", 1.0)
  )
  return {
    k: v
    for k, v in metrics.items()
    if not k.startswith(skipped) or k in EVERY_STEP
  }


def std_buckets(group_std: jax.Array, buckets: int) -> jax.Array:
  """Each group's bucket ``[G]`` int32: groups ranked by in-group reward
  std (ties by index) and cut into ``buckets`` near-equal parts, 0 the
  lowest std."""
  g = group_std.shape[0]
  rank = jnp.argsort(jnp.argsort(group_std, stable=True), stable=True)
  return (rank * buckets // g).astype(jnp.int32)


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  m = mask.astype(jnp.float32)
  return jnp.sum(x * m) / jnp.maximum(jnp.sum(m), 1.0)


def update_metrics(stats: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Per-minibatch statistics ``[epochs, minibatches]`` averaged over the
  minibatches that trained (``live`` and finite)."""
  stats = {k: v.reshape(-1) for k, v in stats.items()}
  live, skipped = stats.pop("live"), stats.pop("skipped")
  ok = live & ~skipped
  count = jnp.maximum(jnp.sum(ok), 1)
  out = {
    f"train/{k}": jnp.sum(jnp.where(ok, v, 0.0)) / count
    for k, v in stats.items()
  }
  out["train/updates"] = jnp.sum(ok).astype(jnp.float32)
  out["train/skipped_nonfinite"] = jnp.sum(skipped).astype(jnp.float32)
  return out


def explained_variance(
  returns: jax.Array, values: jax.Array, mask: jax.Array
) -> jax.Array:
  """``1 - Var(returns - values) / Var(returns)`` over masked tokens."""
  m = mask.astype(jnp.float32)
  var = lambda x: adv_lib.masked_mean(
    jnp.square(x - adv_lib.masked_mean(x, m)), m
  )
  resid = jnp.where(mask, returns - values, 0.0)
  return 1.0 - var(resid) / jnp.maximum(
    var(jnp.where(mask, returns, 0.0)), 1e-8
  )


def step_metrics(
  traj: Trajectory,
  scored: Any,
  selection: Any,
  batch: Any,
  stats: dict[str, jax.Array],
  group_size: int,
  algo: Any,
) -> dict[str, jax.Array]:
  """The training step's flat metric dict (``step.Scored``,
  ``step.Selection``, ``step.Batch`` and the update's statistics)."""
  metrics = update_metrics(stats)
  metrics.update(
    {f"rollout/{k}": v for k, v in summary(traj, group_size).items()}
  )
  groups = selection.group_scores.shape[0]
  spread = filtering.group_scores(
    "reward_std", scored.scores, scored.lengths, scored.episode_entropy, groups
  )
  metrics.update(
    {
      "rollout/in_group_reward_std": jnp.mean(spread),
      "rollout/in_group_reward_std_min": jnp.min(spread),
      "rollout/in_group_reward_std_max": jnp.max(spread),
      "rollout/entropy": _masked_mean(scored.entropy, scored.mask),
      "rollout/generated_tokens": jnp.sum(traj.response_lengths).astype(
        jnp.float32
      ),
      "filter/kept_ratio": selection.kept_fraction,
      "filter/over_capacity": selection.over_capacity.astype(jnp.float32),
    }
  )
  if algo.uses_reference:
    # Over the trained tokens: the reference scores only the held groups.
    kl = losses.kl(batch.old_logp, batch.ref_logp, algo.kl_estimator)
    metrics["rollout/kl_to_reference"] = _masked_mean(kl, batch.mask)
  if algo.uses_critic:
    metrics["train/explained_variance"] = explained_variance(
      batch.returns, batch.values, batch.mask
    )
  return metrics


def part_metrics(
  env: Any,
  traj: Trajectory,
  scored: Any,
  selection: Any,
  group_size: int,
) -> dict[str, jax.Array]:
  """Where ``env`` is a ``Mixture``, each part's rollout statistics
  (``rollout/{tag}/...``: ``summary`` of its episodes and its groups'
  reward spread) and the share of its groups the filter kept
  (``filter/{tag}/kept_ratio``); nothing for one environment. The filter
  ranks the groups of every part together."""
  if not isinstance(env, mixture.Mixture):
    return {}
  out = {}
  for tag, start, stop in env.rows(group_size):
    part = mixture.slice_rows(traj, start, stop)
    for k, v in summary(part, group_size).items():
      out[f"rollout/{tag}/{k}"] = v
    groups = slice(start // group_size, stop // group_size)
    spread = filtering.group_scores(
      "reward_std",
      scored.scores[start:stop],
      scored.lengths[start:stop],
      scored.episode_entropy[start:stop],
      groups.stop - groups.start,
    )
    out[f"rollout/{tag}/in_group_reward_std"] = jnp.mean(spread)
    kept = selection.keep_group[groups].astype(jnp.float32)
    out[f"filter/{tag}/kept_ratio"] = jnp.mean(kept)
  return out
