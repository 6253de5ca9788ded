"""Supervised warm start: imitate shortest solutions, in the rollout's own
format, before reinforcement learning.

Each SFT step draws new training levels exactly as a rollout does, asks the
environment's breadth-first planner (``env.plan``) for a shortest solution
of each (or, ``expert="random_valid"``, draws random valid actions), and
lets a scripted policy spell it out as replies
(``max_actions_per_turn`` actions a turn, ``" || "`` between them, closed by
``</answer>``) while the real rollout plays them. An environment with
free-text answers gives its solution instead (``env.solution``: Countdown's
expression, QA's answer), spelled piece by piece from its answer alphabet
in the first turn's reply. The tokens are therefore
exactly those an RL rollout would hold for those replies, prompts and
rewards included. The policy is trained by cross-entropy on the reply
tokens, under the temperature and allowed-token mask it samples with.

``expert="world_model"`` needs no solution (SPA, arXiv 2510.15047, on
RAGEN): a random valid player's episodes of ``max_turns`` turns, and the
policy learns the environment's dynamics by predicting every later turn's
prompt (the observation after its actions) from what came before, besides
the random replies themselves (the answer format and what is valid).
``expert="search"`` needs no planner either: each level is played
``search_tries`` times by the random valid player (the environment's own
``step``, no model), and the shortest episode that succeeded is imitated
as a planner's would be; levels where none succeeded are left out.

In think mode (a pretrained model that reasons first) each expert reply
opens with reasoning (``reasoning``). ``"own"``: the first turn is
sampled from the initial policy (the train state's ``reference``) for up
to ``reasoning_tokens`` tokens (cut before any ``</think>`` or stop
token), then the script closes it and answers; the whole reply is
imitated, teaching a model that rambles to stop and answer in the format.
(Sampled from the policy being trained instead, the reasoning collapsed:
each step closed ``</think>`` sooner, SmolLM2-135M on FrozenLake from 26
tokens at step 1 to 0 at step 12.) ``"board"``: every turn's reply opens
with reasoning the environment writes from its state and the plan
(``env.think``).

In the driver the SFT steps come first (``config.sft.steps``); the RL steps
follow from the policy they leave, with a fresh optimizer state.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Literal

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import envs
from starpo_jax import settings, sharding
from starpo_jax.agent import mixture
from starpo_jax.agent.codec import Codec
from starpo_jax.agent.rollout import RolloutConfig, Trajectory
from starpo_jax.algo import prefix as prefix_lib
from starpo_jax.algo.batch import at_length
from starpo_jax.algo.experts import (
  ExpertPlay,
  Replies,
  expert_trajectories,
  own_reasoning,
  solution_width,
)
from starpo_jax.algo.logprobs import (
  generated_positions,
  pack_generated,
  sequence_logprobs,
)
from starpo_jax.algo.spec import Distribution
from starpo_jax.algo.state import TrainState
from starpo_jax.algo.update import apply_gradients, passes
from starpo_jax.models.attention import TurnWindow

Expert = Literal["planner", "search", "random_valid", "world_model"]


@dataclasses.dataclass(frozen=True)
class SftConfig:
  """The warm start: ``steps`` updates on ``episodes`` expert episodes of
  up to ``max_turns`` turns each.

  Measured on Sokoban with the tiny model: imitating whole five-turn
  episodes taught the answer format but nothing of the board (the action
  tokens' loss stayed at log 4 after 150 steps of 128 episodes), while
  first turns alone (``max_turns=1``, contexts a fifth as long, so each
  step is cheaper) reached 52% held-out success in 300 steps of 256,
  played as whole episodes.
  """

  steps: int = 0
  episodes: int = 256
  max_turns: int = 1
  lr: float = 1e-3
  warmup_steps: int = 0
  # "planner": shortest solutions (env.plan). "random_valid": uniformly
  # random valid actions, which teach the answer format and what is valid
  # in a state (the bandit's two offered arm names) but nothing of what is
  # good, leaving that to RL. "world_model": random valid episodes of
  # max_turns (>= 2) turns, learning to predict each next observation.
  # "search": the shortest success among search_tries random valid
  # episodes of each level (no planner: the environment's step alone).
  expert: Expert = "planner"
  search_tries: int = 64
  # Whose replies are imitated: every expert episode's, or only those that
  # succeeded (random valid play filtered by the environment's own success:
  # no planner needed). The world model predicts observations of all.
  keep: Literal["all", "successes"] = "all"
  # Think mode: what each expert reply reasons before its answer. "own":
  # the initial model's own sampled reasoning, at most reasoning_tokens
  # tokens (first turns: sft.max_turns=1). "board": reasoning the
  # environment writes from the state each turn starts in and the plan
  # (env.think: where the player, the goal and what is in the way are,
  # where the turn's actions lead), in every turn of the expert's episode.
  reasoning: Literal["own", "board"] = "own"
  reasoning_tokens: int = 32

  def __post_init__(self) -> None:
    settings.check(self, "sft")
    for name in ("steps", "warmup_steps", "reasoning_tokens"):
      if getattr(self, name) < 0:
        raise ValueError(f"sft: {name} must be >= 0")
    for name in ("episodes", "max_turns", "search_tries"):
      if getattr(self, name) < 1:
        raise ValueError(f"sft: {name} must be >= 1")
    if self.lr <= 0:
      raise ValueError(f"sft: lr={self.lr} must be positive")
    if self.expert == "world_model" and self.max_turns < 2:
      raise ValueError(
        "sft: expert='world_model' predicts the next turn's observation; "
        f"max_turns={self.max_turns} leaves none (set sft.max_turns >= 2)"
      )


def episodes_config(
  rollout_cfg: RolloutConfig, sft_cfg: SftConfig, codec: Codec
) -> RolloutConfig:
  """How the expert episodes are played: the rollout's rules, one episode
  per level, greedy (the script decides), ``sft_cfg.max_turns`` turns in
  a context just long enough for them."""
  turns = min(sft_cfg.max_turns, rollout_cfg.max_turns)
  return dataclasses.replace(
    rollout_cfg,
    env_groups=sft_cfg.episodes,
    group_size=1,
    temperature=0.0,
    max_turns=turns,
    max_context=min(
      rollout_cfg.max_context, mixture.needed(codec, rollout_cfg, turns)
    ),
  )


def check(
  env: Any,
  rollout_cfg: RolloutConfig,
  replies: Replies,
  expert: str,
  reasoning_tokens: int = 0,
  reasoning: str = "own",
) -> None:
  """Raises ``ValueError`` naming what stops the warm start from working
  (``env``: an environment ``envs.batched`` takes; ``reasoning``:
  ``sft.reasoning``)."""
  name = env.spec.name
  env = envs.batched(env).jittable
  if env is None:
    raise ValueError(
      f"sft: {name!r} is a Python environment (envs.host); the warm start "
      "plays its experts inside the compiled step, on jittable "
      "environments only: set sft.steps=0, or warm start on a jittable "
      "environment and start from that run with train.init_from"
    )
  _check_expert(env, name, expert)
  if reasoning == "board":
    if not rollout_cfg.enable_think:
      raise ValueError(
        "sft: reasoning='board' writes reasoning before each answer, in "
        "think mode: set rollout.enable_think=True"
      )
    if not hasattr(env, "think") or replies.thought is None:
      raise ValueError(
        f"sft: environment {name!r} writes no reasoning about its board "
        "(env.think); use sft.reasoning='own'"
      )
    if env.spec.text_answers or expert == "world_model":
      what = (
        "a free-text answer" if env.spec.text_answers else "the world model"
      )
      raise ValueError(
        f"sft: reasoning='board' explains a plan's actions; {what} has "
        "none: use sft.reasoning='own'"
      )
  elif rollout_cfg.enable_think and rollout_cfg.max_turns > 1:
    raise ValueError(
      "sft: in think mode the warm start imitates first turns (the "
      "policy's own reasoning, then the expert's answer): set "
      "sft.max_turns=1, or sft.reasoning='board' (reasoning written from "
      "each turn's board)"
    )
  if rollout_cfg.enable_think and expert == "world_model":
    raise ValueError(
      "sft: expert='world_model' needs rollout.enable_think=False"
    )
  written = rollout_cfg.enable_think and reasoning == "own"
  _check_reply_fits(env, rollout_cfg, replies, reasoning_tokens, written)


def _check_expert(env: Any, name: str, expert: str) -> None:
  """Raises ``ValueError`` where ``env`` has nothing for ``expert``."""
  if env.spec.text_answers:
    if expert != "planner":
      raise ValueError(
        f"sft: {name!r} takes free-text answers; sft.expert={expert!r} "
        "plays actions: use sft.expert='planner' (the environment's "
        "solution)"
      )
    if not hasattr(env, "solution"):
      raise ValueError(
        f"sft: environment {name!r} takes free-text answers and has no "
        "solution (env.solution) to imitate; set sft.steps=0"
      )
  elif expert == "planner" and not hasattr(env, "plan"):
    raise ValueError(
      f"sft: environment {name!r} has no planner (env.plan) to "
      "imitate; sft.expert='search' imitates the shortest of many random "
      "successes"
    )


def _check_reply_fits(
  env: Any,
  rollout_cfg: RolloutConfig,
  replies: Replies,
  reasoning_tokens: int,
  own: bool,
) -> None:
  """Raises ``ValueError`` where the expert's reply outgrows the reply
  budget (``rollout.max_new_tokens``), with ``reasoning_tokens`` of the
  model's ``own`` reasoning first. (Reasoning written from the board
  varies by state: a reply it takes past the budget is not imitated.)"""
  if env.spec.text_answers:
    pieces = solution_width(env)
    need, what = replies.turn_tokens(pieces), f"an answer of {pieces} pieces"
  else:
    actions = rollout_cfg.max_actions_per_turn
    need = replies.turn_tokens(actions)
    what = f"a reply of {actions} actions (rollout.max_actions_per_turn)"
  if own:
    need += reasoning_tokens
    what += (
      f" after {reasoning_tokens} of reasoning (rollout.enable_think, "
      "sft.reasoning_tokens)"
    )
  budget = rollout_cfg.max_new_tokens
  if need > budget:
    raise ValueError(
      f"sft: {what} takes up to {need} tokens; "
      f"rollout.max_new_tokens={budget} is less"
    )


def imitation_loss(
  params: Any,
  policy_def: Any,
  traj: Trajectory,
  size: int,
  dist: Distribution,
  chunk: int,
  keep: jax.Array,
  plan: prefix_lib.Plan | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean negative log-likelihood of the expert's reply tokens under the
  policy's sampling distribution ``dist``, in the episodes ``keep [B]``
  marks, each token seeing the turns ``dist`` shows (as the rollout
  will), the prompt they share computed once under ``plan``
  (``algo.prefix``; None: each episode whole).

  Args:
    size: the generated tokens' slots a row (``max_generated``).
    chunk: the vocabulary rows the loss head takes at once
      (``algo.logits_chunk``).
  """
  positions, mask = pack_generated(traj, size)
  mask = mask & keep[:, None]
  model = nnx.merge(policy_def, params)
  window = dist.context(traj.turn_ids)
  logp = _logprobs(
    model, traj.tokens, positions, mask, dist, chunk, window, plan
  )
  m = mask.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(m), 1.0)
  loss = -jnp.sum(logp * m) / count
  return loss, {"loss": loss, "token_prob": jnp.sum(jnp.exp(logp) * m) / count}


