"""Jittable building blocks for observations made of text pieces.

An observation is a ragged sequence of piece ids. Renderers assemble it from
fixed-size segments, each an ``(ids, keep)`` pair of equal-length arrays, and
``pack`` moves the kept ids to the front of a fixed-size array. Shapes stay
static, so rendering ``jit``s and ``vmap``s.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

Segment = tuple[jax.Array, jax.Array]  # ids [M] int32, keep [M] bool


class PieceTable:
  """The distinct strings an environment emits, numbered in first-use order."""

  def __init__(self) -> None:
    self._ids: dict[str, int] = {}

  def add(self, text: str) -> int:
    if text not in self._ids:
      self._ids[text] = len(self._ids)
    return self._ids[text]

  def add_all(self, texts: Sequence[str]) -> np.ndarray:
    return np.asarray([self.add(t) for t in texts], np.int32)

  @property
  def pieces(self) -> tuple[str, ...]:
    return tuple(self._ids)


def fixed(ids: Sequence[int] | np.ndarray, keep: jax.typing.ArrayLike = True):
  """A segment of constant ids, all kept or all dropped."""
  ids = jnp.asarray(ids, jnp.int32)
  return ids, jnp.broadcast_to(jnp.asarray(keep, bool), ids.shape)


def pack(segments: Sequence[Segment], size: int) -> tuple[jax.Array, jax.Array]:
  """Concatenates segments, keeping only kept ids, into ``[size]``.

  Returns:
    The packed ids ``[size]`` (zero-padded) and how many are used.
  """
  ids = jnp.concatenate([s[0] for s in segments])
  keep = jnp.concatenate([s[1] for s in segments])
  pos = jnp.where(keep, jnp.cumsum(keep) - 1, size)
  out = jnp.zeros((size,), jnp.int32).at[pos].set(ids, mode="drop")
  return out, jnp.sum(keep, dtype=jnp.int32)


def num_digits(max_value: int) -> int:
  return len(str(max(int(max_value), 0)))


def number(value: jax.Array, digit_ids: np.ndarray, width: int) -> Segment:
  """Decimal digits of a non-negative integer without leading zeros.

  Args:
    value: int32 [...], each below ``10 ** width``.
    digit_ids: the piece ids of "0".."9".
    width: the most digits any value has.

  Returns:
    ids and keep, ``[..., width]``.
  """
  powers = jnp.asarray(10 ** np.arange(width - 1, -1, -1), jnp.int32)
  value = jnp.asarray(value, jnp.int32)[..., None]
  digits = (value // powers) % 10
  keep = (value >= powers) | (powers == 1)
  return jnp.asarray(digit_ids, jnp.int32)[digits], keep


class CoordPieces:
  """Piece ids for lists of ``(r, c)`` pairs, as in RAGEN's coord render."""

  def __init__(self, table: PieceTable, rows: int, cols: int) -> None:
    self.digits = table.add_all([str(d) for d in range(10)])
    self.open = table.add("(")
    self.comma = table.add(", ")
    self.close = table.add(")")
    self.rows, self.cols = rows, cols
    self.width = num_digits(max(rows, cols) - 1)

  def segment(self, mask: jax.Array) -> Segment:
    """``(r, c), (r, c), ...`` for the set cells of a ``[rows * cols]`` mask.

    Returns:
      A segment of ``rows * cols * (4 + 2 * width)`` slots.
    """
    cells = jnp.arange(self.rows * self.cols)
    r_ids, r_keep = number(cells // self.cols, self.digits, self.width)
    c_ids, c_keep = number(cells % self.cols, self.digits, self.width)
    n = cells.shape[0]
    const = lambda piece: jnp.full((n, 1), piece, jnp.int32)
    yes = jnp.ones((n, 1), bool)
    # A separator goes before every listed cell but the first.
    sep = (mask & (jnp.cumsum(mask) > 1))[:, None]
    ids = jnp.concatenate(
      [
        const(self.comma),
        const(self.open),
        r_ids,
        const(self.comma),
        c_ids,
        const(self.close),
      ],
      axis=1,
    )
    keep = jnp.concatenate([sep, yes, r_keep, yes, c_keep, yes], axis=1)
    keep = keep & mask[:, None]
    return ids.reshape(-1), keep.reshape(-1)

  def line(self, label_id: int, mask: jax.Array) -> list[Segment]:
    """A label followed by its coordinates; dropped when none are set."""
    ids, keep = self.segment(mask)
    return [fixed([label_id], jnp.any(mask)), (ids, keep)]

  def max_line_pieces(self) -> int:
    return 1 + self.rows * self.cols * (4 + 2 * self.width)


class BoardText:
  """RAGEN's board observations: ``grid``, ``coord`` or ``grid_coord``.

  ``grid`` draws one symbol per cell kind, rows separated by newlines.
  ``coord`` states the board size, then one line per label listing the
  cells of its mask as ``(r, c)`` pairs (lines with no cells are left out).
  ``grid_coord`` is ``"Coordinates: \n"`` + coord + ``"\nGrid Map: \n"`` +
  grid.
  """

  MODES = ("grid", "coord", "grid_coord")

  def __init__(
    self,
    table: PieceTable,
    rows: int,
    cols: int,
    symbols: Sequence[str],
    labels: Sequence[str],
    mode: str,
    max_listed: int,
  ) -> None:
    """Registers the pieces in ``table``.

    Args:
      symbols: one per cell kind.
      labels: the coord lines, in order.
      max_listed: most ``(r, c)`` entries a coord render lists in total.
    """
    self.rows, self.cols, self.mode = rows, cols, mode
    self.table = table
    self.symbol_ids = table.add_all(symbols)
    self.newline = table.add("\n")
    self.grid_pieces = rows * (cols + 1) - 1
    self.max_pieces = self.grid_pieces
    self.max_listed = max_listed
    if mode == "grid":
      return
    self.coords = CoordPieces(table, rows, cols)
    self.header = table.add(
      f"Board size: {rows} rows x {cols} cols (zero-indexed)."
    )
    self.labels = table.add_all([f"\n{label}: " for label in labels])
    entry = 4 + 2 * self.coords.width
    self.max_pieces = 1 + len(labels) + max_listed * entry
    if mode == "grid_coord":
      self.coord_title = table.add("Coordinates: \n")
      self.grid_title = table.add("\nGrid Map: \n")
      self.max_pieces += 2 + self.grid_pieces

  def piece_limits(self) -> tuple[int, ...]:
    """The most times each piece of the table appears in one render, for
    ``EnvSpec.piece_limits`` (so a tokenizer's observation budget counts a
    long header once, not in every slot); the table holds this render's
    pieces only."""
    counts = np.zeros(len(self.table.pieces), np.int64)

    def add(ids, times: int) -> None:
      counts[np.unique(np.asarray(ids))] += times

    if self.mode != "coord":
      add(self.symbol_ids, self.rows * self.cols)
      add([self.newline], self.rows - 1)
    if self.mode != "grid":
      listed, width = self.max_listed, self.coords.width
      np.add.at(counts, np.asarray([self.header, *self.labels]), 1)
      add(self.coords.digits, 2 * width * listed)
      add([self.coords.open, self.coords.close], listed)
      add([self.coords.comma], 2 * listed)
    if self.mode == "grid_coord":
      add([self.coord_title, self.grid_title], 1)
    return tuple(int(c) for c in counts)

  def grid(self, kinds: jax.Array) -> jax.Array:
    """Cell kinds ``[rows * cols]`` -> grid piece ids ``[grid_pieces]``."""
    ids = jnp.asarray(self.symbol_ids)[kinds].reshape(self.rows, self.cols)
    newline = jnp.full((self.rows, 1), self.newline, jnp.int32)
    return jnp.concatenate([ids, newline], axis=1).reshape(-1)[:-1]

  def __call__(
    self, kinds: jax.Array, masks: Sequence[jax.Array]
  ) -> tuple[jax.Array, jax.Array]:
    """Piece ids ``[max_pieces]`` and how many are used.

    Args:
      kinds: int ``[rows * cols]``, each cell's index into ``symbols``.
      masks: bool ``[rows * cols]`` per label, the cells its line lists.
    """
    if self.mode == "grid":
      return self.grid(kinds), jnp.asarray(self.grid_pieces, jnp.int32)
    segments = [fixed([self.header])]
    for label, mask in zip(self.labels, masks, strict=True):
      segments += self.coords.line(int(label), mask)
    if self.mode == "grid_coord":
      grid = self.grid(kinds)
      segments = [
        fixed([self.coord_title]),
        *segments,
        fixed([self.grid_title]),
        (grid, jnp.ones_like(grid, bool)),
      ]
    return pack(segments, self.max_pieces)
