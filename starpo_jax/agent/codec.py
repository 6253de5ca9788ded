"""Text <-> tokens inside ``jit``: the ``Codec``.

Built once on the host from a tokenizer and an environment's spec, a
``Codec`` is a pytree of lookup tables that the compiled rollout takes as an
argument:

* render: environment piece ids -> token ids by a gather from a
  ``[pieces, max_tokens]`` table and a ragged concatenation. Invariant:
  ``tokenizer.decode(tokens) == the rendered text``.
* prompts: RAGEN's multi-turn prompt, assembled from pre-tokenized fragments
  and numbers rendered digit by digit.
* parse: generated token ids -> bytes through a ``[vocab, max_bytes]``
  table, then RAGEN's answer grammar on the bytes (``parse.py``).
  Invariant: it equals a plain-Python regex reference on any text
  (``reference/text.py``).
* stopping: a per-token automaton finds ``</answer>`` even when it is split
  across tokens, in O(1) per decoded token (and a second one ``</tool>``,
  where the environment offers tools).
* tools: an environment's tools (``envs.tools``) bound to the tokenizer,
  run from the compiled rollout.

The grammar itself: ``parse.py``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs import EnvSpec
from envs import tools as tools_lib
from envs.batch import host_call
from starpo_jax.agent.parse import ANSWER_CLOSE, Parsed, parse_bytes
from starpo_jax.agent.prompt import (
  REWARD_DIGITS,
  REWARD_TOKENS,
  Fragments,
  PromptSettings,
  answer_tokens,
  fragments,
)
from starpo_jax.agent.ragged import Segment, fixed, pack
from starpo_jax.models.tokenizer import TAGS, Tokenizer


@dataclasses.dataclass(frozen=True, eq=False)
class TextObservations:
  """The host side of ``observation_tokens="text"``: each row's piece ids
  -> its text -> the tokenizer's ids, as the tokenizer alone would give
  them. ``width`` is the piece-by-piece bound; a text whose own tokens
  exceed it keeps its pieces' tokens (the same text)."""

  pieces: tuple[str, ...]
  tokenizer: Tokenizer
  piece_tokens: tuple[tuple[int, ...], ...]
  width: int
  batch_axes: tuple[str, ...]

  def __call__(
    self, offset: int, pieces: np.ndarray, n: np.ndarray
  ) -> tuple[np.ndarray, np.ndarray]:
    del offset  # rows are independent
    rows = [pieces[i, : n[i]].tolist() for i in range(len(n))]
    texts = ["".join(self.pieces[p] for p in row) for row in rows]
    out = np.zeros((len(rows), self.width), np.int32)
    lengths = np.zeros((len(rows),), np.int32)
    for i, ids in enumerate(self.tokenizer.encode_batch(texts)):
      if len(ids) > self.width:
        ids = [t for p in rows[i] for t in self.piece_tokens[p]]
      out[i, : len(ids)] = ids
      lengths[i] = len(ids)
    return out, lengths


@struct.dataclass
class LastTurn:
  """What an episode's previous turn left for the next prompt to say."""

  reward: jax.Array  # its reward (unused on turn 0)
  warn: jax.Array  # it had no valid action
  actions_left: jax.Array  # the episode's remaining action budget
  ended_by_stop: jax.Array  # its reply ended with the chat's stop token


