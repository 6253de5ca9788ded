"""Sudoku on a 4x4 board (SPA's Sudoku), StarPO-S after a planner warm start.

  python -m starpo_jax.main --config=configs/sudoku_4x4.py

Levels are one of the 288 solved boards with 6 to 10 cells emptied; a move
is ``r<row>c<col>=<digit>`` (64 names), and a move the board does not allow
costs the format penalty and changes nothing. Reward 1 when the board is
full; an empty cell no digit fits ends the episode. Random legal play
finishes about half the boards (a wrong legal digit leads to a dead end),
placing a forced cell first nearly all: the room a policy has to beat it.
Eight turns of up to 2 moves, 16 an episode, so a 10-cell board leaves
room for six invalid moves. The warm start imitates the planner (the first
solved board agreeing with the level, a cell with the fewest candidates
first) over whole episodes, 800 steps; a compact vocabulary spells each
move as its cell, then its digit. 20 minutes on a 2-core CPU: 60.7%
held-out against random legal play's 45.9% (docs/results.md, "Sudoku").
"""

from configs import common


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = common.base_config()
  c.env.name = "sudoku_4x4"
  common.apply_presets(c, args)
  c.rollout.max_turns = 8
  c.rollout.max_actions_per_turn = 2
  c.rollout.max_actions_per_traj = 16
  if args["model"] == "tiny":
    c.rollout.max_new_tokens = 8
    c.rollout.max_context = 400
    # Whole episodes imitated: a policy taught first turns only went on
    # naming the cells it had filled once the board changed. The planner
    # fills any level in 5 turns.
    c.sft.steps = 800
    c.sft.max_turns = 5
    c.sft.episodes = 64
    c.train.steps = 150
    # An evaluation of 512 episodes at two temperatures takes about 50 s.
    c.train.eval_every = 400
    c.optim.lr = 1e-4
    c.rollout.env_groups = 16
    c.rollout.group_size = 8
  return c
