"""Sudoku (RAGEN's), as Jumanji's environment made a text environment.

  python -m starpo_jax.main --config=configs/sudoku.py
  python -m starpo_jax.main --config=configs/sudoku.py \\
    --config.env.name=sudoku            # Jumanji's mixed-difficulty puzzles

Jumanji's very easy puzzles (46 or more clues); a move is ``r<row>c<col>=
<digit>`` (729 names), a move the board does not allow costs the format
penalty and changes nothing. Reward 1 when the board is solved.
"""

from configs import common


def get_config(arg=None):
  return common.jumanji_puzzle("sudoku_easy", arg, max_context=640)
