"""RAGEN's own Sokoban, the ``gym-sokoban`` package, as a Python environment
(``envs.host``): ``--config.env.name=gym_sokoban``.

Each episode is a ``gym_sokoban`` ``SokobanEnv`` whose level the package
generates from the episode's seed (``random`` and ``numpy.random`` seeded
around its generator, as RAGEN does); its observation is RAGEN's text grid
(the jittable ``sokoban``'s ``grid`` render: the same symbols and legend)
and its answers are RAGEN's action names. ``pip install gym-sokoban`` (a
test dependency of this project) provides it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import random
import threading
from typing import Any

import jax
import numpy as np

from envs.host import HostSpec
from envs.jax.sokoban import Sokoban

# gym-sokoban's room_state values 0-6 (RAGEN's grid_lookup).
SYMBOLS = np.asarray(list("#_O√XPS"))
# RAGEN's action names; gym-sokoban's push actions 1-4, in this order.
ACTIONS = ("Up", "Down", "Left", "Right")
# The package's generator draws from the global RNGs: one level at a time.
_GENERATING = threading.Lock()


class GymSokoban:
  """One episode of gym-sokoban, speaking text (``envs.host.HostEnv``)."""

  def __init__(self, dim_room: tuple[int, int], num_boxes: int, max_steps: int):
    from gym_sokoban.envs.sokoban_env import SokobanEnv

    self.env = SokobanEnv(
      dim_room=tuple(dim_room),
      num_boxes=num_boxes,
      max_steps=max_steps,
      reset=False,
    )

  def reset(self, seed: int, level: dict[str, Any] | None = None) -> str:
    """gym-sokoban's level for ``seed``, or ``level``: the jittable
    ``sokoban``'s (its ``walls``, ``targets``, ``boxes``, ``player``)."""
    if level is not None:
      rows, cols = self.env.dim_room
      cells = lambda x: np.asarray(x, bool).reshape(rows, cols)
      walls, targets, boxes = (
        cells(level[k]) for k in ("walls", "targets", "boxes")
      )
      fixed = np.where(walls, 0, np.where(targets, 2, 1))
      state = np.where(boxes, np.where(targets, 3, 4), fixed)
      state.flat[int(level["player"])] = 5
      return self.set_level(fixed, state)
    with _GENERATING, contextlib.redirect_stdout(io.StringIO()):
      # The generator's retries print; RAGEN seeds both RNGs around it.
      py, np_state = random.getstate(), np.random.get_state()
      random.seed(seed)
      np.random.seed(seed)
      try:
        self.env.reset(render_mode="tiny_rgb_array")
      finally:
        random.setstate(py)
        np.random.set_state(np_state)
    return self.text()

  def set_level(self, room_fixed: np.ndarray, room_state: np.ndarray) -> str:
    """Starts an episode on a given level (gym-sokoban's arrays: walls 0,
    floor 1, targets 2 in ``room_fixed``; boxes 3-4 and the player 5 in
    ``room_state``), e.g. one the jittable ``sokoban`` generated."""
    env = self.env
    env.room_fixed = np.asarray(room_fixed).copy()
    env.room_state = np.asarray(room_state).copy()
    env.player_position = np.argwhere(
      (env.room_state == 5) | (env.room_state == 6)
    )[0]
    env.room_state[tuple(env.player_position)] = 5
    env.num_env_steps = 0
    env.reward_last = 0
    env.boxes_on_target = int(np.sum(env.room_state == 3))
    return self.text()

  def step(self, answer: str) -> tuple[str, float, bool, dict[str, Any]]:
    if answer not in ACTIONS:
      return self.text(), 0.0, False, {"valid": False, "effective": False}
    before = self.env.room_state.copy()
    _, reward, done, info = self.env.step(
      ACTIONS.index(answer) + 1, observation_mode="tiny_rgb_array"
    )
    solved = bool(info.get("all_boxes_on_target", False))
    return (
      self.text(),
      float(reward),
      bool(done),
      {
        "success": solved,
        "truncated": bool(done) and not solved,
        "effective": not np.array_equal(before, self.env.room_state),
      },
    )

  def text(self) -> str:
    room = np.where(
      (self.env.room_state == 5) & (self.env.room_fixed == 2),
      6,
      self.env.room_state,
    )
    return "\n".join("".join(row) for row in SYMBOLS[room])


def gym_sokoban(
  dim_room: tuple[int, int] = (6, 6),
  num_boxes: int = 1,
  max_steps: int = 100,
  timeout_s: float = 10.0,
  levels: str = "gym",
) -> HostSpec:
  """gym-sokoban as a Python environment, with the jittable ``sokoban``'s
  instructions and legend. ``levels``: ``"gym"`` (gym-sokoban's generator,
  seeded per episode) or ``"sokoban"`` (the jittable ``sokoban``'s levels
  for the same keys: the same levels as ``--config.env.name=sokoban``).

  Raises:
    ValueError: the gym-sokoban package is not installed, or ``levels``
      names neither.
  """
  if levels not in ("gym", "sokoban"):
    raise ValueError(
      f"gym_sokoban: levels={levels!r}; expected 'gym' or 'sokoban'"
    )
  if importlib.util.find_spec("gym_sokoban") is None:
    raise ValueError(
      "gym_sokoban needs the gym-sokoban package: pip install gym-sokoban"
    )
  like = Sokoban(dim_room=dim_room, num_boxes=num_boxes, max_steps=max_steps)
  rows, cols = like.rows, like.cols
  return HostSpec(
    name="gym_sokoban",
    make=lambda: GymSokoban((rows, cols), num_boxes, max_steps),
    instructions=like.spec.instructions,
    action_names=ACTIONS,
    pieces=like.spec.pieces,
    legend=like.spec.legend,
    # A grid's characters and newlines.
    max_obs_pieces=rows * (cols + 1),
    max_steps=max_steps,
    timeout_s=timeout_s,
    levels=None if levels == "gym" else functools.partial(_level, like),
  )


def _level(env: Sokoban, key: jax.Array) -> dict[str, jax.Array]:
  """The jittable Sokoban's level for ``key``, as ``GymSokoban.reset``
  takes it."""
  state, _ = env.reset(key)
  return {k: getattr(state, k) for k in ("walls", "targets", "boxes", "player")}
