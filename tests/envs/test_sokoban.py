"""Sokoban: rules against a plain-Python peer, generated levels, errors."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs.jax.sokoban import State, constants, solve
from reference import envs as ref
from tests.envs.conftest import (
  NUM_LEVELS,
  batch_reset,
  index,
  level_pool,
  play,
  text,
  to_numpy,
)

COLS = 6


def to_reference(state, rows, cols, max_steps, symbols="standard"):
  cells = lambda mask: {
    (i // cols, i % cols) for i in np.flatnonzero(np.asarray(mask))
  }
  player = int(state.player)
  return ref.Sokoban(
    walls=cells(state.walls),
    targets=cells(state.targets),
    boxes=cells(state.boxes),
    player=(player // cols, player % cols),
    rows=rows,
    cols=cols,
    max_steps=max_steps,
    symbols=symbols,
    steps=int(state.steps),
  )


def corridor(cells: str, steps: int = 0) -> State:
  """A one-row level between walls: ``P`` player, ``X`` box, ``O`` target,
  ``√`` box on target, ``_`` floor."""
  cols = len(cells) + 2
  row = lambda chars: np.asarray([c in chars for c in f" {cells} "])
  blank = np.zeros(cols, bool)
  walls = np.concatenate([~blank, ~row("PXO√_"), ~blank])
  return State(
    walls=jnp.asarray(walls),
    targets=jnp.asarray(np.concatenate([blank, row("O√"), blank])),
    boxes=jnp.asarray(np.concatenate([blank, row("X√"), blank])),
    player=jnp.asarray(cols + 1 + cells.index("P"), jnp.int32),
    steps=jnp.asarray(steps, jnp.int32),
    key=jax.random.key(0),
  )


def corridor_env(cells: str, num_boxes: int = 1, max_steps: int = 100):
  return envs.make(
    "sokoban",
    dim_room=(5, len(cells) + 2),
    num_boxes=num_boxes,
    max_steps=max_steps,
  )


RIGHT = constants.ACTIONS.index("Right")
LEFT = constants.ACTIONS.index("Left")


def test_action_names_and_moves_agree():
  assert constants.ACTIONS == ("Up", "Down", "Left", "Right")
  for name, (dr, dc) in zip(constants.ACTIONS, constants.MOVES, strict=True):
    assert {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}[
      name
    ] == (dr, dc)


def test_box_pushed_onto_target_earns_one_and_solving_earns_ten():
  env = corridor_env("PX_O")
  state, ts = env.step(corridor("PX_O"), RIGHT)
  assert float(ts.reward) == pytest.approx(-0.1)
  state, ts = env.step(state, RIGHT)
  assert float(ts.reward) == pytest.approx(-0.1 + 1.0 + 10.0)
  assert bool(ts.terminated) and bool(ts.success) and not bool(ts.truncated)


def test_box_pushed_off_target_costs_one():
  env = corridor_env("P√O_X", num_boxes=2)
  _, ts = env.step(corridor("P√O_X"), RIGHT)
  # Off one target and onto another: -1 and +1 cancel.
  assert float(ts.reward) == pytest.approx(-0.1)
  env = corridor_env("P√_O_X", num_boxes=2)
  _, ts = env.step(corridor("P√_O_X"), RIGHT)
  assert float(ts.reward) == pytest.approx(-0.1 - 1.0)


def test_walking_into_a_wall_costs_a_step_but_is_not_effective():
  env = corridor_env("PX_O")
  state, ts = env.step(corridor("PX_O"), LEFT)
  assert float(ts.reward) == pytest.approx(-0.1)
  assert not bool(ts.effective) and bool(ts.valid)
  assert int(state.steps) == 1


def test_two_boxes_in_a_row_do_not_move():
  env = corridor_env("PXX_OO", num_boxes=2)
  state, ts = env.step(corridor("PXX_OO"), RIGHT)
  assert not bool(ts.effective)
  assert int(state.player) == int(corridor("PXX_OO").player)


def test_episode_is_truncated_at_max_steps():
  env = corridor_env("P_X_O", max_steps=2)
  state = corridor("P_X_O")
  state, ts = env.step(state, LEFT)
  assert not bool(ts.truncated)
  state, ts = env.step(state, LEFT)
  assert bool(ts.truncated) and not bool(ts.terminated)
  assert not bool(ts.success)
  # A finished episode ignores further actions.
  after, ts = env.step(state, RIGHT)
  assert float(ts.reward) == 0.0 and not bool(ts.effective)
  chex.assert_trees_all_equal(after, state)


@pytest.mark.parametrize("action", [-1, 4, 7, 1 << 20])
def test_out_of_range_action_is_a_flagged_no_op(action):
  env = corridor_env("PX_O")
  state = corridor("PX_O")
  after, ts = env.step(state, action)
  assert not bool(ts.valid) and not bool(ts.effective)
  assert float(ts.reward) == 0.0
  chex.assert_trees_all_equal(after, state)


@pytest.mark.parametrize(
  "kwargs, name",
  [
    (dict(dim_room=(4, 6)), "dim_room"),
    (dict(dim_room=(6, 40)), "dim_room"),
    (dict(dim_room="big"), "dim_room"),
    (dict(num_boxes=5), "num_boxes"),
    (dict(num_boxes=0), "num_boxes"),
    (dict(max_steps=0), "max_steps"),
    (dict(search_depth=-3), "search_depth"),
    (dict(num_walkers=0), "num_walkers"),
    (dict(render_mode="image"), "render_mode"),
    (dict(symbols="emoji"), "symbols"),
    (dict(dimroom=(6, 6)), "dimroom"),
  ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, name):
  with pytest.raises(ValueError, match=name):
    envs.make("sokoban", **kwargs)


def test_unknown_environment_is_rejected_with_the_registered_names():
  with pytest.raises(ValueError, match="sokoban"):
    envs.make("sokobann")


def test_level_generation_is_deterministic_per_key():
  _, reset = batch_reset("sokoban")
  keys = jax.random.split(jax.random.key(7), NUM_LEVELS)
  first, _ = reset(keys)
  second, _ = reset(keys)
  chex.assert_trees_all_equal(first, second)
  other, _ = reset(jax.random.split(jax.random.key(8), NUM_LEVELS))
  same = np.all(np.asarray(first.boxes) == np.asarray(other.boxes), axis=1) & (
    np.asarray(first.player) == np.asarray(other.player)
  )
  assert same.mean() < 0.5


@pytest.mark.parametrize(
  "name, count", [("sokoban", 2 * NUM_LEVELS), ("sokoban_larger", 256)]
)
def test_every_generated_level_is_solvable_and_unsolved(name, count):
  env = envs.make(name)
  pools = [level_pool(name, seed) for seed in range(-(-count // NUM_LEVELS))]
  states = jax.tree.map(
    lambda *xs: np.concatenate(xs)[:count], *map(to_numpy, pools)
  )
  lengths = []
  for i in range(count):
    s = index(states, i)
    walls, boxes, targets = s.walls, s.boxes, s.targets
    assert boxes.sum() == targets.sum() == env.num_boxes
    assert not walls[s.player] and not boxes[s.player]
    assert not np.any(walls & boxes) and not np.any(walls & targets)
    solution = solve(walls, targets, boxes, int(s.player), env.cols)
    assert solution is not None, f"level {i} has no solution"
    lengths.append(len(solution))
  # Boxes start off their targets, so every level needs at least one push.
  assert min(lengths) >= 1


def test_solver_finds_the_shortest_solution_and_detects_dead_levels():
  level = corridor("P_X_O")
  cols = 7
  assert (
    solve(level.walls, level.targets, level.boxes, int(level.player), cols)
    == [RIGHT] * 3
  )
  # A box in a corner can never reach the target.
  walls = np.ones((5, 5), bool)
  walls[1:4, 1:4] = False
  boxes = np.zeros((5, 5), bool)
  boxes[1, 1] = True
  targets = np.zeros((5, 5), bool)
  targets[3, 3] = True
  assert solve(walls, targets, boxes, 2 * 5 + 2, 5) is None


def _actions_with_solutions(states, cols, steps, seed):
  """Random actions (some out of range); half the episodes follow a shortest
  solution first, so solving and the +10 reward are exercised."""
  rng = np.random.default_rng(seed)
  count = np.asarray(states.player).shape[0]
  actions = rng.integers(-1, 6, size=(count, steps))
  for i in range(0, count, 2):
    s = index(states, i)
    solution = solve(s.walls, s.targets, s.boxes, int(s.player), cols)
    actions[i, : len(solution)] = solution[:steps]
  return actions.astype(np.int32)


@pytest.mark.parametrize(
  "name, mode, symbols, reward",
  [
    ("sokoban", "grid", "standard", "shaped"),
    ("sokoban", "coord", "standard", "outcome"),
    ("sokoban", "grid_coord", "alternate", "shaped"),
    ("sokoban_larger", "grid", "standard", "outcome"),
  ],
)
def test_steps_match_the_python_rules_on_1024_random_episodes(
  name, mode, symbols, reward
):
  max_steps, steps = 30, 36
  env = envs.make(
    name, render_mode=mode, symbols=symbols, max_steps=max_steps, reward=reward
  )
  states = to_numpy(level_pool(name))
  actions = _actions_with_solutions(states, env.cols, steps, seed=1)
  out = play(env, level_pool(name), actions)
  solved = 0
  for i in range(actions.shape[0]):
    peer = to_reference(
      index(states, i), env.rows, env.cols, max_steps, symbols
    )
    assert text(env.spec, out["pieces0"][i], out["n0"][i]) == peer.text(mode)
    for t in range(steps):
      was_solved = peer.solved()
      want = peer.step(int(actions[i, t]))
      got = text(env.spec, out["pieces"][i, t], out["n"][i, t])
      assert got == peer.text(mode), (i, t)
      if reward == "outcome":  # the solving step's +10 alone
        want.reward = 10.0 if want.success and not was_solved else 0.0
      assert out["reward"][i, t] == pytest.approx(want.reward, abs=1e-6)
      for flag in ("terminated", "truncated", "success", "valid", "effective"):
        assert bool(out[flag][i, t]) == getattr(want, flag), (i, t, flag)
    solved += peer.solved()
  assert solved >= actions.shape[0] // 2


def _parts_of_reward(before, after, num_boxes):
  on_before = np.sum(before.boxes & before.targets)
  on_after = np.sum(after.boxes & after.targets)
  return (
    -0.1
    + (1.0 if on_after > on_before else 0.0)
    - (1.0 if on_after < on_before else 0.0)
    + (10.0 if on_after == num_boxes else 0.0)
  )


PROPERTY_MAX_STEPS = 20
PROPERTY_ENV = envs.make("sokoban", max_steps=PROPERTY_MAX_STEPS)


@settings(max_examples=60, deadline=None)
@given(
  level=st.integers(0, NUM_LEVELS - 1),
  actions=st.lists(st.integers(-2, 5), min_size=24, max_size=24),
)
def test_properties_hold_for_any_level_and_action_sequence(level, actions):
  max_steps, env = PROPERTY_MAX_STEPS, PROPERTY_ENV
  state = index(level_pool("sokoban"), slice(level, level + 1))
  out = play(env, state, np.asarray([actions], np.int32))
  before = index(to_numpy(state), 0)
  for t, action in enumerate(actions):
    after = index(out["state"], (0, t))
    assert after.boxes.sum() == env.num_boxes
    assert not after.walls[after.player] and not after.boxes[after.player]
    solved = bool(np.all(after.boxes == after.targets))
    done_before = bool(np.all(before.boxes == before.targets)) or (
      before.steps >= max_steps
    )
    acted = 0 <= action < 4 and not done_before
    want = _parts_of_reward(before, after, env.num_boxes) if acted else 0.0
    assert out["reward"][0, t] == pytest.approx(want, abs=1e-6)
    assert bool(out["terminated"][0, t]) == solved
    assert bool(out["truncated"][0, t]) == (
      after.steps >= max_steps and not solved
    )
    assert after.steps <= max_steps
    before = after


def test_an_unknown_reward_is_refused_by_name():
  with pytest.raises(ValueError, match="reward='sparse'"):
    envs.make("sokoban", reward="sparse")
