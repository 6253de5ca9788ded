"""Jumanji's puzzles as text environments: random play inside jit against
the wrapped Jumanji environment stepped directly, and every rendered board
read back into the Jumanji state's arrays."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs import core
from envs.jax import sudoku_solver
from envs.jax.jumanji_text import FACES, GAMES
from tests.envs.conftest import index, to_numpy
from tests.helpers import assert_compiles_once

BATCH, STEPS = 16, 24


def same(a, b) -> jax.Array:
  """Whether two states hold the same arrays (their keys aside)."""
  leaves = [
    jnp.all(x == y)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    if not jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
  ]
  return jnp.all(jnp.stack(leaves))


@functools.cache
def played(name: str):
  """``STEPS`` random actions on ``BATCH`` episodes, each step beside
  Jumanji's own step on the same state and action."""
  env = envs.make(name)
  n = env.spec.num_actions

  def one(carry, key):
    state = carry
    action = jax.random.randint(key, (), 0, n)
    ours, ts = env.step(state, action)
    inner, theirs = env.env.step(
      state.inner, env._game.to_action(env.env, action)
    )
    pieces, count = env.render(ours)
    out = dict(
      action=action,
      allowed=env._available(state, action),
      done_before=state.done,
      reward=ts.reward,
      valid=ts.valid,
      success=ts.success,
      terminated=ts.terminated,
      their_reward=theirs.reward,
      their_last=theirs.last(),
      same_inner=same(ours.inner, inner),
      unchanged=same(ours.inner, state.inner),
      pieces=pieces,
      count=count,
      inner=ours.inner,
    )
    return ours, out

  @jax.jit
  def run(key):
    k_reset, k_play = jax.random.split(key)
    states, _ = jax.vmap(env.reset)(jax.random.split(k_reset, BATCH))
    keys = jax.random.split(k_play, (BATCH, STEPS))
    return jax.vmap(lambda s, k: jax.lax.scan(one, s, k)[1])(states, keys)

  return env, to_numpy(run(jax.random.key(7)))


def board_from_text(name: str, text: str) -> dict[str, np.ndarray]:
  """The rendered text read back into the arrays it was drawn from."""
  lines = text.split("\n")
  if name == "game2048":
    exponent = lambda t: 0 if t == "." else int(t).bit_length() - 1
    return {
      "board": np.asarray([list(map(exponent, ln.split())) for ln in lines])
    }
  if name.startswith("sudoku"):
    return {
      "board": np.asarray(
        [[".123456789".index(ch) - 1 for ch in ln] for ln in lines]
      )
    }
  if name.startswith("rubiks"):
    faces, k = [], 0
    for face in FACES:
      assert lines[k] == f"{face}:"
      size = len(lines[k + 1])
      faces.append(
        [[FACES.index(ch) for ch in ln] for ln in lines[k + 1 : k + 1 + size]]
      )
      k += 1 + size
    return {"cube": np.asarray(faces)}
  if name == "maze":
    grid = np.asarray([list(ln) for ln in lines])
    (agent,) = np.argwhere((grid == "P") | (grid == "@"))
    (target,) = np.argwhere((grid == "G") | (grid == "@"))
    return {"walls": grid == "#", "agent": agent, "target": target}
  if name == "sliding_tile_puzzle":
    return {
      "puzzle": np.asarray(
        [[0 if t == "_" else int(t) for t in ln.split()] for ln in lines]
      )
    }
  return {
    "board": np.asarray(
      [["?012345678".index(ch) - 1 for ch in ln] for ln in lines]
    )
  }


def state_arrays(name: str, inner, b: int, t: int) -> dict[str, np.ndarray]:
  if name == "maze":
    return {
      "walls": inner.walls[b, t],
      "agent": np.asarray(
        [inner.agent_position.row[b, t], inner.agent_position.col[b, t]]
      ),
      "target": np.asarray(
        [inner.target_position.row[b, t], inner.target_position.col[b, t]]
      ),
    }
  field = {"game2048": "board", "sliding_tile_puzzle": "puzzle"}.get(name)
  if name.startswith("rubiks"):
    field = "cube"
  field = field or "board"
  return {field: getattr(inner, field)[b, t]}


# One name per game's rules (``sudoku`` and ``rubiks_cube`` differ from
# these only in settings).
PLAYED = (
  "game2048",
  "sudoku_easy",
  "rubiks_cube_2x2",
  "maze",
  "sliding_tile_puzzle",
  "minesweeper",
)


@pytest.mark.parametrize("name", PLAYED)
def test_random_play_matches_jumanji_and_boards_read_back(name):
  env, out = played(name)
  live = ~out["done_before"]
  allowed = out["allowed"] & live
  # A legal action is Jumanji's step: the same state and reward.
  assert np.all(out["same_inner"][allowed])
  np.testing.assert_array_equal(
    out["reward"][allowed], out["their_reward"][allowed]
  )
  np.testing.assert_array_equal(out["valid"], out["allowed"])
  # Anything else changes nothing and pays nothing.
  assert np.all(out["unchanged"][~allowed])
  assert not np.any(out["reward"][~allowed])
  # The episode ends when Jumanji's does (or at the game's success).
  ended = out["terminated"] & allowed
  assert np.all(ended <= (out["their_last"] | out["success"]))
  assert np.all(out["success"] <= out["terminated"])
  assert allowed.sum() >= 8  # the test exercised legal moves
  for b in range(BATCH):
    for t in range(STEPS):
      text = core.to_text(env.spec, out["pieces"][b, t], out["count"][b, t])
      got = board_from_text(name, text)
      want = state_arrays(name, out["inner"], b, t)
      for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=text)


