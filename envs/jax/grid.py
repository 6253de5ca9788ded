"""Bitboard helpers for grid environments: one uint32 per row.

A flood fill over bitboards touches ``rows`` words per step instead of
``rows * cols`` booleans, which matters when thousands of levels are
generated at once. Rows are at most 32 cells wide.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

MAX_COLS = 32


def to_rows(mask: jax.Array, rows: int, cols: int) -> jax.Array:
  """Cell mask ``[..., rows * cols]`` -> bitboard ``[..., rows]`` uint32."""
  shifts = jnp.arange(cols, dtype=jnp.uint32)
  grid = mask.reshape(*mask.shape[:-1], rows, cols).astype(jnp.uint32)
  return jnp.sum(grid << shifts, axis=-1, dtype=jnp.uint32)


def to_cells(board: jax.Array, cols: int) -> jax.Array:
  """Bitboard ``[..., rows]`` -> cell mask ``[..., rows * cols]`` bool."""
  shifts = jnp.arange(cols, dtype=jnp.uint32)
  cells = ((board[..., None] >> shifts) & 1).astype(bool)
  return cells.reshape(*board.shape[:-1], -1)


def flood_fill(seed: jax.Array, free: jax.Array, steps: int) -> jax.Array:
  """Cells 4-connected to ``seed`` through ``free`` cells.

  Args:
    seed: bitboard ``[..., rows]``, the starting cells.
    free: bitboard ``[..., rows]``, the cells a path may enter.
    steps: how far to grow; the number of free cells bounds any path.

  Returns:
    Bitboard ``[..., rows]`` of the reached cells (``seed`` included).
  """
  edge = jnp.zeros_like(seed[..., :1])

  def grow(_, reach):
    below = jnp.concatenate([reach[..., 1:], edge], axis=-1)
    above = jnp.concatenate([edge, reach[..., :-1]], axis=-1)
    grown = (reach << 1) | (reach >> 1) | below | above
    return reach | (grown & free)

  return jax.lax.fori_loop(0, steps, grow, seed)
