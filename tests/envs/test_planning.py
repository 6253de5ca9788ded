"""Shortest plans inside ``jit`` against plain-Python breadth-first search,
replayed in the plain-Python rules."""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.jax import planning
from envs.jax.sokoban import solve
from reference import envs as ref
from tests.envs.conftest import index, level_pool, to_numpy
from tests.helpers import peer_of

HORIZON = 16
LEVELS = 300


@functools.cache
def planner(name: str, **kwargs):
  env = envs.make(name, **kwargs)
  return env, jax.jit(jax.vmap(lambda s: env.plan(s, HORIZON)))


def cells(mask, cols):
  return {divmod(int(i), cols) for i in np.flatnonzero(mask)}


def test_sokoban_plans_are_shortest_and_solve_the_level():
  env, plan = planner("sokoban")
  states = jax.tree.map(lambda x: x[:LEVELS], level_pool("sokoban"))
  plans = to_numpy(plan(states))
  states = to_numpy(states)
  for b in range(LEVELS):
    s = index(states, b)
    best = solve(s.walls, s.targets, s.boxes, int(s.player), env.cols)
    assert plans.length[b] == len(best), b
    n = min(len(best), HORIZON)
    actions = plans.actions[b]
    assert (actions[:n] >= 0).all() and (actions[n:] == -1).all()
    peer = peer_of("sokoban", env, s)
    for a in actions[:n]:
      peer.step(int(a))
    assert peer.solved() == (len(best) <= HORIZON)


def bfs_length(lake: ref.FrozenLake) -> int:
  """Fewest moves from the start to the goal, never through a hole."""
  seen = {lake.start: 0}
  queue = collections.deque([lake.start])
  while queue:
    cell = queue.popleft()
    if cell == lake.goal:
      return seen[cell]
    for dr, dc in ref.FROZEN_LAKE_MOVES.values():
      r = min(max(cell[0] + dr, 0), lake.size - 1)
      c = min(max(cell[1] + dc, 0), lake.size - 1)
      if (r, c) not in seen and (r, c) not in lake.holes:
        seen[(r, c)] = seen[cell] + 1
        queue.append((r, c))
  return -1


def test_frozen_lake_plans_are_shortest_and_reach_the_goal():
  env, plan = planner("frozen_lake", success_rate=1.0)
  states = jax.tree.map(lambda x: x[:LEVELS], level_pool("frozen_lake"))
  plans = to_numpy(plan(states))
  states = to_numpy(states)
  for b in range(LEVELS):
    s = index(states, b)
    lake = ref.FrozenLake(
      holes=cells(s.holes, env.size),
      start=divmod(int(s.start), env.size),
      goal=divmod(int(s.goal), env.size),
      size=env.size,
      max_steps=env.max_steps,
    )
    assert plans.length[b] == bfs_length(lake), b
    for a in plans.actions[b][: plans.length[b]]:
      lake.step(int(a))
    assert lake.player == lake.goal


def test_an_unreachable_goal_gives_no_plan():
  _, plan = planner("frozen_lake", success_rate=1.0)
  state = index(level_pool("frozen_lake"), 0)
  # The goal in a corner, walled in by holes.
  holes = jnp.zeros(16, bool).at[jnp.asarray([1, 4])].set(True)
  state = state.replace(holes=holes, goal=jnp.int32(0), player=jnp.int32(15))
  got = to_numpy(plan(jax.tree.map(lambda x: x[None], state)))
  assert got.length[0] == -1
  assert (got.actions[0] == -1).all()


def test_plans_refuse_settings_with_no_fixed_optimal_plan():
  with pytest.raises(ValueError, match="num_boxes"):
    larger = envs.make("sokoban_larger")
    larger.plan(larger.reset(jax.random.key(0))[0], 4)
  with pytest.raises(ValueError, match="success_rate"):
    lake = envs.make("frozen_lake")
    lake.plan(lake.reset(jax.random.key(0))[0], 4)


@pytest.mark.parametrize("name", ["sokoban", "frozen_lake"])
def test_random_search_keeps_the_shortest_success_it_found(name):
  kwargs = {"success_rate": 1.0} if name == "frozen_lake" else {}
  env = envs.make(name, **kwargs)
  horizon, tries, levels = 10, 256, 64
  search = jax.jit(
    jax.vmap(lambda s, k: planning.random_search(env, s, horizon, k, tries))
  )
  states = jax.tree.map(lambda x: x[:levels], level_pool(name))
  plans = to_numpy(search(states, jax.random.split(jax.random.key(0), levels)))
  states = to_numpy(states)
  shortest = 0
  for b in range(levels):
    s = index(states, b)
    n = int(plans.length[b])
    actions = plans.actions[b]
    if n < 0:
      assert (actions == -1).all(), b
      continue
    assert (actions[:n] >= 0).all() and (actions[n:] == -1).all(), b
    peer = peer_of(name, env, s)
    for a in actions[:n]:
      peer.step(int(a))
    assert peer.solved() if name == "sokoban" else peer.player == peer.goal
    if name == "sokoban":
      best = len(solve(s.walls, s.targets, s.boxes, int(s.player), env.cols))
    else:
      best = bfs_length(peer_of(name, env, s))
    assert n >= best, b
    shortest += n == best
  found = int(np.sum(plans.length >= 0))
  # Out of 256 random episodes a level's shortest solution is most often
  # among those that succeed (here 38 of 54 Sokoban levels, 58 of 64
  # FrozenLake ones); keeping the longest success instead gives none.
  assert found >= levels // 2
  assert shortest >= 0.6 * found, (shortest, found)
