"""Plans inside ``jit``: shortest ones, by breadth-first distances on an
enumerated state space then greedy descent; and random valid play.

An environment whose states can be enumerated (FrozenLake's cells, one-box
Sokoban's player x box cells) describes itself as a transition table; the
distances to the goal come from relaxing ``d(s) = 1 + min_a d(next(s, a))``
until nothing changes, which is breadth-first search run backwards, with
static shapes. Following the smallest distance from the start spells out a
shortest solution (ties go to the lowest action id). The plans are what a
supervised warm start imitates.

``random_valid_play`` works for any environment: actions drawn uniformly
among those valid in each state (the bandit offers two of its forty arm
names), until the episode ends. ``random_search`` needs nothing more: of
many random valid episodes from the same state, the shortest that
succeeded, which is what an agent finds by trying a level again and again
(what RL's groups do) when no planner exists.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Plan:
  actions: jax.Array  # [H] int32 action ids, -1 after the goal (or none)
  length: jax.Array  # [] int32 shortest solution length, -1 if unsolvable


def distances(
  next_state: jax.Array, goal: jax.Array, dead: jax.Array
) -> jax.Array:
  """Fewest actions from each state to a goal state.

  Args:
    next_state: ``[S, A]`` int32, the state each action leads to.
    goal: ``[S]`` bool, states that end the episode in success.
    dead: ``[S]`` bool, states that end it in failure (never entered).

  Returns:
    ``[S]`` int32; ``S`` (more than any path needs) where no goal is
    reachable.
  """
  n = goal.shape[0]
  unreachable = jnp.int32(n)
  after = jnp.where(dead[next_state], -1, next_state)  # -1: not allowed

  def relax(d):
    through = jnp.where(after >= 0, d[jnp.maximum(after, 0)], unreachable)
    best = jnp.minimum(jnp.min(through, axis=1) + 1, unreachable)
    return jnp.where(goal, 0, jnp.where(dead, unreachable, best))

  def body(carry):
    d, _ = carry
    new = relax(d)
    return new, jnp.any(new != d)

  start = jnp.where(goal, 0, unreachable).astype(jnp.int32)
  d, _ = jax.lax.while_loop(lambda c: c[1], body, (start, jnp.array(True)))
  return d


def shortest_plan(
  next_state: jax.Array,
  goal: jax.Array,
  dead: jax.Array,
  start: jax.Array,
  horizon: int,
) -> Plan:
  """The first ``horizon`` actions of a shortest path from ``start``.

  Args:
    next_state, goal, dead: as in ``distances``.
    start: ``[]`` int32 state index.
    horizon: how many actions to spell out.
  """
  n = goal.shape[0]
  d = distances(next_state, goal, dead)
  cost = jnp.where(dead[next_state], n, d[next_state])  # [S, A]

  def step(s, _):
    go = (d[s] > 0) & (d[s] < n)
    a = jnp.argmin(cost[s]).astype(jnp.int32)
    return jnp.where(go, next_state[s, a], s), jnp.where(go, a, -1)

  _, actions = jax.lax.scan(step, start, None, length=horizon)
  return Plan(actions=actions, length=jnp.where(d[start] < n, d[start], -1))


def random_valid_play(
  env: Any, state: Any, horizon: int, key: jax.Array
) -> tuple[Plan, jax.Array]:
  """Up to ``horizon`` uniformly random valid actions from ``state``.

  Returns:
    The actions taken (``-1`` once the episode is over; ``length`` counts
    them) and whether the episode ended in success.
  """
  every = jnp.arange(env.spec.num_actions)

  def body(carry, k):
    s, done, success = carry
    valid = jax.vmap(lambda a: env.step(s, a)[1].valid)(every)
    a = jax.random.choice(k, every, p=valid / jnp.sum(valid))
    new, ts = env.step(s, a)
    s = jax.tree.map(lambda x, y: jnp.where(done, y, x), new, s)
    taken = jnp.where(done, -1, a).astype(jnp.int32)
    return (s, done | ts.done, success | (~done & ts.success)), taken

  init = (state, jnp.zeros((), bool), jnp.zeros((), bool))
  (_, _, success), actions = jax.lax.scan(
    body, init, jax.random.split(key, horizon)
  )
  length = jnp.sum(actions >= 0, dtype=jnp.int32)
  return Plan(actions=actions, length=length), success


def random_search(
  env: Any, state: Any, horizon: int, key: jax.Array, tries: int
) -> Plan:
  """The shortest of ``tries`` random valid episodes from ``state`` that
  succeeded (the first such among equals); ``length`` is ``-1`` and every
  action ``-1`` when none did."""
  plans, success = jax.vmap(
    lambda k: random_valid_play(env, state, horizon, k)
  )(jax.random.split(key, tries))
  cost = jnp.where(success, plans.length, horizon + 1)
  best = jnp.argmin(cost)
  found = success[best]
  return Plan(
    actions=jnp.where(found, plans.actions[best], -1),
    length=jnp.where(found, plans.length[best], -1),
  )
