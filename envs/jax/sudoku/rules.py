"""Sudoku's rules inside ``jit``, for any box size (the 4x4 environment's
and Jumanji's 9x9 planner share them).

A board is ``[N * N]`` int32, row-major, 0 for an empty cell and 1..N for
a digit, with N = box * box.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def legal(board: jax.Array, box: int) -> jax.Array:
  """``[N * N, N]`` bool: digit ``d + 1`` may go in each cell: the cell is
  empty and its row, column and box do not hold the digit."""
  n = box * box
  grid = board.reshape(n, n)
  held = jax.nn.one_hot(grid - 1, n, dtype=bool)  # [N, N, N]; 0 -> none
  row = jnp.any(held, axis=1)  # [row, digit]
  col = jnp.any(held, axis=0)  # [column, digit]
  boxes = jnp.any(held.reshape(box, box, box, box, n), axis=(1, 3))
  r, c = jnp.divmod(jnp.arange(n * n), n)
  used = row[r] | col[c] | boxes[r // box, c // box]
  return (board == 0)[:, None] & ~used


def fill_moves(
  board: jax.Array, solution: jax.Array, box: int, horizon: int
) -> jax.Array:
  """``[horizon]`` int32 moves (``cell * N + digit - 1``) filling ``board``
  with ``solution``'s digits, each in a cell with the fewest legal digits
  on the board as it then stands (ties row-major); ``-1`` once it is full.
  ``solution`` must agree with every filled cell."""
  n = box * box

  def place(board, _):
    count = jnp.sum(legal(board, box), axis=1)
    cell = jnp.argmin(jnp.where(board == 0, count, n + 1))  # first of ties
    go = board[cell] == 0
    move = jnp.where(go, cell * n + solution[cell] - 1, -1)
    return jnp.where(go, board.at[cell].set(solution[cell]), board), move

  _, moves = jax.lax.scan(place, board, None, length=horizon)
  return moves.astype(jnp.int32)
