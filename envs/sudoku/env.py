"""4x4 Sudoku as a pure, jittable text environment (SPA's Sudoku).

SPA (arXiv 2510.15047) trains on 4x4 Sudoku; Jumanji's 9x9 is
``envs.jumanji_text``'s ``sudoku``. A move ``r<row>c<col>=<digit>`` is
legal when the cell is empty and its row, column and 2x2 box do not hold
the digit; any other move is invalid and changes nothing. The board filled
pays 1 and ends the episode; a board with an empty cell that no digit may
fill (a dead end a wrong legal move leads to) ends it with nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from envs import core, planning, render
from envs.sudoku import constants, generator, rules


@struct.dataclass
class State:
  board: jax.Array  # [16] int32, row-major, 0 empty, else the digit
  steps: jax.Array  # [] int32 legal moves made
  key: jax.Array  # unused by the (deterministic) dynamics


class Sudoku4x4(core.TextEnv):
  """Fill the board's empty cells so that every row, column and box holds
  each digit once."""

  def __init__(
    self, min_empty: int = 6, max_empty: int = 10, max_steps: int = 100
  ) -> None:
    """Validates the settings before anything compiles.

    Args:
      min_empty, max_empty: a level has a uniform number of empty cells
        between them (inclusive).
      max_steps: legal moves before the episode is truncated.
    """
    for name, value in (("min_empty", min_empty), ("max_empty", max_empty)):
      if not isinstance(value, int) or not 1 <= value <= constants.CELLS:
        raise ValueError(
          f"sudoku_4x4: {name} must be an integer from 1 to "
          f"{constants.CELLS}, got {value!r}"
        )
    if min_empty > max_empty:
      raise ValueError(
        f"sudoku_4x4: min_empty={min_empty} is more than max_empty={max_empty}"
      )
    if not isinstance(max_steps, int) or max_steps < 1:
      raise ValueError(
        f"sudoku_4x4: max_steps must be a positive integer, got {max_steps!r}"
      )
    self.min_empty, self.max_empty = min_empty, max_empty
    self.max_steps = max_steps
    table = render.PieceTable()
    self._symbols = table.add_all(constants.SYMBOLS)
    self._newline = table.add("\n")
    n = constants.SIZE
    self.spec = core.EnvSpec(
      name="sudoku_4x4",
      pieces=table.pieces,
      action_names=constants.ACTIONS,
      answer_pieces=(*constants.CELL_PIECES, *constants.SYMBOLS[1:]),
      instructions=constants.INSTRUCTIONS,
      legend=(),
      list_actions=False,
      max_obs_pieces=n * n + n - 1,
      max_steps=max_steps,
    )

  def reset(self, key: jax.Array) -> tuple[State, core.TimeStep]:
    k_level, k_dynamics = jax.random.split(key)
    board = generator.generate(
      k_level, min_empty=self.min_empty, max_empty=self.max_empty
    )
    state = State(board=board, steps=jnp.zeros((), jnp.int32), key=k_dynamics)
    return state, self._first_timestep(state)

  def _available(self, state: State, action: jax.Array) -> jax.Array:
    cell, digit = jnp.divmod(action, constants.SIZE)
    return rules.legal(state.board, constants.BOX)[cell, digit]

  def _transition(self, state: State, action: jax.Array):
    cell, digit = jnp.divmod(action, constants.SIZE)
    board = state.board.at[cell].set(digit + 1)
    reward = jnp.where(jnp.all(board > 0), 1.0, 0.0)
    return state.replace(board=board, steps=state.steps + 1), reward

  def _status(self, state: State) -> core.Status:
    solved = jnp.all(state.board > 0)
    stuck = ~jnp.any(rules.legal(state.board, constants.BOX))
    terminated = solved | stuck
    return core.Status(
      terminated=terminated,
      truncated=(state.steps >= self.max_steps) & ~terminated,
      success=solved,
    )

  def _effective(self, old: State, new: State) -> jax.Array:
    return jnp.any(old.board != new.board)

  def plan(self, state: State, horizon: int) -> planning.Plan:
    """The first ``horizon`` moves of a solution (jittable): the first
    solved board (of the 288) that agrees with every filled cell, its
    digits placed one at a time in a cell with the fewest legal digits on
    the board as it then stands (a forced cell first). A board no solved
    board agrees with (a wrong legal move made) has no plan: every action
    ``-1``, ``length`` ``-1``."""
    boards = jnp.asarray(generator.solved_boards())
    agree = jnp.all((state.board == 0) | (state.board == boards), axis=1)
    found = jnp.any(agree)
    moves = rules.fill_moves(
      state.board, boards[jnp.argmax(agree)], constants.BOX, horizon
    )
    return planning.Plan(
      actions=jnp.where(found, moves, -1),
      length=jnp.where(found, jnp.sum(state.board == 0), -1).astype(jnp.int32),
    )

  def render(self, state: State) -> tuple[jax.Array, jax.Array]:
    """Rows of digits (``.`` empty), one per line, as Jumanji's 9x9."""
    n = constants.SIZE
    ids = jnp.asarray(self._symbols)[state.board].reshape(n, n)
    rows = jnp.concatenate([ids, jnp.full((n, 1), self._newline)], axis=1)
    return rows.reshape(-1)[:-1], jnp.asarray(self.spec.max_obs_pieces)