def test_game2048_succeeds_at_its_target_tile():
  small = envs.make("game2048", target_tile=8)
  step = jax.jit(jax.vmap(small.step))
  states, _ = jax.jit(jax.vmap(small.reset))(
    jax.random.split(jax.random.key(0), 64)
  )
  success = np.zeros(64, bool)
  for k in range(60):
    states, ts = step(states, jnp.full(64, k % 4))
    success |= np.asarray(ts.success)
    assert np.all(np.asarray(ts.terminated)[np.asarray(ts.success)])
  assert success.mean() > 0.5


@pytest.mark.parametrize("name", ["maze", "sudoku_easy", "rubiks_cube_2x2"])
def test_reset_and_step_compile_once(name):
  env = envs.make(name)
  keys = [jax.random.split(jax.random.key(k), 32) for k in (1, 2)]
  (s1, _), (s2, _) = assert_compiles_once(
    jax.vmap(env.reset), *[(k,) for k in keys]
  )
  actions = [jnp.full(32, a, jnp.int32) for a in (0, 1)]
  (_, ts), _ = assert_compiles_once(
    jax.vmap(env.step), (s1, actions[0]), (s2, actions[1])
  )
  chex.assert_tree_all_finite(ts.reward)


def test_every_game_builds_with_its_action_names():
  for name in GAMES:
    env = envs.make(name)
    assert len(set(env.spec.action_names)) == env.spec.num_actions
  assert envs.make("rubiks_cube").spec.action_names[:3] == ("U", "U'", "U2")
  assert envs.make("sudoku").spec.num_actions == 729


def test_unknown_games_and_settings_are_named():
  with pytest.raises(ValueError, match="unknown game 'chess'"):
    envs.jax.jumanji_text.JumanjiText("chess")
  with pytest.raises(ValueError, match="unknown setting 'size'"):
    envs.make("maze", size=5)
  with pytest.raises(ValueError, match="target_tile must be a power of two"):
    envs.make("game2048", target_tile=100)


def is_sudoku(grid: np.ndarray) -> bool:
  """Every row, column and 3x3 box holds 1..9 once (plain NumPy)."""
  units = [*grid, *grid.T]
  units += [
    grid[r : r + 3, c : c + 3].ravel() for r in (0, 3, 6) for c in (0, 3, 6)
  ]
  return all(sorted(u.tolist()) == list(range(1, 10)) for u in units)


@pytest.mark.parametrize("database", ["very-easy", "mixed"])
def test_solved_databases_are_sudokus_that_keep_their_clues(database):
  path = envs.jax.jumanji_text._sudoku_path(database)
  puzzles, solutions = np.load(path), sudoku_solver.solve_all(path)
  assert solutions.shape == puzzles.shape
  clue = puzzles > 0
  assert (solutions[clue] == puzzles[clue]).all()
  assert all(
    is_sudoku(g) for g in solutions[:: 1 if database == "very-easy" else 10]
  )
  assert sudoku_solver.solve(np.zeros((9, 9), int)) is not None
  twice = np.zeros((9, 9), int)
  twice[0, :2] = 5
  assert sudoku_solver.solve(twice) is None


def candidates(board: np.ndarray, r: int, c: int) -> int:
  """Digits row, column and box leave a cell (board 0 empty, 1..9)."""
  box = board[r // 3 * 3 : r // 3 * 3 + 3, c // 3 * 3 : c // 3 * 3 + 3]
  seen = set(board[r]) | set(board[:, c]) | set(box.ravel())
  return len(set(range(1, 10)) - seen)


def test_sudoku_plans_solve_the_board_in_jumanji_fewest_candidates_first():
  env = envs.make("sudoku_easy")
  horizon, levels = 40, 64
  states, _ = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), levels))
  plans = to_numpy(jax.jit(jax.vmap(lambda s: env.plan(s, horizon)))(states))
  step = jax.jit(env.env.step)
  boards = np.asarray(states.inner.board) + 1  # 0 empty
  for b in range(levels):
    board = boards[b].copy()
    n = int((board == 0).sum())
    assert plans.length[b] == n
    actions = plans.actions[b]
    assert (actions[:n] >= 0).all() and (actions[n:] == -1).all()
    r, c, _ = np.unravel_index(actions[0], (9, 9, 9))
    fewest = min(
      candidates(board, i, j)
      for i, j in zip(*np.nonzero(board == 0), strict=True)
    )
    assert candidates(board, r, c) == fewest, b
    # Played by Jumanji's own Sudoku: every move allowed, the board solved.
    inner = index(states.inner, b)
    for a in actions[:n]:
      move = env._game.to_action(env.env, jnp.int32(a))
      assert bool(inner.action_mask[tuple(move)]), (b, a)
      inner, ts = step(inner, move)
    assert float(ts.reward) == 1.0 and is_sudoku(np.asarray(inner.board) + 1)


def test_a_sudoku_with_a_wrong_digit_has_no_plan():
  env = envs.make("sudoku_easy")
  state, _ = env.reset(jax.random.key(3))
  solution = jax.jit(lambda s: env.plan(s, 81))(state)
  first = int(solution.actions[0])
  r, c, digit = first // 81, first // 9 % 9, first % 9
  wrong = (digit + 1) % 9
  board = state.inner.board.at[r, c].set(wrong)
  plan = env.plan(state.replace(inner=state.inner.replace(board=board)), 81)
  assert int(plan.length) == -1 and (np.asarray(plan.actions) == -1).all()
