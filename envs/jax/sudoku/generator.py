"""4x4 Sudoku puzzles inside ``jit``.

A level is one of the 288 solved 4x4 boards, uniformly, with a uniform
number of its cells (from ``min_empty`` to ``max_empty``) emptied at
uniformly random places. A puzzle may then have several solutions; any
board filled by legal moves is solved.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from envs.jax.sudoku import constants


@functools.cache
def solved_boards() -> np.ndarray:
  """Every solved 4x4 board, ``[288, 16]`` int32, in lexicographic order
  (row-major cells), by depth-first search over cells."""
  n, box = constants.SIZE, constants.BOX
  out, grid = [], [0] * (n * n)

  def fits(cell: int, digit: int) -> bool:
    r, c = divmod(cell, n)
    br, bc = r // box * box, c // box * box
    return all(
      grid[i] != digit
      for i in range(cell)
      if i // n == r
      or i % n == c
      or (br <= i // n < br + box and bc <= i % n < bc + box)
    )

  def fill(cell: int) -> None:
    if cell == n * n:
      out.append(list(grid))
      return
    for digit in range(1, n + 1):
      if fits(cell, digit):
        grid[cell] = digit
        fill(cell + 1)
    grid[cell] = 0

  fill(0)
  return np.asarray(out, np.int32)


def generate(key: jax.Array, *, min_empty: int, max_empty: int) -> jax.Array:
  """A puzzle, ``[16]`` int32, 0 for an empty cell."""
  k_board, k_count, k_cells = jax.random.split(key, 3)
  boards = jnp.asarray(solved_boards())
  solution = boards[jax.random.randint(k_board, (), 0, boards.shape[0])]
  count = jax.random.randint(k_count, (), min_empty, max_empty + 1)
  order = jax.random.permutation(k_cells, constants.CELLS)
  return jnp.where(order < count, 0, solution)
