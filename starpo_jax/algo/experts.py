"""The warm start's experts: who decides the actions of its episodes
(a planner's shortest solution, the best of a random search, a random
valid player, an environment's own solution), and the scripted policy
that spells them out as replies in the rollout's format, after the
model's own reasoning in think mode (``algo.sft`` trains on them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

import envs
from envs import Env
from envs.core import EnvSpec
from envs.jax import planning
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
  pack_generated,
)
from starpo_jax.models.tokenizer import Tokenizer


@struct.dataclass
class ScriptCache:
  length: jax.Array  # [B] tokens held
  pos: jax.Array  # [B] script tokens emitted
  # A context window's hidden slots and positions' shift (``KVCache``),
  # carried only: a script emits what it emits whatever it is shown.
  hidden: jax.Array | None = None
  shift: jax.Array | None = None

  def broadcast(self, batch: int) -> ScriptCache:
    grow = lambda x: jnp.broadcast_to(x, (batch, *x.shape[1:]))
    return jax.tree.map(grow, self)


@struct.dataclass
class ScriptedPolicy:
  """Row b emits ``script[b, 0], script[b, 1], ...`` whatever it is shown
  (a ``rollout.Policy``).

  Its logits put all mass on the next script token, so greedy decoding and
  sampling alike reproduce the script.
  """

  script: jax.Array  # [B, S] int32
  vocab: int = struct.field(pytree_node=False)
  # What it emits depends on its row, not only on what it is shown: the
  # rollout must not prefill one row for another.
  depends_on_row = True

  def for_decoding(self) -> ScriptedPolicy:
    return self

  def init_cache(self, batch: int, size: int) -> ScriptCache:
    del size
    zeros = jnp.zeros((batch,), jnp.int32)
    return ScriptCache(zeros, zeros)

  def _next(self, pos: jax.Array) -> jax.Array:
    rows = jnp.arange(pos.shape[0]) % self.script.shape[0]
    return self.script[rows, jnp.clip(pos, 0, self.script.shape[1] - 1)]

  def hidden(self, tokens, cache, num_new=None, at=None):
    if num_new is None:
      num_new = jnp.full(tokens.shape[:1], tokens.shape[1], jnp.int32)
    nxt = self._next(cache.pos).astype(jnp.float32)
    shape = tokens.shape if at is None else at.shape
    h = jnp.broadcast_to(nxt[:, None, None], (*shape, 1))
    return h, cache.replace(length=cache.length + num_new)

  def logits(self, h):
    return 50.0 * jax.nn.one_hot(h[..., 0].astype(jnp.int32), self.vocab)

  def __call__(self, tokens, cache, num_new=None):
    if num_new is None:
      num_new = jnp.full(tokens.shape[:1], tokens.shape[1], jnp.int32)
    pos = cache.pos + num_new
    logits = 50.0 * jax.nn.one_hot(self._next(pos), self.vocab)
    return logits[:, None], cache.replace(
      length=cache.length + num_new, pos=pos
    )


@struct.dataclass
class Replies:
  """Token spellings of replies: an action first in its turn, an action
  after ``" || "``, and the closing ``</answer>``; in think mode what
  closes the reasoning and opens the answer (``</think><answer>``), and
  the pieces of the reasoning an environment writes about its board
  (``env.thoughts``; None where it writes none)."""

  first: jax.Array  # [A, W] int32
  first_len: jax.Array  # [A] int32
  later: jax.Array  # [A, W] int32
  later_len: jax.Array  # [A] int32
  close: jax.Array  # [C] int32
  open: jax.Array  # [O] int32, empty without think mode
  thought: jax.Array | None = None  # [P, V] int32
  thought_len: jax.Array | None = None  # [P] int32

  @classmethod
  def build(
    cls,
    tokenizer: Tokenizer,
    spec: EnvSpec,
    think: bool = False,
    thoughts: tuple[str, ...] | None = None,
  ):
    """Action names, ``" || "`` between them; or, for free-text answers,
    the answer alphabet's pieces, nothing between them; and the
    ``thoughts`` pieces (an environment's ``thoughts.pieces``) one by
    one."""
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
    thought = thought_len = None
    if thoughts is not None:
      spelled = spell(thoughts)
      width = max(len(ids) for ids in spelled)
      rows = np.zeros((len(spelled), width), np.int32)
      for i, ids in enumerate(spelled):
        rows[i, : len(ids)] = ids
      thought = jnp.asarray(rows)
      thought_len = jnp.asarray([len(ids) for ids in spelled], jnp.int32)
    return cls(
      first=f,
      first_len=fl,
      later=lt,
      later_len=ll,
      close=close,
      open=jnp.asarray(tokenizer.encode(opening), jnp.int32),
      thought=thought,
      thought_len=thought_len,
    )

  def spell(self, ids: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The first ``n`` of reasoning pieces ``ids [M]`` as tokens
    ``[M * V]``, and how many."""
    width = self.thought.shape[1]
    tokens = self.thought[ids]
    keep = (jnp.arange(width) < self.thought_len[ids][:, None]) & (
      jnp.arange(ids.shape[0]) < n
    )[:, None]
    return pack([(tokens.reshape(-1), keep.reshape(-1))], tokens.size)

  def turn_tokens(self, per_turn: int) -> int:
    """The most tokens one turn's reply takes (its reasoning aside)."""
    return (
      self.open.shape[0] + per_turn * self.first.shape[1] + self.close.shape[0]
    )

  def script(
    self,
    actions: jax.Array,
    per_turn: int,
    turns: int,
    thoughts: list[tuple[jax.Array, jax.Array]] | None = None,
  ) -> jax.Array:
    """A plan ``[H]`` (``-1`` past its end) as reply tokens, ``per_turn``
    actions a turn, each turn's after its reasoning (``thoughts``: a
    turn's tokens and how many, closed by ``</think><answer>``; None:
    none); turns with no action left have no reply."""
    segments, width = [], turns * self.turn_tokens(per_turn)
    for t in range(turns):
      chunk = actions[t * per_turn : (t + 1) * per_turn]
      if thoughts is not None and t < len(thoughts):
        ids, n = thoughts[t]
        live = jnp.any(chunk >= 0)
        segments.append((ids, (jnp.arange(ids.shape[0]) < n) & live))
        segments.append((self.open, jnp.broadcast_to(live, self.open.shape)))
        width += ids.shape[0]
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
    return pack(segments, width)[0]

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


def solution_width(env: Env) -> int:
  """How many answer pieces ``env.solution`` returns."""
  state = jax.eval_shape(lambda: env.reset(jax.random.key(0))[0])
  return jax.eval_shape(env.solution, state).shape[0]


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


def board_thoughts(
  env: Any, replies: Replies, state: Any, actions: jax.Array, per_turn: int
) -> tuple[list[tuple[jax.Array, jax.Array]], jax.Array]:
  """The reasoning an expert writes before each turn of playing
  ``actions [H]`` (``per_turn`` a turn, ``-1`` past the end) from
  ``state``, each from the state the turn starts in and the one its
  actions lead to (``env.think``), spelled as tokens: a list of
  ``(tokens, count)``, a turn's each; and the most tokens a turn's
  reasoning took."""
  out, most = [], jnp.zeros((), jnp.int32)
  for start in range(0, actions.shape[0], per_turn):
    chunk = actions[start : start + per_turn]
    after = state
    for a in chunk:
      after = env.step(after, a)[0]
    ids, n = replies.spell(*env.think(state, chunk, after))
    out.append((ids, n))
    most = jnp.maximum(most, jnp.where(jnp.any(chunk >= 0), n, 0))
    state = after
  return out, most


@dataclasses.dataclass(frozen=True)
class ExpertPlay:
  """Whose actions an expert episode plays (``sft.expert``): ``planner``,
  the environment's shortest solutions; ``search``, the shortest of
  ``tries`` random successes (``sft.search_tries``); ``random_valid`` and
  ``world_model``, random valid actions. ``board``: each turn's reply
  opens with reasoning the environment writes from the board
  (``board_thoughts``)."""

  kind: str = "planner"
  tries: int = 64
  board: bool = False


def _plans(
  env: Any, states: Any, rollout_cfg: RolloutConfig, key, expert: ExpertPlay
) -> planning.Plan:
  """The ``expert``'s actions on each of the batch's ``states``."""
  horizon = rollout_cfg.max_actions_per_traj
  if expert.kind == "planner":
    return jax.vmap(lambda s: env.plan(s, horizon))(states)
  keys = jax.random.split(jax.random.fold_in(key, 1), rollout_cfg.batch)
  if expert.kind == "search":
    return jax.vmap(
      lambda s, k: planning.random_search(env, s, horizon, k, expert.tries)
    )(states, keys)
  # random_valid, world_model
  return jax.vmap(
    lambda s, k: planning.random_valid_play(env, s, horizon, k)[0]
  )(states, keys)


def expert_trajectories(
  env: Any,
  codec: Codec,
  replies: Replies,
  rollout_cfg: RolloutConfig,
  key: jax.Array,
  constrain=lambda tree: tree,
  expert: ExpertPlay = ExpertPlay(),
  reasoning: tuple[jax.Array, jax.Array] | None = None,
) -> tuple[Trajectory, jax.Array]:
  """Plays ``rollout_cfg.batch`` new levels with the ``expert``'s actions,
  in think mode after ``reasoning`` (``own_reasoning``: tokens ``[B, R]``
  and lengths ``[B]``).

  Returns:
    The episodes, and ``[B]`` bool, whether the expert had actions for the
    level (a plan, a success found by search; always for the others).

  ``env``: a jittable environment (or its ``envs.batched`` form).
  """
  env = envs.batched(env).jittable
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
  plans = _plans(env, states, rollout_cfg, key, expert)
  per_turn, turns = rollout_cfg.max_actions_per_turn, rollout_cfg.max_turns
  actions = plans.actions[:, : per_turn * turns]
  fits = jnp.ones(actions.shape[:1], bool)
  if expert.board:
    thoughts, most = jax.vmap(
      lambda s, a: board_thoughts(env, replies, s, a, per_turn)
    )(states, actions)
    scripts = jax.vmap(lambda a, t: replies.script(a, per_turn, turns, t))(
      actions, thoughts
    )
    # A reply past the budget is cut before its answer: not imitated.
    fits = most + replies.turn_tokens(per_turn) <= rollout_cfg.max_new_tokens
  else:
    scripts = jax.vmap(lambda a: replies.script(a, per_turn, turns))(actions)
  if reasoning is not None:
    scripts = jax.vmap(replies.after_reasoning)(scripts, *reasoning)
  policy = ScriptedPolicy(scripts, codec.token_bytes.shape[0])
  traj = rollout_lib.rollout(policy, codec, env, rollout_cfg, key, constrain)
  if expert.kind in ("planner", "search"):
    fits = fits & (plans.length >= 0)
  return traj, fits
