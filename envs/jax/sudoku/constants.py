"""The 4x4 board, its symbols and its action names."""

import itertools

BOX = 2  # a box is BOX x BOX cells
SIZE = BOX * BOX  # rows, columns, digits
CELLS = SIZE * SIZE

EMPTY = "."
SYMBOLS = (EMPTY, *(str(d) for d in range(1, SIZE + 1)))  # index = digit

# Action id = cell * SIZE + digit - 1, cells row-major: the same names as
# Jumanji's 9x9 Sudoku (envs/jax/jumanji_text.py).
ACTIONS = tuple(
  f"r{r + 1}c{c + 1}={d + 1}"
  for r, c, d in itertools.product(range(SIZE), repeat=3)
)

# What a move is spelled from: its cell, then its digit (a compact
# vocabulary gets a token for each, not one for each of the 64 moves).
CELL_PIECES = tuple(
  f"r{r + 1}c{c + 1}=" for r, c in itertools.product(range(SIZE), repeat=2)
)

INSTRUCTIONS = (
  "You are solving a 4x4 Sudoku: fill each empty cell (.) so that every "
  "row, column and 2x2 box holds 1 to 4 once. Name a move as r<row>c<column>"
  "=<digit>, rows and columns from 1. Example answer format: "
  "<answer>r1c3=4 || r2c1=2</answer>"
)
