"""Sokoban observations: cell kinds and RAGEN's coord lines."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from envs.jax import render
from envs.jax.sokoban import constants

# RAGEN's label order. Walls are listed too, as the issue asks (RAGEN's
# current code leaves them out as too long).
LABELS = (
  "Walls",
  "Targets",
  "Boxes",
  "Boxes on target",
  "Player",
  "Player on target",
)


def board_text(
  table: render.PieceTable,
  rows: int,
  cols: int,
  num_boxes: int,
  symbols: tuple[str, ...],
  mode: str,
) -> render.BoardText:
  # Every cell is listed at most once, except targets under a box or the
  # player, which are listed twice.
  return render.BoardText(
    table, rows, cols, symbols, LABELS, mode, rows * cols + num_boxes
  )


def kinds_and_masks(walls, targets, boxes, player):
  """Cell kinds ``[N]`` (``constants``) and one mask per label."""
  here = jnp.arange(walls.shape[0]) == player
  c = constants
  kinds = jnp.select(
    [walls, boxes & targets, boxes, here & targets, here, targets],
    [c.WALL, c.BOX_ON_TARGET, c.BOX, c.PLAYER_ON_TARGET, c.PLAYER, c.TARGET],
    c.EMPTY,
  )
  masks = (
    walls,
    targets,
    boxes & ~targets,
    boxes & targets,
    here & ~targets,
    here & targets,
  )
  return kinds, masks


def render_state(text: render.BoardText, state) -> tuple[jax.Array, jax.Array]:
  return text(
    *kinds_and_masks(state.walls, state.targets, state.boxes, state.player)
  )
