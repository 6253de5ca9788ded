"""Jumanji environments as text environments.

``JumanjiText(game, **settings)`` wraps a Jumanji environment so the
rollout plays it like ours: the board rendered as text pieces, actions
named, Jumanji's reward carried through. A game is a ``Game``: how to build
the Jumanji environment, a name per action, which actions the state allows,
the board as text and when the episode counts as a success. Adding a
Jumanji environment means writing one ``Game``.

Choices made here, the same for every game (``core.TextEnv``'s rules): an
action the state does not allow (a full column in Sudoku, a revealed
Minesweeper cell, a move into a wall) is invalid and changes nothing;
Jumanji would play it (and end Sudoku and Minesweeper). An episode ends when
Jumanji's does (its time limits included: Jumanji reports them as
termination), or when it reaches the game's success.

Supported (``GAMES``): ``game2048``, ``sudoku``, ``sudoku_easy``,
``rubiks_cube`` (3x3) and ``rubiks_cube_2x2`` (RAGEN's), ``maze``,
``sliding_tile_puzzle`` and ``minesweeper``. Jumanji's Sokoban is left out:
it downloads its level dataset; ``envs.jax.sokoban`` generates levels in
``jit``.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs import core
from envs.jax import planning, render, sudoku_solver
from envs.jax.sudoku import rules


@dataclasses.dataclass(frozen=True)
class Game:
  """What turns one Jumanji environment into a text environment.

  Attributes:
    make: settings -> the Jumanji environment.
    action_names: the Jumanji environment -> a name per action id.
    to_action: (Jumanji env, action id) -> the Jumanji action.
    allowed: (Jumanji state, Jumanji action) -> bool, legal here.
    grids: Jumanji state -> ``[(label, int32 [R, C])]``, the board as
      indices into ``symbols``, each grid under its label (or none).
    symbols: the text of each cell index.
    separator: between cells of a row (``" "`` when symbols vary in width).
    success: (Jumanji env, state, Jumanji timestep) -> bool.
    instructions: the task, for RAGEN's prompt.
    list_actions: whether the prompt lists every action name.
    defaults: the settings ``make`` takes, with their defaults.
    plan: optionally, (Jumanji env, settings, Jumanji state, horizon) ->
      ``planning.Plan``, a shortest solution's first ``horizon`` actions
      (the warm start's expert).
  """

  make: Callable[..., Any]
  action_names: Callable[[Any], tuple[str, ...]]
  to_action: Callable[[Any, jax.Array], jax.Array]
  allowed: Callable[[Any, jax.Array], jax.Array]
  grids: Callable[[Any], list[tuple[str | None, jax.Array]]]
  symbols: tuple[str, ...]
  separator: str
  success: Callable[[Any, Any, Any], jax.Array]
  instructions: str
  list_actions: bool
  defaults: dict[str, Any]
  plan: Callable[[Any, dict, Any, int], planning.Plan] | None = None


@struct.dataclass
class State:
  inner: Any  # the Jumanji state
  done: jax.Array  # [] bool: Jumanji ended the episode, or it succeeded
  success: jax.Array  # [] bool
  key: jax.Array  # Jumanji's own key lives in `inner`


class JumanjiText(core.TextEnv):
  """A Jumanji environment behind the text-environment interface."""

  def __init__(self, game: str, **settings: Any) -> None:
    if game not in GAMES:
      raise ValueError(
        f"jumanji: unknown game {game!r}; supported: {sorted(GAMES)}"
      )
    g = GAMES[game]
    for name in settings:
      if name not in g.defaults:
        raise ValueError(
          f"jumanji {game}: unknown setting {name!r}; expected one of "
          f"{sorted(g.defaults)}"
        )
    self.game, self._game = game, g
    self.settings = {**g.defaults, **settings}
    self.env = g.make(**self.settings)
    table = render.PieceTable()
    self._symbols = table.add_all(g.symbols)
    self._separator = table.add(g.separator) if g.separator else None
    self._newline = table.add("\n")
    labels = []

    def boards(key):
      grids = g.grids(self.env.reset(key)[0])
      labels[:] = [label for label, _ in grids]
      return [grid for _, grid in grids]

    shapes = jax.eval_shape(boards, jax.random.key(0))
    self._labels = [None if lb is None else table.add(lb) for lb in labels]
    cells = sum(int(np.prod(grid.shape)) for grid in shapes)
    rows = sum(grid.shape[0] for grid in shapes)
    # Every cell, its separator, each row's newline, each grid's label,
    # newline and the newline before it: a bound on the pieces kept.
    separators = cells if g.separator else 0
    self.spec = core.EnvSpec(
      name=game,
      pieces=table.pieces,
      action_names=g.action_names(self.env),
      instructions=g.instructions,
      legend=(),
      list_actions=g.list_actions,
      max_obs_pieces=cells + separators + rows + 3 * len(shapes),
      max_steps=int(getattr(self.env, "time_limit", 10**6)),
    )
    if g.plan is not None:
      self.plan = self._plan

  def _plan(self, state: State, horizon: int) -> planning.Plan:
    """A shortest solution's first ``horizon`` actions (games with a
    planner only)."""
    return self._game.plan(self.env, self.settings, state.inner, horizon)

  def reset(self, key: jax.Array) -> tuple[State, core.TimeStep]:
    inner, _ = self.env.reset(key)
    false = jnp.zeros((), bool)
    state = State(inner=inner, done=false, success=false, key=key)
    return state, self._first_timestep(state)

  def _available(self, state: State, action: jax.Array) -> jax.Array:
    jumanji_action = self._game.to_action(self.env, action)
    return self._game.allowed(state.inner, jumanji_action)

  def _transition(self, state: State, action: jax.Array):
    inner, ts = self.env.step(
      state.inner, self._game.to_action(self.env, action)
    )
    success = self._game.success(self.env, inner, ts)
    new = state.replace(inner=inner, done=ts.last() | success, success=success)
    return new, ts.reward

  def _status(self, state: State) -> core.Status:
    return core.Status(
      terminated=state.done,
      truncated=jnp.zeros((), bool),
      success=state.success,
    )

  def _effective(self, old: State, new: State) -> jax.Array:
    changed = [
      jnp.any(a != b)
      for (_, a), (_, b) in zip(
        self._game.grids(old.inner), self._game.grids(new.inner), strict=True
      )
    ]
    return jnp.any(jnp.stack(changed))

  def render(self, state: State) -> tuple[jax.Array, jax.Array]:
    segments = []
    for k, (label, (_, grid)) in enumerate(
      zip(self._labels, self._game.grids(state.inner), strict=True)
    ):
      if k:
        segments.append(render.fixed([self._newline]))
      if label is not None:
        segments.append(render.fixed([label, self._newline]))
      r, c = grid.shape
      ids = jnp.asarray(self._symbols)[grid]  # [R, C]
      parts = [ids[:, :, None]]
      keep = [jnp.ones((r, c, 1), bool)]
      if self._separator is not None:
        parts.insert(0, jnp.full((r, c, 1), self._separator))
        after_first = jnp.arange(c)[None, :, None] > 0
        keep.insert(0, jnp.broadcast_to(after_first, (r, c, 1)))
      row_ids = jnp.concatenate(parts, axis=2).reshape(r, -1)
      row_keep = jnp.concatenate(keep, axis=2).reshape(r, -1)
      newline = jnp.full((r, 1), self._newline)
      row_ids = jnp.concatenate([row_ids, newline], axis=1)
      row_keep = jnp.concatenate(
        [row_keep, (jnp.arange(r) < r - 1)[:, None]], axis=1
      )
      segments.append((row_ids.reshape(-1), row_keep.reshape(-1)))
    return render.pack(segments, self.spec.max_obs_pieces)


# ----------------------------------------------------------------------------
# The games

MOVES = ("Up", "Right", "Down", "Left")  # Jumanji's order, wherever it moves


def _mask_allowed(state: Any, action: jax.Array) -> jax.Array:
  return state.action_mask[action]


def _game2048(board_size: int, target_tile: int):
  from jumanji.environments.logic.game_2048 import Game2048

  if target_tile < 4 or target_tile & (target_tile - 1):
    raise ValueError(
      f"jumanji game2048: target_tile must be a power of two >= 4, got "
      f"{target_tile!r}"
    )
  env = Game2048(board_size=board_size)
  env.target_exponent = target_tile.bit_length() - 1
  return env


def _sudoku(database: str):
  from jumanji.environments.logic.sudoku import Sudoku
  from jumanji.environments.logic.sudoku.data import DATABASES
  from jumanji.environments.logic.sudoku.generator import DatabaseGenerator

  if database not in DATABASES:
    raise ValueError(
      f"jumanji sudoku: database={database!r}; expected one of "
      f"{sorted(DATABASES)}"
    )
  path = _sudoku_path(database)
  return Sudoku(generator=DatabaseGenerator(database=jnp.load(path)))


def _sudoku_path(database: str) -> str:
  import jumanji.environments.logic.sudoku as sudoku_pkg
  from jumanji.environments.logic.sudoku.data import DATABASES

  return os.path.join(
    os.path.dirname(sudoku_pkg.__file__), "data", DATABASES[database]
  )


def _sudoku_plan(
  env: Any, settings: dict, state: Any, horizon: int
) -> planning.Plan:
  """Every empty cell filled with its solution's digit, one at a time in a
  cell with the fewest candidates on the board as it then stands (a forced
  cell's digit follows from its row, column and box), ties row by row.
  The database's solutions are solved on the host (``envs.jax.sudoku_solver``)
  the first time this is traced; the board's is the first whose digits
  agree with every filled cell, and a board no solution agrees with (a
  wrong digit placed) has no plan."""
  solutions = jnp.asarray(
    sudoku_solver.solve_all(_sudoku_path(settings["database"])), jnp.int32
  )
  board = state.board  # [9, 9], -1 empty, else digit - 1
  agree = jnp.all((board < 0) | (board == solutions - 1), axis=(1, 2))
  found = jnp.any(agree)
  filled = jnp.where(board < 0, 0, board + 1).reshape(-1)
  moves = rules.fill_moves(
    filled, solutions[jnp.argmax(agree)].reshape(-1), 3, horizon
  )
  return planning.Plan(
    actions=jnp.where(found, moves, -1),
    length=jnp.where(found, jnp.sum(board < 0), -1).astype(jnp.int32),
  )


def _sudoku_names(env: Any) -> tuple[str, ...]:
  return tuple(
    f"r{r + 1}c{c + 1}={v + 1}"
    for r, c, v in itertools.product(range(9), repeat=3)
  )


def _sudoku_action(env: Any, action: jax.Array) -> jax.Array:
  return jnp.stack([action // 81, (action // 9) % 9, action % 9])


def _rubiks(cube_size: int, scrambles: int, time_limit: int):
  from jumanji.environments.logic.rubiks_cube import RubiksCube
  from jumanji.environments.logic.rubiks_cube.generator import (
    ScramblingGenerator,
  )

  return RubiksCube(
    generator=ScramblingGenerator(
      cube_size=cube_size, num_scrambles_on_reset=scrambles
    ),
    time_limit=time_limit,
  )


FACES = ("U", "F", "R", "B", "L", "D")  # Jumanji's Face order


def _rubiks_names(env: Any) -> tuple[str, ...]:
  depths = env.generator.cube_size // 2
  return tuple(
    f"{d + 1 if d else ''}{face}{turn}"
    for face in FACES
    for d in range(depths)
    for turn in ("", "'", "2")
  )


def _rubiks_action(env: Any, action: jax.Array) -> jax.Array:
  depths = env.generator.cube_size // 2
  return jnp.stack([action // (3 * depths), (action // 3) % depths, action % 3])


def _maze(rows: int, cols: int):
  from jumanji.environments.routing.maze import Maze
  from jumanji.environments.routing.maze.generator import RandomGenerator

  return Maze(generator=RandomGenerator(num_rows=rows, num_cols=cols))


def _maze_grid(state: Any) -> list:
  kinds = jnp.where(state.walls, 1, 0)
  target = (state.target_position.row, state.target_position.col)
  agent = (state.agent_position.row, state.agent_position.col)
  kinds = kinds.at[target].set(3)
  on_goal = (agent[0] == target[0]) & (agent[1] == target[1])
  return [(None, kinds.at[agent].set(jnp.where(on_goal, 4, 2)))]


def _sliding(grid_size: int, random_moves: int):
  from jumanji.environments.logic.sliding_tile_puzzle import SlidingTilePuzzle
  from jumanji.environments.logic.sliding_tile_puzzle.generator import (
    RandomWalkGenerator,
  )

  return SlidingTilePuzzle(
    generator=RandomWalkGenerator(
      grid_size=grid_size, num_random_moves=random_moves
    )
  )


def _sliding_allowed(state: Any, action: jax.Array) -> jax.Array:
  from jumanji.environments.logic.sliding_tile_puzzle.constants import MOVES

  n = state.puzzle.shape[0]
  to = state.empty_tile_position + MOVES[action]
  return jnp.all((to >= 0) & (to < n))


def _minesweeper(rows: int, cols: int, mines: int):
  from jumanji.environments.logic.minesweeper import Minesweeper
  from jumanji.environments.logic.minesweeper.generator import (
    UniformSamplingGenerator,
  )

  return Minesweeper(
    generator=UniformSamplingGenerator(
      num_rows=rows, num_cols=cols, num_mines=mines
    )
  )


def _cell_names(env: Any) -> tuple[str, ...]:
  return tuple(
    f"r{r + 1}c{c + 1}"
    for r in range(env.num_rows)
    for c in range(env.num_cols)
  )


def _cell_action(env: Any, action: jax.Array) -> jax.Array:
  return jnp.stack([action // env.num_cols, action % env.num_cols])


def _minesweeper_success(env: Any, state: Any, ts: Any) -> jax.Array:
  revealed = jnp.sum(state.board >= 0)
  return revealed == state.board.size - env.num_mines


def _grid(field: str, offset: int = 0) -> Callable[[Any], list]:
  return lambda state: [(None, getattr(state, field) + offset)]


def _cube_grids(state: Any) -> list:
  return [(f"{face}:", state.cube[i]) for i, face in enumerate(FACES)]


GAMES: dict[str, Game] = {}
GAMES["game2048"] = Game(
  make=_game2048,
  action_names=lambda env: MOVES,
  to_action=lambda env, a: a,
  allowed=_mask_allowed,
  grids=_grid("board"),
  symbols=(".", *(str(2**e) for e in range(1, 18))),
  separator=" ",
  success=lambda env, state, ts: jnp.max(state.board) >= env.target_exponent,
  instructions=(
    "You are playing 2048. Slide the tiles Up, Right, Down or Left; two "
    "equal tiles that meet merge into their sum, which is your reward. "
    "Reach the target tile. Example answer format: <answer>Left || Up"
    "</answer>"
  ),
  list_actions=True,
  defaults={"board_size": 4, "target_tile": 2048},
)
_SUDOKU = Game(
  make=_sudoku,
  action_names=_sudoku_names,
  to_action=_sudoku_action,
  allowed=lambda state, a: state.action_mask[a[0], a[1], a[2]],
  grids=_grid("board", 1),
  symbols=(".", *"123456789"),
  separator="",
  success=lambda env, state, ts: ts.reward > 0,
  instructions=(
    "You are solving a Sudoku: fill each empty cell (.) so that every row, "
    "column and 3x3 box holds 1 to 9 once. Name a move as r<row>c<column>="
    "<digit>, rows and columns from 1. Example answer format: "
    "<answer>r1c3=4 || r2c5=7</answer>"
  ),
  list_actions=False,
  defaults={"database": "mixed"},
  plan=_sudoku_plan,
)
GAMES["sudoku"] = _SUDOKU
GAMES["sudoku_easy"] = dataclasses.replace(
  _SUDOKU, defaults={"database": "very-easy"}
)
_RUBIKS = Game(
  make=_rubiks,
  action_names=_rubiks_names,
  to_action=_rubiks_action,
  allowed=lambda state, a: jnp.ones((), bool),
  grids=_cube_grids,
  symbols=FACES,
  separator="",
  success=lambda env, state, ts: ts.reward > 0,
  instructions=(
    "You are solving a Rubik's cube, shown face by face (U up, F front, R "
    "right, B back, L left, D down; each sticker is named by the face whose "
    "colour it has). Turn a face clockwise (U), anticlockwise (U') or by "
    "half (U2). Example answer format: <answer>R || U'</answer>"
  ),
  list_actions=True,
  defaults={"cube_size": 3, "scrambles": 100, "time_limit": 200},
)
GAMES["rubiks_cube"] = _RUBIKS
# RAGEN's 2x2 cube, scrambled by a few turns.
GAMES["rubiks_cube_2x2"] = dataclasses.replace(
  _RUBIKS, defaults={"cube_size": 2, "scrambles": 3, "time_limit": 50}
)
GAMES["maze"] = Game(
  make=_maze,
  action_names=lambda env: MOVES,
  to_action=lambda env, a: a,
  allowed=_mask_allowed,
  grids=_maze_grid,
  symbols=("_", "#", "P", "G", "@"),
  separator="",
  success=lambda env, state, ts: (
    (state.agent_position.row == state.target_position.row)
    & (state.agent_position.col == state.target_position.col)
  ),
  instructions=(
    "You are in a maze (# wall, _ floor, P you, G goal, @ you on the goal). "
    "Walk to the goal. "
    "Example answer format: <answer>Down || Right</answer>"
  ),
  list_actions=True,
  defaults={"rows": 6, "cols": 6},
)
GAMES["sliding_tile_puzzle"] = Game(
  make=_sliding,
  action_names=lambda env: MOVES,
  to_action=lambda env, a: a,
  allowed=_sliding_allowed,
  grids=_grid("puzzle"),
  symbols=("_", *(str(i) for i in range(1, 100))),
  separator=" ",
  success=lambda env, state, ts: (
    ts.last() & jnp.all(state.puzzle == env.solved_puzzle)
  ),
  instructions=(
    "You are solving a sliding tile puzzle: move the empty cell (_) Up, "
    "Right, Down or Left until the tiles read 1, 2, 3, ... row by row with "
    "the empty cell last. Example answer format: <answer>Up || Left"
    "</answer>"
  ),
  list_actions=True,
  defaults={"grid_size": 3, "random_moves": 20},
)
GAMES["minesweeper"] = Game(
  make=_minesweeper,
  action_names=_cell_names,
  to_action=_cell_action,
  allowed=lambda state, a: state.board[a[0], a[1]] < 0,
  grids=_grid("board", 1),
  symbols=("?", *"012345678"),
  separator="",
  success=_minesweeper_success,
  instructions=(
    "You are playing Minesweeper: reveal every cell (?) that holds no mine; "
    "a revealed cell shows how many of its 8 neighbours hold mines. Name a "
    "cell as r<row>c<column>, from 1. Example answer format: "
    "<answer>r2c3</answer>"
  ),
  list_actions=False,
  defaults={"rows": 5, "cols": 5, "mines": 4},
)
