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
from envs.jumanji_text import FACES, GAMES
from tests.envs.conftest import to_numpy
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
    envs.jumanji_text.JumanjiText("chess")
  with pytest.raises(ValueError, match="unknown setting 'size'"):
    envs.make("maze", size=5)
  with pytest.raises(ValueError, match="target_tile must be a power of two"):
    envs.make("game2048", target_tile=100)
