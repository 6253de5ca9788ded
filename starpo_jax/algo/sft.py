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
opens with the model's own reasoning: the first turn is sampled from the
initial policy (the train state's ``reference``) for up to
``reasoning_tokens`` tokens (cut before any ``</think>`` or stop token
it wrote), then the script closes it and answers,
``</think><answer>...</answer>``, and the whole reply is imitated. The
warm start teaches a model that rambles to stop and answer in the
format, while what it reasons stays the pretrained model's. Sampled from
the policy being trained instead, the reasoning collapsed: each step's
policy closed ``</think>`` a little sooner, so the next step's prefixes
were shorter (SmolLM2-135M on FrozenLake: 26 tokens at step 1, 0 at
step 12, every held-out reply ``<think></think><answer>...``); imitating
only the answer left nothing holding the reasoning open.

In the driver the SFT steps come first (``config.sft.steps``); the RL steps
follow from the policy they leave, with a fresh optimizer state.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from envs import Env, planning
from envs.core import EnvSpec
from envs.host import HostEnvironment
from starpo_jax import settings, sharding
from starpo_jax.agent import rollout as rollout_lib
from starpo_jax.agent.codec import Codec
from starpo_jax.agent.parse import (
  ANSWER_CLOSE,
  ANSWER_OPEN,
  THINK_CLOSE,
  first_at,
)
from starpo_jax.agent.ragged import pack
from starpo_jax.agent.rollout import RolloutConfig, Trajectory
from starpo_jax.algo.logprobs import (
  generated_positions,
  pack_generated,
  sequence_logprobs,
)
from starpo_jax.algo.state import TrainState
from starpo_jax.algo.update import apply_gradients
from starpo_jax.models.tokenizer import Tokenizer

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
  # Think mode: the most tokens of the initial model's own sampled
  # reasoning each expert reply opens with (first turns: sft.max_turns=1).
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


@struct.dataclass
class ScriptCache:
  length: jax.Array  # [B] tokens held
  pos: jax.Array  # [B] script tokens emitted

  def broadcast(self, batch: int) -> ScriptCache:
    return ScriptCache(
      jnp.broadcast_to(self.length, (batch,)),
      jnp.broadcast_to(self.pos, (batch,)),
    )


@struct.dataclass
class ScriptedPolicy:
  """Row b emits ``script[b, 0], script[b, 1], ...`` whatever it is shown
  (a ``rollout.Policy``).

  Its logits put all mass on the next script token, so greedy decoding and
  sampling alike reproduce the script.
  """

  script: jax.Array  # [B, S] int32
  vocab: int = struct.field(pytree_node=False)

  def init_cache(self, batch: int, size: int) -> ScriptCache:
    del size
    zeros = jnp.zeros((batch,), jnp.int32)
    return ScriptCache(zeros, zeros)

  def _next(self, pos: jax.Array) -> jax.Array:
    rows = jnp.arange(pos.shape[0]) % self.script.shape[0]
    return self.script[rows, jnp.clip(pos, 0, self.script.shape[1] - 1)]

  def hidden(self, tokens, cache, num_new=None):
    if num_new is None:
      num_new = jnp.full(tokens.shape[:1], tokens.shape[1], jnp.int32)
    nxt = self._next(cache.pos).astype(jnp.float32)
    h = jnp.broadcast_to(nxt[:, None, None], (*tokens.shape, 1))
    return h, ScriptCache(cache.length + num_new, cache.pos)

  def logits(self, h):
    return 50.0 * jax.nn.one_hot(h[..., 0].astype(jnp.int32), self.vocab)

  def __call__(self, tokens, cache, num_new=None):
    if num_new is None:
      num_new = jnp.full(tokens.shape[:1], tokens.shape[1], jnp.int32)
    pos = cache.pos + num_new
    logits = 50.0 * jax.nn.one_hot(self._next(pos), self.vocab)
    return logits[:, None], ScriptCache(cache.length + num_new, pos)


@struct.dataclass
class Replies:
  """Token spellings of replies: an action first in its turn, an action
  after ``" || "``, and the closing ``</answer>``; in think mode what
  closes the reasoning and opens the answer (``</think><answer>``)."""

  first: jax.Array  # [A, W] int32
  first_len: jax.Array  # [A] int32
  later: jax.Array  # [A, W] int32
  later_len: jax.Array  # [A] int32
  close: jax.Array  # [C] int32
  open: jax.Array  # [O] int32, empty without think mode

  @classmethod
  def build(cls, tokenizer: Tokenizer, spec: EnvSpec, think: bool = False):
    """Action names, ``" || "`` between them; or, for free-text answers,
    the answer alphabet's pieces, nothing between them."""
    names = spec.answer_pieces if spec.text_answers else spec.action_names
    if not names:
      raise ValueError(
        f"sft: environment {spec.name!r} names neither actions nor the "
        "pieces its answers are made of (spec.answer_pieces); set "
        "sft.steps=0"
      )
    sep = "" if spec.text_answers else " || "
    spell = lambda texts: [tokenizer.encode(t) for t in texts]
    first = spell(names)
    later = spell([f"{sep}{name}" for name in names])
    width = max(len(ids) for ids in first + later)

    def table(rows):
      out = np.zeros((len(rows), width), np.int32)
      for i, ids in enumerate(rows):
        out[i, : len(ids)] = ids
      return jnp.asarray(out), jnp.asarray([len(r) for r in rows], jnp.int32)

    (f, fl), (lt, ll) = table(first), table(later)
    close = jnp.asarray(tokenizer.encode(ANSWER_CLOSE.decode()), jnp.int32)
    opening = (THINK_CLOSE + ANSWER_OPEN).decode() if think else ""
    return cls(
      first=f,
      first_len=fl,
      later=lt,
      later_len=ll,
      close=close,
      open=jnp.asarray(tokenizer.encode(opening), jnp.int32),
    )

  def turn_tokens(self, per_turn: int) -> int:
    """The most tokens one turn's reply takes (its reasoning aside)."""
    return (
      self.open.shape[0] + per_turn * self.first.shape[1] + self.close.shape[0]
    )

  def script(self, actions: jax.Array, per_turn: int, turns: int) -> jax.Array:
    """A plan ``[H]`` (``-1`` past its end) as reply tokens, ``per_turn``
    actions a turn; turns with no action left have no reply."""
    segments = []
    for t in range(turns):
      chunk = actions[t * per_turn : (t + 1) * per_turn]
      for j in range(chunk.shape[0]):
        a = jnp.maximum(chunk[j], 0)
        ids, n = (
          (self.first, self.first_len)
          if j == 0
          else (
            self.later,
            self.later_len,
          )
        )
        keep = (jnp.arange(ids.shape[1]) < n[a]) & (chunk[j] >= 0)
        segments.append((ids[a], keep))
      close = jnp.broadcast_to(jnp.any(chunk >= 0), self.close.shape)
      segments.append((self.close, close))
    return pack(segments, turns * self.turn_tokens(per_turn))[0]

  def after_reasoning(
    self, script: jax.Array, reasoning: jax.Array, length: jax.Array
  ) -> jax.Array:
    """A first turn's ``script [S]`` (its answer) after ``length`` tokens
    of ``reasoning [R]`` and what closes it: ``[R + O + S]``."""
    r = reasoning.shape[0]
    segments = [
      (reasoning, jnp.arange(r) < length),
      (self.open, jnp.ones(self.open.shape, bool)),
      (script, jnp.ones(script.shape, bool)),
    ]
    return pack(segments, r + self.open.shape[0] + script.shape[0])[0]


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
      rollout_cfg.max_context,
      rollout_lib.context_needed(codec, rollout_cfg, turns),
    ),
  )


