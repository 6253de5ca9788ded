"""Breadth-first Sokoban solver, in plain Python on the host.

It shares nothing with the jitted environment, so tests use it as an
independent check that generated levels are solvable, and the optimal
solution length it finds is a difficulty metric.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from envs.jax.sokoban import constants


def solve(
  walls: Sequence[bool] | np.ndarray,
  targets: Sequence[bool] | np.ndarray,
  boxes: Sequence[bool] | np.ndarray,
  player: int,
  cols: int,
  max_states: int = 2_000_000,
) -> list[int] | None:
  """Shortest action sequence that puts every box on a target.

  Args:
    walls, targets, boxes: flat row-major cell masks.
    player: the player's flat cell index.
    cols: row length.
    max_states: give up after expanding this many states.

  Returns:
    Action ids (indices into ``constants.ACTIONS``) of a shortest solution,
    ``[]`` if already solved, or ``None`` if there is no solution (or the
    search gave up).
  """
  walls = np.asarray(walls, bool).ravel()
  size = walls.shape[0]
  cells = lambda mask: frozenset(
    int(c) for c in np.flatnonzero(np.asarray(mask, bool).ravel())
  )
  goal, start_boxes = cells(targets), cells(boxes)
  deltas = [dr * cols + dc for dr, dc in constants.MOVES]
  blocked = [bool(w) for w in walls]

  def inside(cell: int, delta: int, step_from: int) -> bool:
    # Moving left or right must stay on the same row.
    if abs(delta) == 1 and cell // cols != step_from // cols:
      return False
    return 0 <= cell < size

  start = (int(player), start_boxes)
  if start_boxes <= goal:
    return []
  parents: dict = {start: None}
  queue = collections.deque([start])
  while queue:
    if len(parents) > max_states:
      return None
    state = queue.popleft()
    p, bx = state
    for action, dest, new_boxes in _moves(p, bx, deltas, inside, blocked):
      nxt = (dest, new_boxes)
      if nxt in parents:
        continue
      parents[nxt] = (state, action)
      if new_boxes <= goal:
        return _path(parents, nxt)
      queue.append(nxt)
  return None


def _moves(p: int, bx: frozenset, deltas, inside, blocked):
  """The moves from the player at ``p`` with boxes ``bx``: (action, the
  player's new cell, the boxes after it), a push included where the cell
  beyond the box is free."""
  for action, delta in enumerate(deltas):
    dest = p + delta
    if not inside(dest, delta, p) or blocked[dest]:
      continue
    new_boxes = bx
    if dest in bx:
      beyond = dest + delta
      if not inside(beyond, delta, dest) or blocked[beyond] or beyond in bx:
        continue
      new_boxes = (bx - {dest}) | {beyond}
    yield action, dest, new_boxes


def _path(parents: dict, node) -> list[int]:
  """The actions from the search's start to ``node``."""
  path = []
  while parents[node] is not None:
    node, action = parents[node]
    path.append(action)
  return path[::-1]
