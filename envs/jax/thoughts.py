"""Reasoning about a board, written from its state: what an expert thinks
before the actions of its turn (the warm start's ``sft.reasoning="board"``).

Every phrase is grounded in the state: where the player is, where it must
go, what is in the way, and where the turn's actions lead (the predicted
next state, as in SPA, arXiv 2510.15047). Like an observation, the text is
pieces of a ``PieceTable`` of its own (not the environment's, whose pieces
fix the observation's token budget), assembled from fixed-size segments so
that writing it ``jit``s and ``vmap``s.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from envs.jax import render
from envs.jax.render import Segment, fixed


class BoardThoughts:
  """The phrases an environment's expert reasoning is made of, on a board
  of ``rows`` x ``cols`` cells whose actions are ``action_names``; the
  environment's own ``phrases`` are registered up front, as the table's
  pieces are spelled before anything is written."""

  OFFSET = (": ", " down", " up", " and ", " right", " left")

  def __init__(
    self,
    rows: int,
    cols: int,
    action_names: Sequence[str],
    phrases: Sequence[str],
  ):
    self.rows, self.cols = rows, cols
    self.table = render.PieceTable()
    self._phrases = {t: self.table.add(t) for t in (*self.OFFSET, *phrases)}
    self.coords = render.CoordPieces(self.table, rows, cols)
    self.action_ids = self.table.add_all(list(action_names))
    self.then = self.coords.comma
    self.width = render.num_digits(max(rows, cols))

  @property
  def pieces(self) -> tuple[str, ...]:
    return self.table.pieces

  def phrase(self, text: str, keep: jax.typing.ArrayLike = True) -> Segment:
    """A registered phrase, kept where ``keep``."""
    return fixed([self._phrases[text]], keep)

  def cell(self, flat: jax.Array) -> Segment:
    """``(r, c)`` of one flat cell index."""
    cells = jnp.arange(self.rows * self.cols)
    return self.coords.segment(cells == flat)

  def cells(self, mask: jax.Array) -> Segment:
    """``(r, c), (r, c), ...`` of the cells a ``[rows * cols]`` mask sets."""
    return self.coords.segment(mask)

  def count(self, value: jax.Array, keep: jax.Array) -> Segment:
    """A non-negative count in decimal, kept where ``keep``."""
    ids, digits = render.number(value, self.coords.digits, self.width)
    return ids, digits & keep

  def actions(self, actions: jax.Array) -> Segment:
    """``Down, Right``: the names of ``actions [A]`` (``-1`` past the end)."""
    n = actions.shape[0]
    names = jnp.asarray(self.action_ids)[jnp.maximum(actions, 0)]
    seps = jnp.full((n,), self.then, jnp.int32)
    ids = jnp.stack([seps, names], axis=1).reshape(-1)
    live = actions >= 0
    keep = jnp.stack([live & (jnp.arange(n) > 0), live], axis=1).reshape(-1)
    return ids, keep

  def offset(self, here: jax.Array, there: jax.Array) -> list[Segment]:
    """``: 2 down and 1 right``: where cell ``there`` lies from cell
    ``here``, each axis named only when it differs."""
    rows = there // self.cols - here // self.cols
    cols = there % self.cols - here % self.cols
    vertical, horizontal = rows != 0, cols != 0
    return [
      self.phrase(": ", vertical | horizontal),
      self.count(jnp.abs(rows), vertical),
      self.phrase(" down", rows > 0),
      self.phrase(" up", rows < 0),
      self.phrase(" and ", vertical & horizontal),
      self.count(jnp.abs(cols), horizontal),
      self.phrase(" right", cols > 0),
      self.phrase(" left", cols < 0),
    ]

  def neighbours(self, cell: jax.Array) -> jax.Array:
    """``[rows * cols]`` bool: the cells next to ``cell`` (not diagonal)."""
    cells = jnp.arange(self.rows * self.cols)
    dr = jnp.abs(cells // self.cols - cell // self.cols)
    dc = jnp.abs(cells % self.cols - cell % self.cols)
    return dr + dc == 1

  def write(self, segments: list[Segment]) -> tuple[jax.Array, jax.Array]:
    """Piece ids ``[M]`` of the kept pieces, and how many."""
    size = sum(s[0].shape[0] for s in segments)
    return render.pack(segments, size)
