"""A host-side Sudoku solver, for Jumanji's puzzle databases (which hold the
puzzles without their solutions).

``solve`` fills the cell with the fewest candidates first (a cell with one
is a forced move), backtracking when a cell has none; candidates are 9-bit
masks per row, column and box. ``solve_all`` solves a database once per
process.
"""

from __future__ import annotations

import functools

import numpy as np

_FULL = 0x1FF  # digits 1..9 as bits 0..8
_BOX = [[(r // 3) * 3 + c // 3 for c in range(9)] for r in range(9)]


def solve(board: np.ndarray) -> np.ndarray | None:
  """The solution of ``board`` (``[9, 9]``, 0 empty, 1..9 given), or None
  when it has none (a given clue repeated counts as none)."""
  grid = [[int(v) for v in row] for row in np.asarray(board)]
  rows, cols, boxes = [0] * 9, [0] * 9, [0] * 9
  empty = []
  for r in range(9):
    for c in range(9):
      v = grid[r][c]
      if not v:
        empty.append((r, c))
        continue
      bit = 1 << (v - 1)
      b = _BOX[r][c]
      if (rows[r] | cols[c] | boxes[b]) & bit:
        return None
      rows[r] |= bit
      cols[c] |= bit
      boxes[b] |= bit

  def fill(left: list[tuple[int, int]]) -> bool:
    if not left:
      return True
    best, best_free, best_n = 0, 0, 10
    for i, (r, c) in enumerate(left):
      free = _FULL & ~(rows[r] | cols[c] | boxes[_BOX[r][c]])
      n = free.bit_count()
      if n < best_n:
        best, best_free, best_n = i, free, n
        if n <= 1:
          break
    r, c = left[best]
    rest = left[:best] + left[best + 1 :]
    b = _BOX[r][c]
    free = best_free
    while free:
      bit = free & -free
      free ^= bit
      rows[r] |= bit
      cols[c] |= bit
      boxes[b] |= bit
      if fill(rest):
        grid[r][c] = bit.bit_length()
        return True
      rows[r] ^= bit
      cols[c] ^= bit
      boxes[b] ^= bit
    return False

  if not fill(empty):
    return None
  return np.asarray(grid, np.int8)


@functools.cache
def solve_all(path: str) -> np.ndarray:
  """Every puzzle of the database at ``path`` (``.npy``, ``[N, 9, 9]``)
  solved, ``[N, 9, 9]`` int8; raises ``ValueError`` naming the first
  puzzle that has no solution."""
  puzzles = np.load(path)
  out = np.empty(puzzles.shape, np.int8)
  for i, board in enumerate(puzzles):
    solved = solve(board)
    if solved is None:
      raise ValueError(f"sudoku: puzzle {i} of {path} has no solution")
    out[i] = solved
  return out