def _logprobs(
  model, tokens, positions, mask, dist: Distribution, chunk, window, plan
) -> jax.Array:
  """``sequence_logprobs`` of the tokens at ``positions [B, G]``; under a
  ``plan``, the rows' shared prompt once and each row's own tokens at the
  shortest suffix length that holds its ``mask``ed ones."""
  if plan is None:
    return sequence_logprobs(
      model, tokens, positions, dist.temperature, dist.allowed, chunk, window
    )[0]
  prefix, lengths, needed, cut = passes(plan, tokens, positions, mask, 0)
  logp = lambda t, n: sequence_logprobs(
    model,
    t,
    positions,
    dist.temperature,
    dist.allowed,
    chunk,
    shared=plan.shared(prefix, n),
  )[0]
  return at_length(lengths, needed, logp, tokens, cut)[0]


def changed_tokens(traj: Trajectory) -> jax.Array:
  """``[B, L]`` bool: the later turns' prompt tokens that differ from the
  previous turn's prompt at the same distance from its end (prompts end
  alike, so a board of fixed size lines up cell by cell); a token with no
  counterpart there (the first later prompt opens with the end of a reply,
  which the first does not) counts as unchanged."""
  length = traj.tokens.shape[1]
  k_max = traj.turn_played.shape[1]
  prompt_of = (traj.turn_ids[:, None, :] == jnp.arange(k_max)[:, None]) & (
    ~traj.loss_mask[:, None, :]
  )  # [B, K, L]
  at = jnp.arange(length)
  end = jnp.max(jnp.where(prompt_of, at, -1), axis=-1)  # [B, K]
  start = jnp.min(jnp.where(prompt_of, at, length), axis=-1)
  turn = jnp.clip(traj.turn_ids, 0, k_max - 1)
  before = jnp.maximum(turn - 1, 0)
  pick = lambda a, k: jnp.take_along_axis(a, k, axis=1)
  there = pick(end, before) - (pick(end, turn) - at)
  twin = pick(traj.tokens, jnp.clip(there, 0, length - 1))
  has = there >= pick(start, before)
  later = (traj.turn_ids >= 1) & ~traj.loss_mask
  return later & has & (twin != traj.tokens)


