"""FrozenLake: rules against a plain-Python peer, generated maps, slipping."""

from __future__ import annotations

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs.jax.frozen_lake import State, constants
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

SIZE = 4


def to_reference(state, size, max_steps):
  cell = lambda i: (int(i) // size, int(i) % size)
  return ref.FrozenLake(
    holes={cell(i) for i in np.flatnonzero(state.holes)},
    start=cell(state.start),
    goal=cell(state.goal),
    size=size,
    max_steps=max_steps,
    player=cell(state.player),
    steps=int(state.steps),
  )


def open_board(size: int, player: int, goal: int) -> State:
  return State(
    holes=jnp.zeros((size * size,), bool),
    start=jnp.asarray(player, jnp.int32),
    goal=jnp.asarray(goal, jnp.int32),
    player=jnp.asarray(player, jnp.int32),
    steps=jnp.zeros((), jnp.int32),
    key=jax.random.key(0),
  )


def test_action_names_follow_gym_order():
  assert constants.ACTIONS == ("Left", "Down", "Right", "Up")
  assert constants.MOVES == ((0, -1), (1, 0), (0, 1), (-1, 0))


def test_every_generated_map_is_solvable():
  states = to_numpy(level_pool("frozen_lake"))
  for i in range(NUM_LEVELS):
    s = index(states, i)
    peer = to_reference(s, SIZE, 100)
    assert peer.start != peer.goal
    assert peer.start not in peer.holes and peer.goal not in peer.holes
    assert ref.frozen_lake_solvable(peer.holes, peer.start, peer.goal, SIZE)


def test_sparse_maps_are_still_solvable():
  _, reset = batch_reset("frozen_lake", size=6, p=0.3)
  states, _ = reset(jax.random.split(jax.random.key(3), NUM_LEVELS))
  states = to_numpy(states)
  assert states.holes.mean() > 0.4
  for i in range(NUM_LEVELS):
    peer = to_reference(index(states, i), 6, 100)
    assert ref.frozen_lake_solvable(peer.holes, peer.start, peer.goal, 6)


def test_map_generation_is_deterministic_per_key():
  _, reset = batch_reset("frozen_lake")
  keys = jax.random.split(jax.random.key(11), NUM_LEVELS)
  chex.assert_trees_all_equal(reset(keys)[0], reset(keys)[0])


def test_hole_frequency_follows_p():
  _, reset = batch_reset("frozen_lake", size=8, p=0.8)
  states, _ = reset(jax.random.split(jax.random.key(5), NUM_LEVELS))
  # Start and goal are never holes, and rejected unsolvable maps skew the
  # rest slightly towards ice.
  frac = float(np.asarray(states.holes).mean())
  assert 0.14 < frac < 0.2


@pytest.mark.parametrize("mode", ["grid", "coord", "grid_coord"])
def test_steps_match_the_python_rules_on_1024_random_episodes(mode):
  max_steps, steps = 12, 16
  env = envs.make(
    "frozen_lake", success_rate=1.0, max_steps=max_steps, render_mode=mode
  )
  states = to_numpy(level_pool("frozen_lake"))
  actions = np.random.default_rng(2).integers(-1, 5, (NUM_LEVELS, steps))
  out = play(env, level_pool("frozen_lake"), actions.astype(np.int32))
  outcomes = {"success": 0, "hole": 0, "truncated": 0}
  for i in range(NUM_LEVELS):
    peer = to_reference(index(states, i), SIZE, max_steps)
    assert text(env.spec, out["pieces0"][i], out["n0"][i]) == peer.text(mode)
    for t in range(steps):
      want = peer.step(int(actions[i, t]))
      got = text(env.spec, out["pieces"][i, t], out["n"][i, t])
      assert got == peer.text(mode), (i, t)
      assert out["reward"][i, t] == want.reward
      for flag in ("terminated", "truncated", "success", "valid", "effective"):
        assert bool(out[flag][i, t]) == getattr(want, flag), (i, t, flag)
    outcomes["success"] += peer.player == peer.goal
    outcomes["hole"] += peer.player in peer.holes
    outcomes["truncated"] += peer.steps >= max_steps and not peer.terminal()
  assert min(outcomes.values()) > 20, outcomes


def test_slippery_steps_are_one_of_the_three_gym_outcomes():
  env = envs.make("frozen_lake", success_rate=0.8, max_steps=12)
  states = to_numpy(level_pool("frozen_lake"))
  actions = np.random.default_rng(4).integers(0, 4, (NUM_LEVELS, 12))
  out = play(env, level_pool("frozen_lake"), actions.astype(np.int32))
  for i in range(NUM_LEVELS):
    peer = to_reference(index(states, i), SIZE, 12)
    for t in range(12):
      a = int(actions[i, t])
      got = text(env.spec, out["pieces"][i, t], out["n"][i, t])
      matches = []
      for direction in ((a - 1) % 4, a, (a + 1) % 4):
        trial = to_reference(index(states, i), SIZE, 12)
        trial.player, trial.steps = peer.player, peer.steps
        want = trial.step(a, direction)
        if trial.text("grid") == got and want.reward == out["reward"][i, t]:
          matches.append(trial)
      assert matches, (i, t)
      peer = matches[0]


@pytest.mark.parametrize("success_rate", [1.0, 0.8, 1 / 3])
def test_slip_frequencies_match_success_rate(success_rate):
  env = envs.make("frozen_lake", size=5, success_rate=success_rate)
  center, n = 12, 20_000
  state = open_board(5, player=center, goal=0)
  states = jax.vmap(lambda k: state.replace(key=k))(
    jax.random.split(jax.random.key(9), n)
  )
  up = constants.ACTIONS.index("Up")
  after, _ = jax.vmap(env.step, in_axes=(0, None))(states, up)
  moved = np.asarray(after.player) - center
  freq = {d: float(np.mean(moved == d)) for d in (-5, -1, 1, 5)}
  slip = (1 - success_rate) / 2
  assert freq[-5] == pytest.approx(success_rate, abs=0.015)
  assert freq[-1] == pytest.approx(slip, abs=0.015)
  assert freq[1] == pytest.approx(slip, abs=0.015)
  assert freq[5] == 0.0


PROPERTY_MAX_STEPS = 10
PROPERTY_ENV = envs.make(
  "frozen_lake", success_rate=0.5, max_steps=PROPERTY_MAX_STEPS
)


@settings(max_examples=60, deadline=None)
@given(
  level=st.integers(0, NUM_LEVELS - 1),
  actions=st.lists(st.integers(-2, 5), min_size=16, max_size=16),
)
def test_properties_hold_for_any_map_and_action_sequence(level, actions):
  state = index(level_pool("frozen_lake"), slice(level, level + 1))
  out = play(PROPERTY_ENV, state, np.asarray([actions], np.int32))
  for t in range(len(actions)):
    s = index(out["state"], (0, t))
    at_goal, in_hole = s.player == s.goal, bool(s.holes[s.player])
    assert 0 <= s.player < SIZE * SIZE
    assert bool(out["terminated"][0, t]) == (at_goal or in_hole)
    assert bool(out["success"][0, t]) == at_goal
    assert bool(out["truncated"][0, t]) == (
      s.steps >= PROPERTY_MAX_STEPS and not (at_goal or in_hole)
    )
    first_arrival = at_goal and (t == 0 or not out["terminated"][0, t - 1])
    assert out["reward"][0, t] == (1.0 if first_arrival else 0.0)


@pytest.mark.parametrize(
  "kwargs, name",
  [
    (dict(size=1), "size"),
    (dict(size=4.5), "size"),
    (dict(p=-0.1), "p"),
    (dict(p=1.2), "p"),
    (dict(success_rate=2.0), "success_rate"),
    (dict(max_steps=0), "max_steps"),
    (dict(render_mode="ascii"), "render_mode"),
    (dict(slippery=True), "slippery"),
  ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, name):
  with pytest.raises(ValueError, match=name):
    envs.make("frozen_lake", **kwargs)


def test_ragen2_instructions_give_the_answers_form_without_reasoning_to_copy():
  ragen = envs.make("frozen_lake").spec.instructions
  assert "<think>" in ragen  # RAGEN's own, with an example's reasoning
  grid = envs.make("frozen_lake", instructions="ragen2").spec.instructions
  coord = envs.make(
    "frozen_lake", instructions="ragen2", render_mode="grid_coord"
  ).spec.instructions
  for written in (grid, coord):
    assert "<think>" not in written and "I should" not in written
    assert re.search(r"<answer>\w+( \|\| \w+)+</answer>", written)
  assert "coordinates" in coord and "coordinates" not in grid
  with pytest.raises(ValueError, match="instructions='ragen3'"):
    envs.make("frozen_lake", instructions="ragen3")
