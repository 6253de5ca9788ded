"""RAGEN's answer grammar on the bytes of a reply, inside ``jit``.

The answer grammar (RAGEN's ``_parse_response`` and action lookup): the
first match of ``<think>(.*?)</think>\\s*<answer>(.*?)</answer>`` (in no-think
mode ``<answer>(.*?)</answer>``), DOTALL; the chat markers and tags are
removed from the answer one after another as ``str.replace`` does; it is
split on ``||``; parts are whitespace-trimmed, empty parts dropped, the rest
cut to ``max_actions_per_turn``; each part names an action when it equals
one case-insensitively. An environment with text answers
(``spec.text_answers``: Countdown) takes the answer whole instead, unsplit:
a non-blank answer is its one valid "part". Choice made here: the grammar
works on bytes, so ``\\s``, trimming and case folding are ASCII's (no
action name has other characters).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from starpo_jax.agent.ragged import pack

ANSWER_OPEN = b"<answer>"


ANSWER_CLOSE = b"</answer>"


THINK_OPEN = b"<think>"


THINK_CLOSE = b"</think>"


ACTION_SEP = b"||"


WHITESPACE = b" \t\n\r\x0b\x0c"


@struct.dataclass
class Parsed:
  matched: jax.Array  # [] bool: the grammar matched
  thought: jax.Array  # [] bool: matched, with a non-blank <think> block
  actions: jax.Array  # [A] int32 action ids, -1 where a part names none
  num_parts: jax.Array  # [] int32 non-empty parts kept (<= A)
  answer: jax.Array  # [N] int32 the answer's bytes, markers removed
  answer_length: jax.Array  # [] int32
  # [] int32 where the matched "</think>" starts, in bytes (0 unmatched or
  # without think mode); and the reply's tokens before it (``Codec.parse``).
  think_end: jax.Array
  think_tokens: jax.Array

  @property
  def valid(self) -> jax.Array:
    """[A] bool: the part names an action."""
    return self.actions >= 0

  @property
  def num_valid(self) -> jax.Array:
    """[...] int32: parts naming an action, per reply."""
    return jnp.sum(self.valid, axis=-1, dtype=jnp.int32)


def _find(data: jax.Array, count: jax.Array, pattern: bytes) -> jax.Array:
  """[N] bool: ``pattern`` starts at each position, within ``count``."""
  n = data.shape[0]
  idx = jnp.arange(n)
  ok = idx + len(pattern) <= count
  for j, byte in enumerate(pattern):
    shifted = jnp.concatenate([data[j:], jnp.zeros(j, data.dtype)])
    ok = ok & (shifted == byte)
  return ok


def _first(mask: jax.Array, default: int) -> jax.Array:
  """Index of the first set position, or ``default``."""
  return jnp.where(jnp.any(mask), jnp.argmax(mask), default).astype(jnp.int32)


def first_at(data: jax.Array, count: jax.Array, pattern: bytes) -> jax.Array:
  """[] int32: where ``pattern`` first starts in ``data [N]`` (``count``
  used), or ``N``."""
  return _first(_find(data, count, pattern), data.shape[0])


def parse_bytes(
  data: jax.Array,
  count: jax.Array,
  *,
  think: bool,
  markers: tuple[bytes, ...],
  max_actions: int,
  action_bytes: jax.Array,
  action_lengths: jax.Array,
  text_answers: bool = False,
) -> Parsed:
  """The answer grammar on bytes ``data [N]`` (``count`` used)."""
  n = data.shape[0]
  idx = jnp.arange(n)
  a_open = _find(data, count, ANSWER_OPEN)
  a_close = _find(data, count, ANSWER_CLOSE)
  if think:
    matched, start, thought, think_end = _think_answer(
      data, count, a_open, a_close
    )
  else:
    matched, start = _plain_answer(a_open, a_close)
    thought = jnp.zeros((), bool)
    think_end = jnp.zeros((), jnp.int32)
  start = jnp.where(matched, start, 0)
  end = jnp.where(
    matched, _first(a_close & (idx >= start), n), 0
  )  # the first "</answer>" after the content starts
  # The answer's bytes, moved to the front.
  content, length = pack([(data, (idx >= start) & (idx < end))], n)
  # str.replace of each marker in turn: every occurrence is removed (markers
  # cannot overlap themselves), and removals can create new occurrences of
  # markers already processed, as in Python.
  for marker in markers:
    content, length = _removed(content, length, marker)
  if text_answers:
    parsed = _whole_answer(content, length, matched, max_actions)
    return parsed.replace(thought=thought, think_end=think_end)
  parsed = _split_actions(
    content, length, matched, max_actions, action_bytes, action_lengths
  )
  return parsed.replace(
    thought=thought, think_end=think_end, answer=content, answer_length=length
  )


def _think_answer(data, count, a_open, a_close):
  """``<think>...</think><answer>...</answer>``: whether it matched, where
  the answer's content starts, whether the reasoning is not blank, and
  where it ends."""
  n = data.shape[0]
  idx = jnp.arange(n)
  t_open = _find(data, count, THINK_OPEN)
  t_close = _find(data, count, THINK_CLOSE)
  is_ws = jnp.isin(data, jnp.frombuffer(WHITESPACE, np.uint8)) & (idx < count)
  # After each position, the first non-whitespace position.
  nonws_at = jnp.where(is_ws, n, idx)
  next_nonws = jax.lax.cummin(nonws_at, reverse=True)
  # Where "<answer>" must start: the first non-space after "</think>".
  after_close = jnp.clip(idx + len(THINK_CLOSE), 0, n - 1)
  answer_at = jnp.where(idx + len(THINK_CLOSE) < n, next_nonws[after_close], n)
  answer_ok = (answer_at < n) & a_open[jnp.clip(answer_at, 0, n - 1)]
  # A later "</answer>" must exist after that "<answer>".
  close_after = jax.lax.cummax(jnp.where(a_close, idx, -1), reverse=True)
  content_from = answer_at + len(ANSWER_OPEN)
  has_close = close_after[jnp.clip(content_from, 0, n - 1)] >= content_from
  valid_close = t_close & answer_ok & has_close & (content_from < n)
  first_open = _first(t_open, n)
  j = _first(valid_close & (idx >= first_open + len(THINK_OPEN)), n)
  matched = (first_open < n) & (j < n)
  start = content_from[jnp.clip(j, 0, n - 1)]
  think_from = jnp.clip(first_open + len(THINK_OPEN), 0, n - 1)
  thought = matched & (next_nonws[think_from] < j)
  think_end = jnp.where(matched, j, 0).astype(jnp.int32)
  return matched, start, thought, think_end


def _plain_answer(a_open, a_close):
  """``<answer>...</answer>``: whether it matched, where its content
  starts."""
  n = a_open.shape[0]
  idx = jnp.arange(n)
  first_open = _first(a_open, n)
  start = first_open + len(ANSWER_OPEN)
  close_after = jax.lax.cummax(jnp.where(a_close, idx, -1), reverse=True)
  matched = (
    (first_open < n)
    & (close_after[jnp.clip(start, 0, n - 1)] >= start)
    & (start < n)
  )
  return matched, start


def _removed(content, length, marker: bytes):
  """``content`` with every occurrence of ``marker`` removed (one
  ``str.replace``)."""
  n = content.shape[0]
  hit = _find(content, length, marker)
  covered = jnp.zeros(n, bool)
  for k in range(len(marker)):
    covered = covered | jnp.concatenate([jnp.zeros(k, bool), hit[: n - k]])
  return pack([(content, (jnp.arange(n) < length) & ~covered)], n)


def _parts(content: jax.Array, length: jax.Array, max_actions: int):
  """Where each ``||``-separated part's first and last non-space byte is
  (``[max_actions]`` each), and how many parts there are."""
  n = content.shape[0]
  idx = jnp.arange(n)
  inside = idx < length
  bar = (content == ord("|")) & inside
  # "a|||b".split("||") -> ["a", "|b"]: in a run of bars, separators start
  # at every even offset from the run's start.
  run_start = jax.lax.cummax(
    jnp.where(bar & ~jnp.concatenate([jnp.zeros(1, bool), bar[:-1]]), idx, -1)
  )
  pair = bar & jnp.concatenate([bar[1:], jnp.zeros(1, bool)])
  sep = pair & ((idx - run_start) % 2 == 0)
  in_sep = sep | jnp.concatenate([jnp.zeros(1, bool), sep[:-1]])
  part = jnp.cumsum(sep)  # part index of each byte
  is_ws = jnp.isin(content, jnp.frombuffer(WHITESPACE, np.uint8))
  solid = inside & ~in_sep & ~is_ws
  prev_solid = jax.lax.cummax(jnp.where(solid, idx, -1))
  prev_solid = jnp.concatenate([jnp.full(1, -1), prev_solid[:-1]])
  first = solid & (
    (prev_solid < 0) | (part[jnp.maximum(prev_solid, 0)] != part)
  )
  next_solid = jax.lax.cummin(jnp.where(solid, idx, n), reverse=True)
  next_solid = jnp.concatenate([next_solid[1:], jnp.full(1, n)])
  last = solid & (
    (next_solid >= n) | (part[jnp.minimum(next_solid, n - 1)] != part)
  )
  starts, num = pack([(idx, first)], max_actions)
  ends, _ = pack([(idx, last)], max_actions)
  return starts, ends, num


def _whole_answer(
  content: jax.Array, length: jax.Array, matched: jax.Array, max_actions: int
) -> Parsed:
  """A free-text answer: one part (action 0) when it is not blank."""
  inside = jnp.arange(content.shape[0]) < length
  is_ws = jnp.isin(content, jnp.frombuffer(WHITESPACE, np.uint8))
  given = matched & jnp.any(inside & ~is_ws)
  first = jnp.arange(max_actions) == 0
  return Parsed(
    matched=matched,
    thought=jnp.zeros((), bool),
    actions=jnp.where(first & given, 0, -1).astype(jnp.int32),
    num_parts=given.astype(jnp.int32),
    answer=content,
    answer_length=length,
    think_end=jnp.zeros((), jnp.int32),
    think_tokens=jnp.zeros((), jnp.int32),
  )


def _split_actions(
  content: jax.Array,
  length: jax.Array,
  matched: jax.Array,
  max_actions: int,
  action_bytes: jax.Array,
  action_lengths: jax.Array,
) -> Parsed:
  """An answer of action names split on ``||``, each part trimmed and
  matched to a name case-insensitively (-1: none)."""
  n = content.shape[0]
  starts, ends, num = _parts(content, length, max_actions)
  num_parts = jnp.where(matched, jnp.minimum(num, max_actions), 0)
  # Compare each part with each action name, case-insensitively.
  width = action_bytes.shape[1]
  offs = jnp.arange(width)
  part_len = ends - starts + 1  # [A]
  window = content[jnp.clip(starts[:, None] + offs, 0, n - 1)]  # [A, width]
  lower = jnp.where(
    (window >= ord("A")) & (window <= ord("Z")), window + 32, window
  )
  same = (lower[:, None, :] == action_bytes[None, :, :]) | (
    offs[None, None, :] >= action_lengths[None, :, None]
  )
  names = jnp.all(same, axis=-1) & (
    part_len[:, None] == action_lengths[None, :]
  )
  found = jnp.any(names, axis=-1)
  live = jnp.arange(max_actions) < num_parts
  actions = jnp.where(found & live, jnp.argmax(names, axis=-1), -1)
  return Parsed(
    matched=matched,
    thought=jnp.zeros((), bool),
    actions=actions.astype(jnp.int32),
    num_parts=num_parts.astype(jnp.int32),
    answer=content,
    answer_length=length,
    think_end=jnp.zeros((), jnp.int32),
    think_tokens=jnp.zeros((), jnp.int32),
  )
