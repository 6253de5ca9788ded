"""Log-probabilities and values of the generated tokens of packed
sequences, in chunks of the vocabulary (never a whole ``[B, L, V]``
logits array), with the sampling's temperature and allowed tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from starpo_jax.agent.rollout import (
  Trajectory,
)
from starpo_jax.models.attention import TurnWindow
from starpo_jax.models.shared import Shared


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


def in_micro_batches(
  fn: Callable[..., Any], tokens_budget: int, micro: int = 0
):
  """``fn(tokens [B, L], *rows)`` on micro-batches of rows holding at most
  ``tokens_budget`` tokens each (``micro_batches``; 0: all at once), one
  after another: a forward pass without gradients (scoring, diagnostics)
  within ``algo.micro_batch_tokens``, as the update's. ``micro``: this
  many micro-batches instead. Every argument and output is ``[B, ...]``."""

  def run(tokens: jax.Array, *rows: jax.Array):
    count = micro or micro_batches(
      tokens.shape[0], tokens.shape[1], tokens_budget
    )
    if count == 1:
      return fn(tokens, *rows)
    split = lambda x: x.reshape(count, x.shape[0] // count, *x.shape[1:])
    out = jax.lax.map(lambda xs: fn(*xs), tuple(map(split, (tokens, *rows))))
    return jax.tree.map(lambda y: y.reshape(-1, *y.shape[2:]), out)

  return run


def _before_each(
  model: Any,
  tokens: jax.Array,
  positions: jax.Array,
  window: TurnWindow | None,
  shared: Shared | None = None,
) -> jax.Array:
  """Hidden states ``[B, G, D]`` that predict the tokens at ``positions``:
  the token at position p is predicted from the hidden state at p - 1.
  ``positions`` must be ``_within(tokens, ...)``; ``window``, of at least
  ``tokens``' length, hides older turns (cut to that length here);
  ``shared``: the prompts the rows share, each computed once."""
  before = jnp.maximum(positions - 1, 0)
  if shared is not None:
    return model.hidden(tokens, at=before, shared=shared)[0]
  if window is not None and window.width:
    return _reprefilled(model, tokens, before, window.cut(tokens.shape[1]))
  if window is not None:
    window = window.cut(tokens.shape[1])
  return model.hidden(tokens, window=window, at=before)[0]


def _reprefilled(
  model: Any, tokens: jax.Array, before: jax.Array, window: TurnWindow
) -> jax.Array:
  """The hidden states at ``before [B, G]``, each from the prompt its turn
  was played under with ``context_method="reprefill"``: the system prompt
  and the window's visible turns at consecutive positions, as a sequence
  of its own (at most ``window.width`` tokens). The turns that see every
  turn before them (the first ``window.size``) share one sequence; each
  later turn has its own."""
  turns, size, width = window.turns, window.size, window.width
  length = tokens.shape[1]
  # A state belongs to the turn of its token (the system prompt's, to the
  # first turn's prompt).
  query = jnp.maximum(jnp.take_along_axis(turns, before, axis=1), 0)
  system = jnp.argmax(turns >= 0, axis=1)[:, None]
  slot = jnp.arange(width)
  out = None
  for t in range(size - 1, max(window.max_turns, size)):
    first = t - size + 1
    # Where turn ``first`` begins: the system prompt's end for the first.
    begin = jnp.argmax(turns >= first, axis=1)[:, None]
    begin = jnp.where(first > 0, begin, system)
    at = jnp.where(slot < system, slot, begin + slot - system)
    here = jnp.clip(before - begin + system, 0, width - 1)
    here = jnp.where(before < system, before, here)
    picked, _ = model.hidden(
      jnp.take_along_axis(tokens, jnp.clip(at, 0, length - 1), axis=1),
      at=here,
    )
    mine = (query <= t) if first <= 0 else (query == t)
    out = picked if out is None else jnp.where(mine[..., None], picked, out)
  return out


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
  window: TurnWindow | None = None,
  shared: Shared | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Log-probabilities and entropies of the generated tokens.

  The backbone runs over the whole sequence; logits are formed only for
  the generated tokens (``positions``), ``chunk`` tokens at a time
  (``models.head``), so a large vocabulary never needs ``[B, L, V]``.

  Args:
    tokens: ``[B, L]``.
    positions: ``[B, G]`` where the generated tokens are.
    window: the turns each token sees (``Distribution.context``; None:
      all before it).
    shared: the prompts the rows share (``models.shared``; None: none).

  Returns:
    ``logp`` and ``entropy``, ``[B, G]``.
  """
  positions = _within(tokens, positions)
  h_prev = _before_each(model, tokens, positions, window, shared)
  targets = jnp.take_along_axis(tokens, positions, axis=1)
  return model.token_logprobs(h_prev, targets, temperature, allowed, chunk)


def sequence_values(
  critic: Any,
  tokens: jax.Array,
  positions: jax.Array,
  window: TurnWindow | None = None,
  shared: Shared | None = None,
) -> jax.Array:
  """The critic's value ``[B, G]`` of the state before each generated
  token (``tokens [B, L]``, ``positions [B, G]``), seeing what the policy
  saw (``window``), the rows' ``shared`` prompts computed once."""
  positions = _within(tokens, positions)
  h = _before_each(critic, tokens, positions, window, shared)
  return critic.values(h)
