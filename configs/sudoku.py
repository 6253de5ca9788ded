"""Sudoku (RAGEN's), as Jumanji's environment made a text environment.

  python -m starpo_jax.main --config=configs/sudoku.py
  python -m starpo_jax.main --config=configs/sudoku.py \\
    --config.env.name=sudoku            # Jumanji's mixed-difficulty puzzles

Jumanji's very easy puzzles (46 or more clues); a move is ``r<row>c<col>=
<digit>`` (729 names), a move the board does not allow costs the format
penalty and changes nothing. Reward 1 when the board is solved.

Five turns of up to 8 moves, 40 an episode, where the other puzzles allow
10: the very easy boards have 1 to 35 empty cells, and with 10 moves only
the boards with at most 10 (23% of them) can be finished, most of whose
cells admit one digit, so random legal play finishes nearly all of those
(22% against the planner's 23% on 256 boards) and no policy could beat it
by a measurable margin. With 40, the planner finishes every board and
random legal play 40-51%. A warm start on the planner's moves (the
database solved on the host, the cells with the fewest candidates first)
is one flag away, ``--config.sft.steps=300 --config.optim.lr=1e-4``; the
tiny model learned too little from it to be the default (16% legal
placements, no board finished: docs/results.md).
"""

from configs import common


def get_config(arg=None):
  c = common.jumanji_puzzle("sudoku_easy", arg, max_context=640)
  c.rollout.max_actions_per_turn = 8
  c.rollout.max_actions_per_traj = 40
  if c.model.preset == "tiny":
    c.rollout.max_new_tokens = 17
  return c