@struct.dataclass
class Codec:
  """Lookup tables between a tokenizer and one environment's pieces."""

  piece_tokens: jax.Array  # [pieces, P] int32
  piece_lengths: jax.Array  # [pieces] int32
  token_bytes: jax.Array  # [vocab, max_bytes] uint8
  token_byte_lengths: jax.Array  # [vocab] int32
  stop_next: jax.Array  # [vocab, 10] int32: "</answer>" automaton
  stop_hit: jax.Array  # [vocab, 10] bool: the token completes "</answer>"
  tool_next: jax.Array | None  # [vocab, 8] int32: "</tool>" automaton
  tool_hit: jax.Array | None  # [vocab, 8] bool: the token completes it
  action_bytes: jax.Array  # [actions, max_name] uint8, lower-case
  action_lengths: jax.Array  # [actions] int32
  allowed: jax.Array | None  # [vocab] bool tokens the policy may emit
  fragments: Fragments = struct.field(pytree_node=False)
  markers: tuple[bytes, ...] = struct.field(pytree_node=False)
  stop_ids: tuple[int, ...] = struct.field(pytree_node=False)
  chat_stop: int = struct.field(pytree_node=False)
  max_obs_pieces: int = struct.field(pytree_node=False)
  max_obs_tokens: int = struct.field(pytree_node=False)
  settings: PromptSettings = struct.field(pytree_node=False)
  text_answers: bool = struct.field(pytree_node=False, default=False)
  tools: tools_lib.ToolBox | None = struct.field(
    pytree_node=False, default=None
  )
  text_observations: TextObservations | None = struct.field(
    pytree_node=False, default=None
  )

  @classmethod
  def build(
    cls,
    tokenizer: Tokenizer,
    spec: EnvSpec,
    settings: PromptSettings,
    vocab_size: int | None = None,
    batch_axes: tuple[str, ...] = (),
  ) -> Codec:
    """Host-side construction; checks the tokenizer covers what it needs.

    Args:
      vocab_size: the model's vocabulary, when larger than the tokenizer's
        (Qwen2.5 pads its embedding): extra ids stand for no bytes.
      batch_axes: the mesh axes the episode batch is sharded over: with
        ``observation_tokens="text"``, each process tokenizes its shards.
    """
    vocab = max(tokenizer.vocab_size, vocab_size or 0)
    if spec.token_observations:
      # Observations arrive as tokens: each token id is its own piece.
      encoded = [[i] for i in range(vocab)]
    else:
      encoded = [tokenizer.encode(p) for p in spec.pieces]
    token_bytes, lengths = _token_bytes(tokenizer, vocab)
    stop_next, stop_hit = _automaton(token_bytes, lengths, ANSWER_CLOSE)
    names = [n.lower().encode() for n in spec.action_names]
    chat = tokenizer.chat
    tools, tool_next, tool_hit = _tools(tokenizer, spec, token_bytes, lengths)
    allowed = None
    if settings.answer_vocab:
      allowed = jnp.asarray(answer_tokens(tokenizer, spec, settings, vocab))
    text, width = _observations(tokenizer, spec, settings, encoded, batch_axes)
    return cls(
      piece_tokens=jnp.asarray(_padded(encoded, np.int32)),
      piece_lengths=jnp.asarray([len(e) for e in encoded], jnp.int32),
      token_bytes=jnp.asarray(token_bytes),
      token_byte_lengths=jnp.asarray(lengths),
      stop_next=jnp.asarray(stop_next),
      stop_hit=jnp.asarray(stop_hit),
      tool_next=tool_next,
      tool_hit=tool_hit,
      action_bytes=jnp.asarray(
        _padded([np.frombuffer(n, np.uint8) for n in names], np.uint8)
      ),
      action_lengths=jnp.asarray([len(n) for n in names], jnp.int32),
      allowed=allowed,
      fragments=fragments(tokenizer, spec, settings),
      markers=_markers(chat),
      stop_ids=tokenizer.stop_ids,
      chat_stop=tokenizer.token_to_id(chat.stop),
      max_obs_pieces=spec.max_obs_pieces,
      max_obs_tokens=width,
      settings=settings,
      text_answers=spec.text_answers,
      tools=tools,
      text_observations=text,
    )

  # --------------------------------------------------------------------------
  # rendering

  def render_batch(
    self, pieces: jax.Array, n: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """A batch's observations, pieces ``[B, max_obs_pieces]`` -> tokens
    ``[B, max_obs_tokens]`` and how many each uses: through the tokenizer
    on the host (``TextObservations``) or piece by piece in the graph."""
    if self.text_observations is None:
      return jax.vmap(self.render)(pieces, n)
    b = pieces.shape[0]
    outs = (
      jax.ShapeDtypeStruct((b, self.max_obs_tokens), jnp.int32),
      jax.ShapeDtypeStruct((b,), jnp.int32),
    )
    text = self.text_observations
    return host_call(text, outs, (0, 0), text.batch_axes, pieces, n)

  def render(
    self, pieces: jax.Array, n: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """Observation pieces ``[max_obs_pieces]`` -> tokens ``[max_obs_tokens]``
    piece by piece, and how many are used."""
    width = self.piece_tokens.shape[1]
    ids = self.piece_tokens[pieces]  # [P, width]
    keep = (jnp.arange(width) < self.piece_lengths[pieces][:, None]) & (
      jnp.arange(pieces.shape[0]) < n
    )[:, None]
    return pack([(ids.reshape(-1), keep.reshape(-1))], self.max_obs_tokens)

  def number(self, value: jax.Array, width: int) -> Segment:
    """A non-negative integer as digit tokens (``width`` digits at most)."""
    powers = jnp.asarray(10 ** np.arange(width - 1, -1, -1), jnp.int32)
    digits = (value // powers) % 10
    keep = (value >= powers) | (powers == 1)
    return jnp.asarray(self.fragments.digits, jnp.int32)[digits], keep

  def reward(self, value: jax.Array) -> Segment:
    """A reward as ``format_reward`` writes it (magnitudes below 1e6):
    ``REWARD_TOKENS`` slots, sign, digits, point and two decimals."""
    cents = jnp.round(value * 100).astype(jnp.int32)
    whole, frac = jnp.abs(cents) // 100, jnp.abs(cents) % 100
    ids, keep = self.number(whole, REWARD_DIGITS)
    tenths, hundredths = frac // 10, frac % 10
    digits = jnp.asarray(self.fragments.digits, jnp.int32)
    f = self.fragments
    return (
      jnp.concatenate(
        [
          jnp.asarray([f.minus]),
          ids,
          jnp.asarray([f.dot]),
          digits[tenths][None],
          digits[hundredths][None],
        ]
      ),
      jnp.concatenate(
        [
          (cents < 0)[None],
          keep,
          (frac > 0)[None],
          (frac > 0)[None],
          (hundredths > 0)[None],
        ]
      ),
    )

  @property
  def obs_width(self) -> int:
    """The longest observation a turn shows: the environment's, after a
    tool's result where it has tools."""
    return self.max_obs_tokens + (self.tools.budget if self.tools else 0)

  def first_head(self, max_turns: int) -> int:
    """Tokens the first turn's prompt holds before its observation, the
    same in every episode."""
    f = self.fragments
    if self.settings.compact:
      return len(f.user_start)
    return (
      len(f.user_start)
      + len(f.turn_head)
      + len(str(max_turns))
      + len(f.state_head)
    )

  def turn_chunk_size(self, max_turns: int, max_actions: int) -> int:
    """Tokens a ``turn_chunk`` can hold: every segment at its longest."""
    f = self.fragments
    size = (
      max(len(f.end_full), len(f.end_after_stop))
      + len(f.user_start)
      + self.obs_width
      + len(f.reply_start)
    )
    if self.settings.compact:
      return size
    return size + (
      len(f.reward_head)
      + REWARD_TOKENS
      + len(f.newline)
      + len(f.turn_head)
      + len(str(max_turns))
      + len(f.state_head)
      + len(f.newline)
      + len(f.warning)
      + len(f.actions_head)
      + len(str(max_actions))
      + len(f.reminder)
      + len(str(self.settings.response_hint))
      + len(f.reminder_tail)
    )

  def turn_chunk(
    self,
    turn: jax.Array,
    obs: tuple[jax.Array, jax.Array],
    last: LastTurn,
    size: int,
    max_turns: int,
    max_actions: int,
  ) -> tuple[jax.Array, jax.Array]:
    """The tokens between two replies, in the settings' prompt style.

    Args:
      turn: int32 [], 0-based.
      obs: observation tokens and count, from ``render``.
      last: what the previous turn left (on turn 0, only the action
        budget is read).
      size: the chunk width (``turn_chunk_size``).

    Returns:
      Token ids ``[size]`` and how many are used.
    """
    f = self.fragments
    later = turn > 0
    ended_by_stop = last.ended_by_stop
    const = lambda ids, keep=True: fixed(ids, keep)
    observation = (obs[0], jnp.arange(obs[0].shape[0]) < obs[1])
    segments = [
      const(f.end_after_stop, later & ended_by_stop),
      const(f.end_full, later & ~ended_by_stop),
      const(f.user_start),
    ]
    if self.settings.compact:
      segments += [observation, const(f.reply_start)]
      return pack(segments, size)
    r_ids, r_keep = self.reward(last.reward)
    segments += [
      const(f.reward_head, later),
      (r_ids, r_keep & later),
      const(f.newline, later),
      const(f.turn_head),
      self.number(turn + 1, len(str(max_turns))),
      const(f.state_head),
      observation,
      const(f.newline),
      const(f.warning, last.warn),
      const(f.actions_head),
      self.number(last.actions_left, len(str(max_actions))),
      const(f.reminder),
      self.number(
        jnp.asarray(self.settings.response_hint),
        len(str(self.settings.response_hint)),
      ),
      const(f.reminder_tail),
      const(f.reply_start),
    ]
    return pack(segments, size)

  # --------------------------------------------------------------------------
  # stopping

  def stop_step(
    self, state: jax.Array, token: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """Advances the ``</answer>`` automaton by one token.

    Returns:
      The new automaton state and whether ``</answer>`` was completed.
    """
    return self.stop_next[token, state], self.stop_hit[token, state]

  def tool_stop_step(
    self, state: jax.Array, token: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """Advances the ``</tool>`` automaton by one token (only where the
    environment has tools)."""
    return self.tool_next[token, state], self.tool_hit[token, state]

  # --------------------------------------------------------------------------
  # parsing

  @property
  def reply_prefix(self) -> bytes:
    """The tag the prompt ends with; RAGEN prepends it to the reply."""
    return b"<think>" if self.settings.enable_think else b"<answer>"

  def to_bytes(
    self, tokens: jax.Array, n: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """A reply's tokens ``[T]`` (``n`` used) -> its bytes, prefix included,
    and their count."""
    width = self.token_bytes.shape[1]
    b = self.token_bytes[tokens].astype(jnp.int32)  # [T, width]
    keep = (jnp.arange(width) < self.token_byte_lengths[tokens][:, None]) & (
      jnp.arange(tokens.shape[0]) < n
    )[:, None]
    prefix = np.frombuffer(self.reply_prefix, np.uint8)
    size = prefix.shape[0] + tokens.shape[0] * width
    return pack([fixed(prefix), (b.reshape(-1), keep.reshape(-1))], size)

  def parse(self, tokens: jax.Array, n: jax.Array) -> Parsed:
    """RAGEN's answer grammar on one reply's tokens ``[T]`` (``n`` used),
    with the reasoning's length in tokens: those whose first byte comes
    before the matched ``</think>``."""
    data, count = self.to_bytes(tokens, n)
    parsed = parse_bytes(
      data,
      count,
      think=self.settings.enable_think,
      markers=self.markers,
      max_actions=self.settings.max_actions_per_turn,
      action_bytes=self.action_bytes,
      action_lengths=self.action_lengths,
      text_answers=self.text_answers,
    )
    sizes = self.token_byte_lengths[tokens]
    starts = len(self.reply_prefix) + jnp.cumsum(sizes) - sizes
    before = (starts < parsed.think_end) & (jnp.arange(tokens.shape[0]) < n)
    return parsed.replace(think_tokens=jnp.sum(before, dtype=jnp.int32))


def _observations(
  tokenizer: Tokenizer,
  spec: EnvSpec,
  settings: PromptSettings,
  encoded: list[list[int]],
  batch_axes: tuple[str, ...],
) -> tuple[TextObservations | None, int]:
  """How observations become tokens (on the host as text, or ``None``:
  piece by piece in the graph) and the most tokens one takes."""
  if spec.token_observations:
    return None, spec.max_obs_pieces
  width = _max_tokens(
    [len(e) for e in encoded], spec.max_obs_pieces, spec.piece_limits
  )
  if settings.observation_tokens != "text" or not tokenizer.merges:
    return None, width
  pieces = tuple(map(tuple, encoded))
  return TextObservations(
    spec.pieces, tokenizer, pieces, width, batch_axes
  ), width


def _tools(tokenizer: Tokenizer, spec: EnvSpec, token_bytes, lengths):
  """The environment's tools bound to the tokenizer, and the automaton
  that finds ``</tool>`` in decoded tokens; Nones without tools."""
  if not spec.tools:
    return None, None, None
  tools = tools_lib.ToolBox.build(
    spec.tools, tokenizer.encode, spec.tool_tokens
  )
  close = tools_lib.TOOL_CLOSE.encode()
  tool_next, tool_hit = _automaton(token_bytes, lengths, close)
  return tools, jnp.asarray(tool_next), jnp.asarray(tool_hit)


def _padded(rows: list, dtype) -> np.ndarray:
  """Rows of different lengths as one array, zero after each row's end
  (at least one column)."""
  out = np.zeros((len(rows), max([1, *map(len, rows)])), dtype)
  for i, row in enumerate(rows):
    out[i, : len(row)] = row
  return out


def _token_bytes(tokenizer: Tokenizer, vocab: int):
  """Each token's bytes ``[vocab, max_bytes]`` and their count ``[vocab]``;
  ids past the tokenizer's (a padded embedding) stand for no bytes."""
  raw = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
  raw += [b""] * (vocab - len(raw))
  token_bytes = np.zeros((vocab, max(1, *(len(b) for b in raw))), np.uint8)
  for i, b in enumerate(raw):
    token_bytes[i, : len(b)] = np.frombuffer(b, np.uint8)
  return token_bytes, np.asarray([len(b) for b in raw], np.int32)


def _max_tokens(
  lengths: list[int], pieces: int, limits: tuple[int, ...] | None
) -> int:
  """The most tokens ``pieces`` pieces can spell, each used at most its
  limit: the longest first (exact for this bound)."""
  limits = limits or (pieces,) * len(lengths)
  total, left = 0, pieces
  for length, limit in sorted(zip(lengths, limits, strict=True), reverse=True):
    take = min(limit, left)
    total += take * length
    left -= take
  return total


def _markers(chat) -> tuple[bytes, ...]:
  """The tags and chat markers a reply's answer is read around."""
  tags = [t.encode() for t in TAGS] + [m.encode() for m in _chat_markers(chat)]
  return tuple(dict.fromkeys(tags))


def _chat_markers(chat) -> list[str]:
  text = chat.begin + chat.role_start + chat.message_end
  out, i = [], 0
  while (start := text.find("<|", i)) >= 0:
    end = text.find("|>", start)
    out.append(text[start : end + 2])
    i = end + 2
  return out


def _automaton(
  token_bytes: np.ndarray, lengths: np.ndarray, pattern: bytes
) -> tuple[np.ndarray, np.ndarray]:
  """Per-token transitions of a KMP automaton for ``pattern``.

  Returns:
    next_state ``[vocab, m + 1]`` and hit ``[vocab, m + 1]`` (the pattern
    ends inside the token), for every start state.
  """
  m = len(pattern)
  fail = [0] * (m + 1)
  k = 0
  for i in range(1, m):
    while k and pattern[i] != pattern[k]:
      k = fail[k]
    if pattern[i] == pattern[k]:
      k += 1
    fail[i + 1] = k
  delta = np.zeros((m + 1, 256), np.int32)
  for state in range(m + 1):
    for byte in range(256):
      s = fail[state] if state == m else state
      while s and pattern[s] != byte:
        s = fail[s]
      delta[state, byte] = s + 1 if pattern[s] == byte else 0
  vocab = token_bytes.shape[0]
  state = np.tile(np.arange(m + 1, dtype=np.int32), (vocab, 1))
  hit = np.zeros((vocab, m + 1), bool)
  for j in range(token_bytes.shape[1]):
    live = (j < lengths)[:, None]
    nxt = delta[state, token_bytes[:, j][:, None]]
    state = np.where(live, nxt, state)
    hit |= live & (state == m)
  return state, hit
