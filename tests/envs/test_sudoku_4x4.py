"""4x4 Sudoku: rules against a plain-Python peer, levels, the planner."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

import envs
from envs.jax.sudoku import constants, generator
from reference import envs as ref
from tests.envs.conftest import NUM_LEVELS, level_pool, play, text, to_numpy


def is_sudoku(grid: np.ndarray) -> bool:
  """Every row, column and 2x2 box holds 1..4 once (plain NumPy)."""
  units = [*grid, *grid.T]
  units += [grid[r : r + 2, c : c + 2].ravel() for r in (0, 2) for c in (0, 2)]
  return all(sorted(u.tolist()) == [1, 2, 3, 4] for u in units)


def all_sudokus() -> set:
  """Every 4x4 Sudoku, from all 24**4 stacks of permuted rows (plain
  Python: columns and boxes hold four different digits)."""
  rows = list(itertools.permutations((1, 2, 3, 4)))
  boxes = [
    [(r, c) for r in rs for c in cs]
    for rs in ((0, 1), (2, 3))
    for cs in ((0, 1), (2, 3))
  ]
  return {
    g
    for g in itertools.product(rows, repeat=4)
    if all(len(set(col)) == 4 for col in zip(*g, strict=True))
    and all(len({g[r][c] for r, c in box}) == 4 for box in boxes)
  }


def peer(board: np.ndarray, max_steps: int = 100) -> ref.Sudoku:
  return ref.Sudoku(board.reshape(4, 4).tolist(), box=2, max_steps=max_steps)


def test_action_names_are_row_column_digit_from_one():
  names = constants.ACTIONS
  assert len(names) == 64 and names[0] == "r1c1=1" and names[-1] == "r4c4=4"
  # Action id = cell * 4 + digit - 1, cells row-major.
  assert names[(1 * 4 + 2) * 4 + 3 - 1] == "r2c3=3"


def test_solved_boards_are_every_4x4_sudoku_once():
  boards = generator.solved_boards()
  assert boards.shape == (288, 16)
  assert {tuple(map(tuple, b.reshape(4, 4))) for b in boards} == all_sudokus()


def test_levels_are_sudokus_with_6_to_10_cells_emptied():
  boards = to_numpy(level_pool("sudoku_4x4")).board
  solved = generator.solved_boards()
  empty = (boards == 0).sum(axis=1)
  assert set(empty.tolist()) == set(range(6, 11))
  for board in boards:
    clue = board > 0
    assert (solved[:, clue] == board[clue]).all(axis=1).any()
  # Every cell is emptied about as often (10 of 16 at most, 8 on average).
  per_cell = (boards == 0).mean(axis=0)
  assert np.abs(per_cell - 0.5).max() < 0.07, per_cell


def draw_moves(board: np.ndarray, steps: int, rng) -> list:
  """Actions for one level: legal ones (by the plain-Python rules) two
  times in three, otherwise any of the 64."""
  game, out = peer(board), []
  for _ in range(steps):
    moves = game.moves()
    if moves and rng.random() < 2 / 3:
      r, c, d = moves[rng.integers(len(moves))]
    else:
      r, c, d = (int(v) for v in rng.integers(0, 4, 3))
      d += 1
    game.step(r, c, d)
    out.append((r * 4 + c) * 4 + d - 1)
  return out


@pytest.mark.parametrize("mode", ["grid", "cells"])
def test_steps_and_text_match_the_plain_python_rules(mode):
  env = envs.make("sudoku_4x4", max_steps=6, render_mode=mode)
  levels, steps = 128, 14
  states = jax.tree.map(lambda x: x[:levels], level_pool("sudoku_4x4"))
  boards = to_numpy(states).board
  rng = np.random.default_rng(0)
  actions = np.array([draw_moves(b, steps, rng) for b in boards])
  out = play(env, states, actions)
  seen = set()
  for i in range(levels):
    game = peer(boards[i], max_steps=6)
    assert text(env.spec, out["pieces0"][i], out["n0"][i]) == game.text(mode)
    for t in range(steps):
      a = int(actions[i, t])
      want = game.step(a // 16, a // 4 % 4, a % 4 + 1)
      for field in ("reward", "terminated", "truncated", "success", "valid"):
        got = out[field][i, t]
        assert got == getattr(want, field), (i, t, field)
      assert out["effective"][i, t] == want.effective, (i, t)
      assert text(env.spec, out["pieces"][i, t], out["n"][i, t]) == game.text(
        mode
      )
      seen.add((want.valid, want.terminated, want.truncated, want.success))
  # Legal and illegal moves, dead ends, truncation and solved boards met.
  assert (False, False, False, False) in seen
  assert (True, True, False, False) in seen
  assert any(s[2] for s in seen) and any(s[3] for s in seen), seen


def candidates(game: ref.Sudoku) -> dict:
  """Empty cell -> how many digits fit it now (plain Python)."""
  return {
    (r, c): sum(game.fits(r, c, d) for d in range(1, 5))
    for r in range(4)
    for c in range(4)
    if not game.grid[r][c]
  }


def test_plans_fill_every_level_a_forced_cell_first():
  env = envs.make("sudoku_4x4")
  levels = 256
  states = jax.tree.map(lambda x: x[:levels], level_pool("sudoku_4x4"))
  plans = to_numpy(jax.jit(jax.vmap(lambda s: env.plan(s, 16)))(states))
  for i, board in enumerate(to_numpy(states).board):
    game, n = peer(board), int((board == 0).sum())
    assert plans.length[i] == n
    actions = plans.actions[i]
    assert (actions[:n] >= 0).all() and (actions[n:] == -1).all()
    for a in actions[:n]:
      r, c, d = a // 16, a // 4 % 4, a % 4 + 1
      count = candidates(game)
      assert count[r, c] == min(count.values()), (i, a)
      assert game.step(r, c, d).valid, (i, a)
    assert game.solved() and is_sudoku(np.array(game.grid))


def test_a_board_with_a_wrong_legal_digit_has_no_plan():
  env = envs.make("sudoku_4x4")
  boards = to_numpy(level_pool("sudoku_4x4")).board
  solved = generator.solved_boards()
  for board in boards:
    game = peer(board)
    for r, c, d in game.moves():
      wrong = board.copy()
      wrong[r * 4 + c] = d
      clue = wrong > 0
      if not (solved[:, clue] == wrong[clue]).all(axis=1).any():
        break
    else:
      continue
    break
  state, _ = env.reset(jax.random.key(0))
  plan = env.plan(state.replace(board=jax.numpy.asarray(wrong)), 16)
  assert int(plan.length) == -1 and (np.asarray(plan.actions) == -1).all()
  assert (
    int(env.plan(state.replace(board=jax.numpy.asarray(board)), 16).length) > 0
  )


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"min_empty": 0}, "min_empty must be an integer from 1 to 16"),
    ({"max_empty": 17}, "max_empty must be an integer from 1 to 16"),
    ({"min_empty": 9, "max_empty": 8}, "min_empty=9 is more than max_empty=8"),
    ({"max_steps": 0}, "max_steps must be a positive integer"),
    ({"render_mode": "coord"}, "render_mode='coord'; expected one of"),
  ],
)
def test_bad_settings_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    envs.make("sudoku_4x4", **kwargs)
  assert NUM_LEVELS >= 256