def solution_width(env: Env) -> int:
  """How many answer pieces ``env.solution`` returns."""
  state = jax.eval_shape(lambda: env.reset(jax.random.key(0))[0])
  return jax.eval_shape(env.solution, state).shape[0]


def check(
  env: Env,
  rollout_cfg: RolloutConfig,
  replies: Replies,
  expert: str,
  reasoning_tokens: int = 0,
) -> None:
  """Raises ``ValueError`` naming what stops the warm start from working."""
  if isinstance(env, HostEnvironment):
    raise ValueError(
      f"sft: {env.spec.name!r} is a Python environment (envs.host); the "
      "warm start plays its experts inside the compiled step, on jittable "
      "environments only: set sft.steps=0, or warm start on a jittable "
      "environment and start from that run with train.init_from"
    )
  name = env.spec.name
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
  if rollout_cfg.enable_think and rollout_cfg.max_turns > 1:
    raise ValueError(
      "sft: in think mode the warm start imitates first turns (the "
      "policy's own reasoning, then the expert's answer): set "
      "sft.max_turns=1"
    )
  if rollout_cfg.enable_think and expert == "world_model":
    raise ValueError(
      "sft: expert='world_model' needs rollout.enable_think=False"
    )
  if env.spec.text_answers:
    pieces = solution_width(env)
    need, what = replies.turn_tokens(pieces), f"an answer of {pieces} pieces"
  else:
    actions = rollout_cfg.max_actions_per_turn
    need, what = replies.turn_tokens(actions), f"a reply of {actions} actions"
  if rollout_cfg.enable_think:
    need += reasoning_tokens
    what += f" after {reasoning_tokens} of reasoning (sft.reasoning_tokens)"
  budget = rollout_cfg.max_new_tokens
  if need > budget:
    raise ValueError(
      f"sft: {what} takes up to {need} tokens; "
      f"rollout.max_new_tokens={budget} is less"
    )


