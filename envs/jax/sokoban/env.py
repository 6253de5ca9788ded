"""Sokoban as a pure, jittable text environment with RAGEN's rules."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import struct

from envs import core
from envs.jax import grid, planning, render, thoughts
from envs.jax.sokoban import constants, generator
from envs.jax.sokoban import render as sokoban_render

_MAX_DIM = grid.MAX_COLS

# The phrases of an expert's reasoning (``think``).
PHRASES = (
  "I am at ",
  "; boxes to push: ",
  "; empty targets: ",
  ".",
  " ",
  " takes me to ",
  ", a box to ",
)


@struct.dataclass
class State:
  walls: jax.Array  # [N] bool, N = rows * cols, row-major
  targets: jax.Array  # [N] bool
  boxes: jax.Array  # [N] bool
  player: jax.Array  # [] int32, flat cell index
  steps: jax.Array  # [] int32, actions taken
  key: jax.Array  # PRNG key; Sokoban's rules are deterministic


class Sokoban(core.TextEnv):
  """Push every box onto a target.

  Rewards (gym-sokoban's, kept by RAGEN): -0.1 per action, +1 when a box
  goes onto a target, -1 when one leaves a target, +10 when all boxes are
  placed. An action into a wall still costs the step penalty (and counts as
  a step) but is not effective. ``reward="outcome"`` keeps the +10 alone:
  no reward for progress on the way (RAGEN names such rewards a
  stabiliser; this measures it).
  """

  def __init__(
    self,
    dim_room: Sequence[int] = (6, 6),
    num_boxes: int = 1,
    max_steps: int = 100,
    search_depth: int = 64,
    num_walkers: int = 8,
    render_mode: str = "grid",
    symbols: str = "standard",
    reward: str = "shaped",
  ) -> None:
    """Validates the settings before anything compiles.

    Args:
      dim_room: (rows, cols), border walls included.
      num_boxes: boxes and targets per level.
      max_steps: actions before the episode is truncated.
      search_depth: reverse-play moves per walker when generating levels;
        longer walks give more displaced, harder levels.
      num_walkers: reverse-play walks per generated level.
      render_mode: ``"grid"``, ``"coord"`` or ``"grid_coord"``.
      symbols: ``"standard"`` (``# _ O √ X P S``) or ``"alternate"``
        (``W . G C B A @``).
      reward: ``"shaped"`` (gym-sokoban's) or ``"outcome"`` (the reward
        for solving alone).
    """
    rows, cols = _room(dim_room, num_boxes)
    _check(render_mode, symbols, max_steps, search_depth, num_walkers)
    if reward not in constants.REWARDS:
      raise ValueError(
        f"sokoban: reward={reward!r}; expected one of {constants.REWARDS}"
      )
    self.reward = reward
    self.rows, self.cols, self.num_boxes = rows, cols, num_boxes
    self.max_steps = max_steps
    self.search_depth, self.num_walkers = search_depth, num_walkers
    table = render.PieceTable()
    symbol_strings = constants.SYMBOLS[symbols]
    self._text = sokoban_render.board_text(
      table, rows, cols, num_boxes, symbol_strings, render_mode
    )
    self.spec = core.EnvSpec(
      name="sokoban",
      pieces=table.pieces,
      action_names=constants.ACTIONS,
      instructions=constants.INSTRUCTIONS,
      legend=tuple(zip(symbol_strings, constants.KIND_NAMES, strict=True)),
      list_actions=True,
      max_obs_pieces=self._text.max_pieces,
      piece_limits=self._text.piece_limits(),
      max_steps=max_steps,
    )
    self._deltas = jnp.asarray(
      [dr * cols + dc for dr, dc in constants.MOVES], jnp.int32
    )
    self.thoughts = thoughts.BoardThoughts(
      rows, cols, constants.ACTIONS, PHRASES
    )

  def reset(self, key: jax.Array) -> tuple[State, core.TimeStep]:
    k_level, k_dynamics = jax.random.split(key)
    level = generator.generate(
      k_level,
      rows=self.rows,
      cols=self.cols,
      num_boxes=self.num_boxes,
      search_depth=self.search_depth,
      num_walkers=self.num_walkers,
    )
    state = State(
      walls=level.walls,
      targets=level.targets,
      boxes=level.boxes,
      player=level.player,
      steps=jnp.zeros((), jnp.int32),
      key=k_dynamics,
    )
    return state, self._first_timestep(state)

  def _transition(self, state: State, action: jax.Array):
    size = state.walls.shape[0]
    delta = self._deltas[action]
    dest = jnp.clip(state.player + delta, 0, size - 1)
    beyond = jnp.clip(dest + delta, 0, size - 1)
    box_ahead = state.boxes[dest]
    push = box_ahead & ~state.walls[beyond] & ~state.boxes[beyond]
    move = ~state.walls[dest] & (~box_ahead | push)
    cells = jnp.arange(size)
    pushed = (state.boxes & (cells != dest)) | (cells == beyond)
    boxes = jnp.where(push, pushed, state.boxes)
    before = jnp.sum(state.boxes & state.targets)
    after = jnp.sum(boxes & state.targets)
    c = constants
    solved = jnp.where(after == self.num_boxes, c.SOLVED_REWARD, 0.0)
    reward = solved
    if self.reward == "shaped":
      reward = (
        c.STEP_PENALTY
        + jnp.where(after > before, c.BOX_ON_TARGET_REWARD, 0.0)
        + jnp.where(after < before, c.BOX_OFF_TARGET_PENALTY, 0.0)
        + solved
      )
    new_state = state.replace(
      boxes=boxes,
      player=jnp.where(move, dest, state.player),
      steps=state.steps + 1,
    )
    return new_state, reward

  def _status(self, state: State) -> core.Status:
    solved = jnp.sum(state.boxes & state.targets) == self.num_boxes
    return core.Status(
      terminated=solved,
      truncated=(state.steps >= self.max_steps) & ~solved,
      success=solved,
    )

  def _effective(self, old: State, new: State) -> jax.Array:
    # RAGEN: an action is effective when the player moved.
    return old.player != new.player

  def think(
    self, before: State, actions: jax.Array, after: State
  ) -> tuple[jax.Array, jax.Array]:
    """An expert's reasoning before playing ``actions [A]`` (``-1`` past
    the end) from ``before`` to ``after``, as pieces of ``self.thoughts``
    and how many: "I am at (2, 3); boxes to push: (3, 3); empty targets:
    (4, 1): 1 down and 2 left. Down, Left takes me to (3, 3), a box to
    (4, 3)."; the offset (of the target from the box) with one box
    only."""
    w = self.thoughts
    loose = before.boxes & ~before.targets
    pushed = after.boxes & ~before.boxes
    offset = []
    if self.num_boxes == 1:
      box, target = jnp.argmax(before.boxes), jnp.argmax(before.targets)
      offset = w.offset(box, target)
    return w.write(
      [
        w.phrase("I am at "),
        w.cell(before.player),
        w.phrase("; boxes to push: ", jnp.any(loose)),
        w.cells(loose),
        w.phrase("; empty targets: ", jnp.any(loose)),
        w.cells(before.targets & ~before.boxes),
        *offset,
        w.phrase("."),
        w.phrase(" "),
        w.actions(actions),
        w.phrase(" takes me to "),
        w.cell(after.player),
        w.phrase(", a box to ", jnp.any(pushed)),
        w.cells(pushed),
        w.phrase("."),
      ]
    )

  def render(self, state: State) -> tuple[jax.Array, jax.Array]:
    return sokoban_render.render_state(self._text, state)

  def plan(self, state: State, horizon: int) -> planning.Plan:
    """A shortest solution's first ``horizon`` actions (jittable).

    Breadth-first over (player cell, box cell) pairs, so one box only.

    Raises:
      ValueError: for more than one box.
    """
    if self.num_boxes != 1:
      raise ValueError(
        f"sokoban: plans need num_boxes=1 (the planner enumerates player x "
        f"box cells), got num_boxes={self.num_boxes}"
      )
    n = state.walls.shape[0]
    player = jnp.arange(n)[:, None, None]  # [N, 1, 1]
    box = jnp.arange(n)[None, :, None]  # [1, N, 1]
    dest = jnp.clip(player + self._deltas, 0, n - 1)  # [N, 1, A]
    beyond = jnp.clip(dest + self._deltas, 0, n - 1)
    push = (dest == box) & ~state.walls[beyond]
    move = ~state.walls[dest] & ((dest != box) | push)
    new_player = jnp.where(move, dest, player)
    new_box = jnp.where(push & move, beyond, box)
    next_state = (new_player * n + new_box).reshape(n * n, -1)
    goal = jnp.broadcast_to(state.targets[None, :], (n, n)).reshape(-1)
    start = state.player * n + jnp.argmax(state.boxes)
    return planning.shortest_plan(
      next_state, goal, jnp.zeros_like(goal), start, horizon
    )


def _check(render_mode, symbols, *positive: int) -> None:
  """Raises ``ValueError`` naming a bad render mode, symbol set, or a
  setting (max_steps, search_depth, num_walkers) that is not a positive
  integer."""
  names = ("max_steps", "search_depth", "num_walkers")
  for name, value in zip(names, positive, strict=True):
    if not isinstance(value, int) or value < 1:
      raise ValueError(
        f"sokoban: {name} must be a positive integer, got {value!r}"
      )
  if render_mode not in render.BoardText.MODES:
    raise ValueError(
      f"sokoban: render_mode={render_mode!r}; expected one of "
      f"{render.BoardText.MODES}"
    )
  if symbols not in constants.SYMBOLS:
    raise ValueError(
      f"sokoban: symbols={symbols!r}; expected one of "
      f"{tuple(constants.SYMBOLS)}"
    )


def _room(dim_room: Sequence[int], num_boxes: int) -> tuple[int, int]:
  """(rows, cols) of a room that holds ``num_boxes``, or a clear error."""
  try:
    rows, cols = (int(d) for d in dim_room)
  except (TypeError, ValueError):
    raise ValueError(
      f"sokoban: dim_room must be two integers, got {dim_room!r}"
    ) from None
  if not (5 <= rows <= _MAX_DIM and 5 <= cols <= _MAX_DIM):
    raise ValueError(
      f"sokoban: dim_room must be between 5 and {_MAX_DIM} per side, "
      f"got {dim_room!r}"
    )
  interior = (rows - 2) * (cols - 2)
  # Room for the boxes, the player, and space to pull boxes around.
  if not 1 <= num_boxes <= interior // 4:
    raise ValueError(
      f"sokoban: num_boxes={num_boxes!r} cannot fit a {rows}x{cols} room; "
      f"use 1 to {interior // 4}"
    )
  return rows, cols