def world_model_loss(
  params: Any,
  policy_def: Any,
  traj: Trajectory,
  chunk: int,
  keep: jax.Array,
  window: TurnWindow | None = None,
  plan: prefix_lib.Plan | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Negative log-likelihood of every later turn's prompt (what the
  environment showed after the actions) and of the replies (of the
  episodes ``keep [B]`` marks), unscaled and over the whole vocabulary:
  the observations are not answers. Two means, summed: over the prompt
  tokens that changed since the previous turn (``changed_tokens``: the
  player's cells), and over the rest, so that the few tokens the actions
  decide weigh as much as the many a copy gets right.

  Metrics: ``next_obs_prob``, the mean probability of the prompt tokens,
  ``next_obs_changed_prob``, of the changed ones, and ``next_obs_exact``,
  the fraction of later turns whose every prompt token has probability
  above 1/2 (greedy decoding would write it).
  """
  prompt = (traj.turn_ids >= 1) & ~traj.loss_mask
  mask = prompt | (traj.loss_mask & keep[:, None])
  size = traj.tokens.shape[1]
  positions = generated_positions(mask, size)
  slots = jnp.arange(size) < jnp.sum(mask, 1)[:, None]
  model = nnx.merge(policy_def, params)
  unscaled = Distribution(1.0)
  logp = _logprobs(
    model, traj.tokens, positions, slots, unscaled, chunk, window, plan
  )
  # Back to token positions, to read the prompts' tokens turn by turn.
  rows = jnp.arange(logp.shape[0])[:, None]
  at = jnp.where(slots, positions, size)
  full = lambda v: (
    jnp.zeros(traj.tokens.shape, jnp.float32).at[rows, at].set(v, mode="drop")
  )
  nll, prob = full(-logp), full(jnp.exp(logp))
  changed = changed_tokens(traj)
  mean = lambda v, w: jnp.sum(v * w) / jnp.maximum(jnp.sum(w), 1.0)
  c = changed.astype(jnp.float32)
  loss = mean(nll, c) + mean(nll, (mask & ~changed).astype(jnp.float32))
  p = prompt.astype(jnp.float32)
  m = slots.astype(jnp.float32)
  turns = jnp.arange(1, traj.turn_played.shape[1])
  in_turn = prompt[:, None, :] & (traj.turn_ids[:, None, :] == turns[:, None])
  shown = jnp.any(in_turn, axis=-1)
  exact = shown & jnp.all(~in_turn | (prob[:, None, :] > 0.5), axis=-1)
  return loss, {
    "loss": loss,
    "token_prob": jnp.sum(jnp.exp(logp) * m) / jnp.maximum(jnp.sum(m), 1.0),
    "next_obs_prob": mean(prob, p),
    "next_obs_changed_prob": mean(prob, c),
    "next_obs_exact": jnp.sum(exact) / jnp.maximum(jnp.sum(shown), 1),
  }


def _objective(
  expert: str,
  policy_def: Any,
  traj: Trajectory,
  keep: jax.Array,
  max_generated: int,
  dist: Distribution,
  logits_chunk: int,
  plan: prefix_lib.Plan | None = None,
):
  """Whether any token trains, and ``params -> (loss, stats)``: the
  world model's loss for ``expert="world_model"``, else imitation; each
  token seeing what it sees in the rollout (``dist.context``), the
  episodes' shared prompt once under ``plan``."""
  if expert == "world_model":
    window = dist.context(traj.turn_ids)
    return jnp.any(traj.loss_mask), lambda p: world_model_loss(
      p, policy_def, traj, logits_chunk, keep, window, plan
    )
  return jnp.any(traj.loss_mask & keep[:, None]), lambda p: imitation_loss(
    p, policy_def, traj, max_generated, dist, logits_chunk, keep, plan
  )


@dataclasses.dataclass(frozen=True)
class WarmStartSpec:
  """The static pieces of the warm-start step (as ``StepSpec`` is the RL
  step's): the environment whose experts it imitates (an environment
  ``envs.batched`` takes; the warm start needs a jittable one; or a
  ``Mixture`` of them), how episodes are played (``rollout``), its own
  settings (``sft``), the policy's definition and optimizer, the replies
  the script spells (a tuple, a part's each, for a ``Mixture``), the
  logits' chunk (``algo.logits_chunk``), and whether the episodes' shared
  prompt is computed once (``algo.share_prefix``, at ``length_buckets``
  suffix lengths: ``algo.prefix``)."""

  env: Any
  rollout: RolloutConfig
  sft: SftConfig
  policy_def: Any
  tx: optax.GradientTransformation
  replies: Replies | tuple[Replies, ...]
  logits_chunk: int
  share_prefix: prefix_lib.Setting = "off"
  length_buckets: int = 1


def make_sft_step(spec: WarmStartSpec, codec: Any, mesh: Any = None):
  """Builds ``step(state, codec) -> (state, metrics)`` (jit it), one
  supervised update of the policy on new expert episodes.

  Args:
    codec: the host's codec (its static sizes fix the context); the step
      takes the codec as an argument like the RL step.
  """
  sft_cfg = spec.sft
  cfg = episodes_config(spec.rollout, sft_cfg, codec)
  parts = warm_parts(spec.env, spec.replies, cfg)
  for env, replies, part_cfg in parts:
    check(
      env,
      part_cfg,
      replies,
      sft_cfg.expert,
      sft_cfg.reasoning_tokens,
      sft_cfg.reasoning,
    )
  sizes = {cfg.batch} | {part_cfg.batch for _, _, part_cfg in parts}
  constraints = [sharding.batch_constraint(mesh, n) for n in sizes]
  on_batch = lambda tree: functools.reduce(lambda t, f: f(t), constraints, tree)

  def step(state: TrainState, codec: Any):
    key = jax.random.fold_in(state.key, state.step)
    codecs = mixture.part_codecs(codec)
    played = [
      _expert_episodes(
        spec,
        state,
        c,
        jax.random.fold_in(key, i) if len(parts) > 1 else key,
        part,
        on_batch,
      )
      for i, (c, part) in enumerate(zip(codecs, parts, strict=True))
    ]
    traj, found, reasoning = mixture.join(played)
    keep = traj.success if sft_cfg.keep == "successes" else traj.length > 0
    keep = keep & found
    live, objective = _objective(
      sft_cfg.expert,
      spec.policy_def,
      traj,
      keep,
      cfg.max_generated,
      dataclasses.replace(
        Distribution.of(cfg, codec), temperature=spec.rollout.temperature
      ),
      spec.logits_chunk,
      _plan(spec, state, codec, cfg, traj.tokens.shape[0]),
    )
    grad_fn = jax.value_and_grad(objective, has_aux=True)
    params, opt, stats, finite = apply_gradients(
      spec.tx, grad_fn, state.policy, state.policy_opt, live
    )
    return _updated(state, params, opt, finite, stats, traj, keep, reasoning)

  return sharding.traced_for(mesh, step)


def _plan(spec, state, codec, cfg, rows: int) -> prefix_lib.Plan | None:
  """The warm start's prompt sharing: its ``rows`` episodes (each of a
  level of its own) one unit, whose system prompt runs once."""
  return prefix_lib.plan(
    spec.share_prefix,
    nnx.merge(spec.policy_def, state.policy),
    codec,
    cfg,
    rows,
    spec.length_buckets,
    Distribution.of(cfg, codec).window,
    levels=True,
  )


def warm_parts(
  env: Any, replies: Any, cfg: RolloutConfig
) -> list[tuple[Any, Replies, RolloutConfig]]:
  """The environments the warm start plays, with their replies and
  settings: ``env`` with ``cfg``, or each part of a ``Mixture`` (its
  ``replies`` a tuple in the parts' order) with ``sft.episodes`` shared
  in proportion to the parts' groups."""
  if not isinstance(env, mixture.Mixture):
    return [(env, replies, cfg)]
  out = []
  for part, part_replies in zip(env.parts, replies, strict=True):
    episodes, left = divmod(cfg.env_groups * part.groups, env.groups)
    unit = env.groups // math.gcd(env.groups, part.groups)
    if left or not episodes:
      raise ValueError(
        f"sft: episodes={cfg.env_groups} cannot be shared among the "
        f"mixture's parts in proportion to their groups ({env.describe()}): "
        f"choose a multiple of {unit}"
      )
    part_cfg = dataclasses.replace(cfg, env_groups=episodes)
    out.append((part.env, part_replies, part_cfg))
  return out


def _expert_episodes(spec, state, codec, key, part, on_batch):
  """One environment's expert episodes (``expert_trajectories``), whether
  the expert had actions for each, and, in think mode, the policy's own
  reasoning they open with (else None)."""
  env, replies, cfg = part
  env = envs.batched(env).jittable
  reasoning = None
  board = spec.rollout.enable_think and spec.sft.reasoning == "board"
  if spec.rollout.enable_think and not board:
    reasoning = own_reasoning(
      nnx.merge(spec.policy_def, state.reference),
      codec,
      env,
      cfg,
      key,
      spec.sft.reasoning_tokens,
      spec.rollout.temperature,
    )
  traj, found = expert_trajectories(
    env,
    codec,
    replies,
    cfg,
    key,
    on_batch,
    ExpertPlay(spec.sft.expert, spec.sft.search_tries, board),
    reasoning,
  )
  return traj, found, reasoning


def _updated(state, params, opt, finite, stats, traj, keep, reasoning):
  """The train state after a warm-start update, and the step's metrics."""
  nonfinite = jnp.where(finite, 0, state.nonfinite + 1)
  new_state = state.replace(
    step=state.step + 1, policy=params, policy_opt=opt, nonfinite=nonfinite
  )
  metrics = {f"sft/{k}": v for k, v in stats.items()}
  metrics["sft/expert_success"] = jnp.mean(traj.success)
  metrics["sft/kept"] = jnp.mean(keep)
  if reasoning is not None:
    metrics["sft/own_reasoning_tokens"] = jnp.mean(reasoning[1] * 1.0)
  metrics["train/skipped_nonfinite"] = (~finite).astype(jnp.float32)
  metrics["train/nonfinite_streak"] = nonfinite.astype(jnp.float32)
  return new_state, metrics