def own_reasoning(
  model: Any,
  codec: Codec,
  env: Env,
  rollout_cfg: RolloutConfig,
  key: jax.Array,
  tokens: int,
  temperature: float,
) -> tuple[jax.Array, jax.Array]:
  """The policy's first-turn replies on the levels ``key`` draws, sampled
  at ``temperature`` for up to ``tokens`` tokens: ``[B, tokens]`` and how
  many of each to keep: those that end before any ``</think>`` the reply
  wrote and before a stop token."""
  cfg = dataclasses.replace(
    rollout_cfg, max_turns=1, max_new_tokens=tokens, temperature=temperature
  )
  traj = rollout_lib.rollout(model, codec, env, cfg, key)
  positions, slots = pack_generated(traj, tokens)
  ids = jnp.take_along_axis(traj.tokens, positions, axis=1)
  stops = jnp.isin(ids, jnp.asarray(codec.stop_ids)) | ~slots
  stopped = jnp.concatenate([stops, jnp.ones_like(stops[:, :1])], axis=1)
  before_stop = jnp.argmax(stopped, axis=1)

  def before_close(ids, n):
    data, count = codec.to_bytes(ids, n)
    close = first_at(data, count, THINK_CLOSE)
    ends = len(codec.reply_prefix) + jnp.cumsum(codec.token_byte_lengths[ids])
    return jnp.sum((ends <= close) & (jnp.arange(ids.shape[0]) < n))

  length = jax.vmap(before_close)(ids, before_stop)
  return ids, length.astype(jnp.int32)


def expert_trajectories(
  env: Env,
  codec: Codec,
  replies: Replies,
  rollout_cfg: RolloutConfig,
  key: jax.Array,
  constrain=lambda tree: tree,
  expert: str = "planner",
  tries: int = 64,
  reasoning: tuple[jax.Array, jax.Array] | None = None,
) -> tuple[Trajectory, jax.Array]:
  """Plays ``rollout_cfg.batch`` new levels with the expert's actions: their
  shortest solutions, the shortest of ``tries`` random successes, or random
  valid ones; in think mode after ``reasoning`` (``own_reasoning``: tokens
  ``[B, R]`` and lengths ``[B]``).

  Returns:
    The episodes, and ``[B]`` bool, whether the expert had actions for the
    level (a plan, a success found by search; always for the others).
  """
  states = rollout_lib.reset(env, rollout_cfg, rollout_lib.reset_key(key))
  if env.spec.text_answers:
    # The whole answer in the first turn's reply.
    answers = jax.vmap(env.solution)(states)
    scripts = jax.vmap(
      lambda a: replies.script(a, a.shape[0], rollout_cfg.max_turns)
    )(answers)
    if reasoning is not None:
      scripts = jax.vmap(replies.after_reasoning)(scripts, *reasoning)
    policy = ScriptedPolicy(scripts, codec.token_bytes.shape[0])
    traj = rollout_lib.rollout(policy, codec, env, rollout_cfg, key, constrain)
    return traj, jnp.ones(traj.success.shape, bool)
  horizon = rollout_cfg.max_actions_per_traj
  if expert == "planner":
    plans = jax.vmap(lambda s: env.plan(s, horizon))(states)
  elif expert == "search":
    keys = jax.random.split(jax.random.fold_in(key, 1), rollout_cfg.batch)
    plans = jax.vmap(
      lambda s, k: planning.random_search(env, s, horizon, k, tries)
    )(states, keys)
  else:  # random_valid, world_model
    keys = jax.random.split(jax.random.fold_in(key, 1), rollout_cfg.batch)
    plans = jax.vmap(
      lambda s, k: planning.random_valid_play(env, s, horizon, k)[0]
    )(states, keys)
  scripts = jax.vmap(
    lambda a: replies.script(
      a, rollout_cfg.max_actions_per_turn, rollout_cfg.max_turns
    )
  )(plans.actions)
  if reasoning is not None:
    scripts = jax.vmap(replies.after_reasoning)(scripts, *reasoning)
  policy = ScriptedPolicy(scripts, codec.token_bytes.shape[0])
  traj = rollout_lib.rollout(policy, codec, env, rollout_cfg, key, constrain)
  found = plans.length >= 0 if expert in ("planner", "search") else None
  return traj, jnp.ones(traj.success.shape, bool) if found is None else found


