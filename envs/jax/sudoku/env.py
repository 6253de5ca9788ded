"""4x4 Sudoku as a pure, jittable text environment (SPA's Sudoku).

SPA (arXiv 2510.15047) trains on 4x4 Sudoku; Jumanji's 9x9 is
``envs.jax.jumanji_text``'s ``sudoku``. A move ``r<row>c<col>=<digit>`` is
legal when the cell is empty and its row, column and 2x2 box do not hold
the digit; any other move is invalid and changes nothing. The board filled
pays 1 and ends the episode; a board with an empty cell that no digit may
fill (a dead end a wrong legal move leads to) ends it with nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from envs import core
from envs.jax import planning, render
from envs.jax.sudoku import constants, generator, rules


@struct.dataclass
class State:
  board: jax.Array  # [16] int32, row-major, 0 empty, else the digit
  steps: jax.Array  # [] int32 legal moves made
  key: jax.Array  # unused by the (deterministic) dynamics


class Sudoku4x4(core.TextEnv):
  """Fill the board's empty cells so that every row, column and box holds
  each digit once."""

  RENDER_MODES = ("grid", "cells")

  def __init__(
    self,
    min_empty: int = 6,
    max_empty: int = 10,
    max_steps: int = 100,
    render_mode: str = "grid",
  ) -> None:
    """Validates the settings before anything compiles.

    Args:
      min_empty, max_empty: a level has a uniform number of empty cells
        between them (inclusive).
      max_steps: legal moves before the episode is truncated.
      render_mode: ``"grid"``, rows of digits (``.`` empty) as Jumanji's
        9x9; ``"cells"``, each cell named as a move names it, then its
        digit: ``r1c1=2 r1c2=. r1c3=. r1c4=1`` a row.
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
    if render_mode not in self.RENDER_MODES:
      raise ValueError(
        f"sudoku_4x4: render_mode={render_mode!r}; expected one of "
        f"{self.RENDER_MODES}"
      )
    self.min_empty, self.max_empty = min_empty, max_empty
    self.max_steps, self.render_mode = max_steps, render_mode
    table = render.PieceTable()
    self._symbols = table.add_all(constants.SYMBOLS)
    self._newline = table.add("\n")
    n = constants.SIZE
    if render_mode == "cells":
      self._cells = table.add_all(constants.CELL_PIECES)
      self._space = table.add(" ")
    # Every cell's pieces and the newlines between rows.
    pieces = n * n + n - 1 if render_mode == "grid" else 3 * n * n - 1
    self.spec = core.EnvSpec(
      name="sudoku_4x4",
      pieces=table.pieces,
      action_names=constants.ACTIONS,
      answer_pieces=(*constants.CELL_PIECES, *constants.SYMBOLS[1:]),
      instructions=constants.INSTRUCTIONS,
      legend=(),
      list_actions=False,
      max_obs_pieces=pieces,
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
    n = constants.SIZE
    digits = jnp.asarray(self._symbols)[state.board].reshape(n, n, 1)
    if self.render_mode == "grid":
      parts = [digits]
    else:
      gap = jnp.full((n, n, 1), self._space).at[:, -1].set(self._newline)
      parts = [jnp.asarray(self._cells).reshape(n, n, 1), digits, gap]
    cells = jnp.concatenate(parts, axis=2).reshape(n, -1)
    if self.render_mode == "grid":
      cells = jnp.concatenate([cells, jnp.full((n, 1), self._newline)], 1)
    return cells.reshape(-1)[:-1], jnp.asarray(self.spec.max_obs_pieces)
