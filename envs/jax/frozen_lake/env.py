"""FrozenLake as a pure, jittable text environment with RAGEN's rules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from envs import core
from envs.jax import grid, planning, render, thoughts
from envs.jax.frozen_lake import constants, generator

# RAGEN's coord label order.
LABELS = (
  "Start",
  "Goal",
  "Player",
  "Player on goal",
  "Player in hole",
  "Holes",
)

# The phrases of an expert's reasoning (``think``).
PHRASES = (
  "I am at ",
  "; the goal is at ",
  ".",
  " Holes near me: ",
  " No hole near me.",
  " ",
  " takes me to ",
)


@struct.dataclass
class State:
  holes: jax.Array  # [N] bool, N = size * size, row-major
  start: jax.Array  # [] int32 flat cell
  goal: jax.Array  # [] int32 flat cell
  player: jax.Array  # [] int32 flat cell
  steps: jax.Array  # [] int32 actions taken
  key: jax.Array  # PRNG key of the slippery ice


class FrozenLake(core.TextEnv):
  """Walk from the start to the goal without falling into a hole.

  With probability ``success_rate`` the player moves as asked; otherwise it
  slides to one of the two perpendicular directions, equally likely (gym's
  rule). Moves off the board leave the player in place. Reaching the goal
  pays 1 and ends the episode; a hole ends it with nothing.
  """

  def __init__(
    self,
    size: int = 4,
    p: float = 0.8,
    success_rate: float = 0.8,
    max_steps: int = 100,
    render_mode: str = "grid",
    instructions: str = "ragen",
  ) -> None:
    """Validates the settings before anything compiles.

    Args:
      size: the board is ``size`` x ``size``.
      p: probability that a cell is frozen rather than a hole.
      success_rate: probability of moving in the intended direction; 1.0 is
        deterministic, 1/3 is classic gym, 0.8 is RAGEN's default.
      max_steps: actions before the episode is truncated.
      render_mode: ``"grid"``, ``"coord"`` or ``"grid_coord"``.
      instructions: ``"ragen"`` (RAGEN's, with an example's reasoning) or
        ``"ragen2"`` (RAGEN-2's: the answer's form only, and how to read
        coordinates where the observation has them).
    """
    _check(size, p, success_rate, max_steps, render_mode, instructions)
    self.size, self.p = size, float(p)
    self.success_rate, self.max_steps = float(success_rate), max_steps
    table = render.PieceTable()
    # Start, goal and the player's cell may each be listed twice.
    self._text = render.BoardText(
      table, size, size, constants.SYMBOLS, LABELS, render_mode, size * size + 3
    )
    self.thoughts = thoughts.BoardThoughts(
      size, size, constants.ACTIONS, PHRASES
    )
    self.spec = core.EnvSpec(
      name="frozen_lake",
      pieces=table.pieces,
      action_names=constants.ACTIONS,
      instructions=_instructions(instructions, render_mode),
      legend=tuple(zip(constants.SYMBOLS, constants.KIND_NAMES, strict=True)),
      list_actions=True,
      max_obs_pieces=self._text.max_pieces,
      piece_limits=self._text.piece_limits(),
      max_steps=max_steps,
    )

  def reset(self, key: jax.Array) -> tuple[State, core.TimeStep]:
    k_map, k_dynamics = jax.random.split(key)
    level = generator.generate(k_map, size=self.size, p=self.p)
    state = State(
      holes=level.holes,
      start=level.start,
      goal=level.goal,
      player=level.start,
      steps=jnp.zeros((), jnp.int32),
      key=k_dynamics,
    )
    return state, self._first_timestep(state)

  def _transition(self, state: State, action: jax.Array):
    key = state.key
    direction = action
    if self.success_rate < 1.0:
      # gym's categorical draw over (action - 1, action, action + 1).
      key, sub = jax.random.split(key)
      u = jax.random.uniform(sub)
      slip = (1.0 - self.success_rate) / 2.0
      direction = (
        jnp.where(
          u < slip,
          action - 1,
          jnp.where(u < slip + self.success_rate, action, action + 1),
        )
        % 4
      )
    moves = jnp.asarray(constants.MOVES, jnp.int32)
    row = jnp.clip(
      state.player // self.size + moves[direction, 0], 0, self.size - 1
    )
    col = jnp.clip(
      state.player % self.size + moves[direction, 1], 0, self.size - 1
    )
    player = row * self.size + col
    reward = jnp.where(player == state.goal, constants.GOAL_REWARD, 0.0)
    return state.replace(player=player, steps=state.steps + 1, key=key), reward

  def _status(self, state: State) -> core.Status:
    at_goal = state.player == state.goal
    terminated = at_goal | state.holes[state.player]
    return core.Status(
      terminated=terminated,
      truncated=(state.steps >= self.max_steps) & ~terminated,
      success=at_goal,
    )

  def _effective(self, old: State, new: State) -> jax.Array:
    return old.player != new.player

  def plan(self, state: State, horizon: int) -> planning.Plan:
    """A shortest safe path's first ``horizon`` actions (jittable).

    Raises:
      ValueError: on slippery ice, where no fixed plan is optimal.
    """
    if self.success_rate < 1.0:
      raise ValueError(
        "frozen_lake: plans need deterministic moves (success_rate=1.0), "
        f"got success_rate={self.success_rate}"
      )
    cells = jnp.arange(self.size * self.size)
    moves = jnp.asarray(constants.MOVES, jnp.int32)
    row = jnp.clip(cells[:, None] // self.size + moves[:, 0], 0, self.size - 1)
    col = jnp.clip(cells[:, None] % self.size + moves[:, 1], 0, self.size - 1)
    return planning.shortest_plan(
      row * self.size + col,
      cells == state.goal,
      state.holes,
      state.player,
      horizon,
    )

  def think(
    self, before: State, actions: jax.Array, after: State
  ) -> tuple[jax.Array, jax.Array]:
    """An expert's reasoning before playing ``actions [A]`` (``-1`` past
    the end) from ``before`` to ``after``, as pieces of ``self.thoughts``
    and how many: "I am at (0, 1); the goal is at (3, 2): 3 down and 1
    right. Holes near me: (1, 1). Down, Right takes me to (1, 2)."."""
    w = self.thoughts
    near = w.neighbours(before.player) & before.holes
    any_near = jnp.any(near)
    return w.write(
      [
        w.phrase("I am at "),
        w.cell(before.player),
        w.phrase("; the goal is at "),
        w.cell(before.goal),
        *w.offset(before.player, before.goal),
        w.phrase("."),
        w.phrase(" Holes near me: ", any_near),
        w.cells(near),
        w.phrase(".", any_near),
        w.phrase(" No hole near me.", ~any_near),
        w.phrase(" "),
        w.actions(actions),
        w.phrase(" takes me to "),
        w.cell(after.player),
        w.phrase("."),
      ]
    )

  def render(self, state: State) -> tuple[jax.Array, jax.Array]:
    cells = jnp.arange(self.size * self.size)
    here = cells == state.player
    goal = cells == state.goal
    c = constants
    kinds = jnp.select(
      [here & state.holes, here & goal, here, state.holes, goal],
      [c.PLAYER_IN_HOLE, c.PLAYER_ON_GOAL, c.PLAYER, c.HOLE, c.GOAL],
      c.EMPTY,
    )
    masks = (
      cells == state.start,
      goal,
      here & ~goal & ~state.holes,
      here & goal,
      here & state.holes,
      state.holes,
    )
    return self._text(kinds, masks)