def imitation_loss(
  params: Any,
  policy_def: Any,
  traj: Trajectory,
  size: int,
  temperature: float,
  allowed: jax.Array | None,
  chunk: int,
  keep: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean negative log-likelihood of the expert's reply tokens, in the
  episodes ``keep [B]`` marks."""
  positions, mask = pack_generated(traj, size)
  mask = mask & keep[:, None]
  model = nnx.merge(policy_def, params)
  logp, _ = sequence_logprobs(
    model, traj.tokens, positions, temperature, allowed, chunk
  )
  m = mask.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(m), 1.0)
  loss = -jnp.sum(logp * m) / count
  return loss, {"loss": loss, "token_prob": jnp.sum(jnp.exp(logp) * m) / count}


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
  logp, _ = sequence_logprobs(model, traj.tokens, positions, 1.0, None, chunk)
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
  temperature: float,
  allowed: jax.Array | None,
  logits_chunk: int,
):
  """Whether any token trains, and ``params -> (loss, stats)``: the
  world model's loss for ``expert="world_model"``, else imitation."""
  if expert == "world_model":
    return jnp.any(traj.loss_mask), lambda p: world_model_loss(
      p, policy_def, traj, logits_chunk, keep
    )
  return jnp.any(traj.loss_mask & keep[:, None]), lambda p: imitation_loss(
    p,
    policy_def,
    traj,
    max_generated,
    temperature,
    allowed,
    logits_chunk,
    keep,
  )


def make_sft_step(
  *,
  env: Env,
  rollout_cfg: RolloutConfig,
  sft_cfg: SftConfig,
  policy_def: Any,
  tx: optax.GradientTransformation,
  replies: Replies,
  codec: Codec,
  logits_chunk: int,
  mesh: Any = None,
):
  """Builds ``step(state, codec) -> (state, metrics)`` (jit it), one
  supervised update of the policy on new expert episodes.

  Args:
    codec: the host's codec (its static sizes fix the context); the step
      takes the codec as an argument like the RL step.
  """
  cfg = episodes_config(rollout_cfg, sft_cfg, codec)
  check(env, cfg, replies, sft_cfg.expert, sft_cfg.reasoning_tokens)
  on_batch = sharding.batch_constraint(mesh, cfg.batch)
  think = rollout_cfg.enable_think

  def step(state: TrainState, codec: Codec):
    key = jax.random.fold_in(state.key, state.step)
    reasoning = None
    if think:
      reasoning = own_reasoning(
        nnx.merge(policy_def, state.reference),
        codec,
        env,
        cfg,
        key,
        sft_cfg.reasoning_tokens,
        rollout_cfg.temperature,
      )
    traj, found = expert_trajectories(
      env,
      codec,
      replies,
      cfg,
      key,
      on_batch,
      sft_cfg.expert,
      sft_cfg.search_tries,
      reasoning,
    )
    keep = traj.success if sft_cfg.keep == "successes" else traj.length > 0
    keep = keep & found
    live, objective = _objective(
      sft_cfg.expert,
      policy_def,
      traj,
      keep,
      cfg.max_generated,
      rollout_cfg.temperature,
      codec.allowed,
      logits_chunk,
    )
    grad_fn = jax.value_and_grad(objective, has_aux=True)
    params, opt, stats, finite = apply_gradients(
      tx, grad_fn, state.policy, state.policy_opt, live
    )
    nonfinite = jnp.where(finite, 0, state.nonfinite + 1)
    new_state = state.replace(
      step=state.step + 1, policy=params, policy_opt=opt, nonfinite=nonfinite
    )
    metrics = {f"sft/{k}": v for k, v in stats.items()}
    metrics["sft/expert_success"] = jnp.mean(traj.success)
    metrics["sft/kept"] = jnp.mean(keep)
    if think:
      metrics["sft/own_reasoning_tokens"] = jnp.mean(reasoning[1] * 1.0)
    metrics["train/skipped_nonfinite"] = (~finite).astype(jnp.float32)
    metrics["train/nonfinite_streak"] = nonfinite.astype(jnp.float32)
    return new_state, metrics

  return sharding.traced_for(mesh, step)