def _instructions(which: str, render_mode: str) -> str:
  """The system message's instructions ``which`` names, for observations
  rendered as ``render_mode``."""
  if which == "ragen":
    return constants.INSTRUCTIONS
  coords = constants.COORDINATES if "coord" in render_mode else ""
  return constants.INSTRUCTIONS_RAGEN2 + coords


def _check(size, p, success_rate, max_steps, render_mode, instructions):
  """Raises ``ValueError`` naming the first setting ``FrozenLake`` cannot
  take."""
  if not isinstance(size, int) or not 2 <= size <= grid.MAX_COLS:
    raise ValueError(
      f"frozen_lake: size must be an integer from 2 to {grid.MAX_COLS}, "
      f"got {size!r}"
    )
  for name, value in (("p", p), ("success_rate", success_rate)):
    if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
      raise ValueError(f"frozen_lake: {name} must be in [0, 1], got {value!r}")
  if not isinstance(max_steps, int) or max_steps < 1:
    raise ValueError(
      f"frozen_lake: max_steps must be a positive integer, got {max_steps!r}"
    )
  if render_mode not in render.BoardText.MODES:
    raise ValueError(
      f"frozen_lake: render_mode={render_mode!r}; expected one of "
      f"{render.BoardText.MODES}"
    )
  if instructions not in constants.INSTRUCTION_SETS:
    raise ValueError(
      f"frozen_lake: instructions={instructions!r}; expected one of "
      f"{constants.INSTRUCTION_SETS}"
    )
