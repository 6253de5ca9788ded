"""Sokoban level generation inside ``jit``: gym-sokoban's recipe, as RAGEN
uses it.

1. Room topology: a random walk that changes direction with probability
   0.35 and stamps one of five 3x3 floor masks at every step; the border
   stays wall.
2. The player and the box targets go on distinct random floor cells, boxes
   on their targets (the solved state).
3. Reverse play: the player moves and pulls boxes, so every state it reaches
   can be solved by pushing back. A state scores ``box_swaps *
   displacement`` (how often the pulled box changed, times the boxes' total
   Manhattan distance from their targets), and only when every target is
   empty; the best-scoring state becomes the level.
4. RAGEN's addition: the player then walks 1-3 random steps (probability
   0.8 if the displacement is 1, else 0.5), so it does not always start next
   to a box.
5. A level whose best score is 0 is drawn again.

Choice made here: gym-sokoban explores the reverse-play states depth first
(up to ``search_depth`` deep), which has no static shape. Here
``num_walkers`` independent random walks of ``search_depth`` reverse moves
each sample the same states, a walker choosing uniformly among the moves not
blocked by a wall or a box. The score and its tie-breaking (the first state
reaching a better score wins) are RAGEN's. ``search_depth`` is the
difficulty knob: longer walks reach more displaced, harder levels.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.jax import grid
from envs.jax.sokoban import constants

# The five 3x3 floor stamps of gym-sokoban's topology walk, as 9-bit masks
# over the window read row-major.
_STAMPS = (
  ((0, 0, 0), (1, 1, 1), (0, 0, 0)),
  ((0, 1, 0), (0, 1, 0), (0, 1, 0)),
  ((0, 0, 0), (1, 1, 0), (0, 1, 0)),
  ((0, 0, 0), (1, 1, 0), (1, 1, 0)),
  ((0, 0, 0), (0, 1, 1), (0, 1, 0)),
)
_STAMP_BITS = np.asarray(
  [sum(int(v) << i for i, v in enumerate(np.ravel(s))) for s in _STAMPS],
  np.int32,
)
_TOPOLOGY_DIRECTIONS = np.asarray(((1, 0), (0, 1), (-1, 0), (0, -1)), np.int32)
_P_CHANGE_DIRECTION = 0.35
_MAX_PLAYER_WALK = 3
# Placements tried per room before the reverse-play search.
_PLACEMENTS = 4


@struct.dataclass
class Level:
  walls: jax.Array  # [N] bool, N = rows * cols, row-major
  targets: jax.Array  # [N] bool
  boxes: jax.Array  # [N] bool
  player: jax.Array  # [] int32, a flat cell index
  displacement: jax.Array  # [] int32, boxes' total distance from targets


def _topology(key: jax.Array, rows: int, cols: int, steps: int) -> jax.Array:
  """Floor cells ``[rows * cols]`` carved by gym-sokoban's random walk."""
  # One draw for the whole walk: each jax.random call inlines a Threefry.
  u = jax.random.uniform(key, (3, steps + 1))
  direction = (u[0, 0] * 4).astype(jnp.int32)
  # random.randint(1, dim - 1) includes both ends.
  pos = 1 + (u[1:, 0] * jnp.array([rows - 1, cols - 1])).astype(jnp.int32)
  change = u[0, 1:] < _P_CHANGE_DIRECTION
  new_dirs = (u[1, 1:] * 4).astype(jnp.int32)
  stamps = (u[2, 1:] * len(_STAMPS)).astype(jnp.int32)
  r = jnp.arange(rows)[:, None]
  c = jnp.arange(cols)[None, :]
  lo = jnp.array([1, 1])
  hi = jnp.array([rows - 2, cols - 2])

  def body(carry, xs):
    direction, pos, floor = carry
    change, new_dir, stamp = xs
    direction = jnp.where(change, new_dir, direction)
    pos = jnp.clip(pos + jnp.asarray(_TOPOLOGY_DIRECTIONS)[direction], lo, hi)
    dr = r - pos[0] + 1
    dc = c - pos[1] + 1
    inside = (dr >= 0) & (dr < 3) & (dc >= 0) & (dc < 3)
    bit = jnp.where(inside, dr * 3 + dc, 0)
    stamped = inside & (((jnp.asarray(_STAMP_BITS)[stamp] >> bit) & 1) == 1)
    return (direction, pos, floor | stamped), None

  floor = jnp.zeros((rows, cols), bool)
  (_, _, floor), _ = jax.lax.scan(
    body, (direction, pos, floor), (change, new_dirs, stamps)
  )
  interior = (r > 0) & (r < rows - 1) & (c > 0) & (c < cols - 1)
  return (floor & interior).reshape(-1)


def _place(key: jax.Array, floor: jax.Array, num_boxes: int, tries: int):
  """``tries`` placements of the player and targets on distinct floor cells.

  Returns:
    players int32 [tries], targets int32 [tries, num_boxes].
  """
  u = jax.random.uniform(key, (num_boxes + 1, tries))
  free = jnp.broadcast_to(floor, (tries, *floor.shape))
  picks = []
  for j in range(num_boxes + 1):
    # The r-th free cell, r uniform: one random number per pick.
    count = jnp.sum(free, axis=-1)
    r = jnp.floor(u[j] * count).astype(jnp.int32)
    pick = jnp.argmax(jnp.cumsum(free, axis=-1) > r[:, None], axis=-1)
    picks.append(pick)
    free = free & (jnp.arange(floor.shape[0]) != pick[:, None])
  return picks[0], jnp.stack(picks[1:], axis=-1)


def _can_start(
  floor: jax.Array,
  players: jax.Array,
  targets: jax.Array,
  rows: int,
  cols: int,
  num_boxes: int,
) -> jax.Array:
  """Necessary conditions for reverse play to score, per placement.

  Every target needs a line of two floor cells beside it (to pull its box
  off), and the player must be able to make a first pull: reach a cell next
  to a box, with a free cell beyond it. Rejecting placements that fail them
  before the costly search keeps the distribution of accepted levels.

  Args:
    floor: bool [N].
    players: int32 [K].
    targets: int32 [K, num_boxes].

  Returns:
    bool [K].
  """
  size = rows * cols
  cells = jnp.arange(size)
  deltas = jnp.asarray([dr * cols + dc for dr, dc in constants.MOVES])
  occupied = jnp.any(cells == targets[..., None], axis=-2)  # [K, N]
  free = floor & ~occupied
  # A path visits each interior cell at most once.
  reach = grid.flood_fill(
    grid.to_rows(cells == players[:, None], rows, cols),
    grid.to_rows(free, rows, cols),
    (rows - 2) * (cols - 2) - 1,
  )
  reach = grid.to_cells(reach, cols)
  pull = jnp.clip(targets[..., None] + deltas, 0, size - 1)  # [K, B, 4]
  beyond = jnp.clip(targets[..., None] + 2 * deltas, 0, size - 1)
  line = floor[pull] & floor[beyond]
  every_target = jnp.all(jnp.any(line, axis=-1), axis=-1)
  take = jax.vmap(lambda m, i: m[i])
  first_pull = jnp.any(take(reach, pull) & take(free, beyond), axis=(1, 2))
  enough = jnp.sum(floor) > num_boxes + 1
  return enough & every_target & first_pull


def _direction_tables() -> tuple[np.ndarray, np.ndarray]:
  """For a 4-bit set of open directions: its size, and its k-th member."""
  popcount = np.asarray([bin(m).count("1") for m in range(16)], np.int32)
  kth = np.zeros((16, 4), np.int32)
  for m in range(16):
    members = [d for d in range(4) if m >> d & 1]
    for k, d in enumerate(members):
      kth[m, k] = d
  return popcount, kth


_POPCOUNT, _KTH_DIRECTION = _direction_tables()


def _reverse_play(
  key: jax.Array,
  walls: jax.Array,
  player: jax.Array,
  targets: jax.Array,
  cols: int,
  num_walkers: int,
  depth: int,
):
  """Best-scoring reverse-play state over ``num_walkers`` random walks.

  Returns:
    score int32 [], player int32 [], boxes int32 [num_boxes] (flat cells,
    box i started on target i).
  """
  size = walls.shape[0]
  # Cells fit in int16 (rooms are at most 32 x 32), halving the memory the
  # walkers stream through.
  i16 = jnp.int16
  deltas = np.asarray([dr * cols + dc for dr, dc in constants.MOVES])
  neighbours = np.clip(np.arange(size)[:, None] + deltas, 0, size - 1)
  open_dirs = jnp.sum(
    (~walls[neighbours]).astype(jnp.int32) << np.arange(4), axis=-1
  )  # [N] 4-bit sets
  deltas = jnp.asarray(deltas, i16)
  targets = targets.astype(i16)
  # Two 16-bit choices from each 32-bit word halve the Threefry work.
  words = jax.random.bits(key, ((depth + 1) // 2, num_walkers))
  halves = jnp.concatenate([words & 0xFFFF, words >> 16])[:depth]

  def body(carry, step_bits):
    p, boxes, last, swaps, best = carry
    new_p, boxes, last, swaps = _pull_step(
      p, boxes, last, swaps, step_bits, open_dirs, deltas
    )
    score = _score(boxes, new_p, swaps, targets, cols)
    b_score, b_p, b_boxes = best
    better = score > b_score
    best = (
      jnp.where(better, score, b_score),
      jnp.where(better, new_p, b_p),
      jnp.where(better[:, None], boxes, b_boxes),
    )
    return (new_p, boxes, last, swaps, best), None

  p0 = jnp.broadcast_to(player.astype(i16), (num_walkers,))
  boxes0 = jnp.broadcast_to(targets, (num_walkers, targets.shape[0]))
  zeros = jnp.zeros((num_walkers,), jnp.int32)
  init = (p0, boxes0, zeros - 1, zeros, (zeros, p0, boxes0))
  (*_, (score, best_p, best_boxes)), _ = jax.lax.scan(body, init, halves)
  w = jnp.argmax(score)
  return score[w], best_p[w].astype(jnp.int32), best_boxes[w].astype(jnp.int32)


def _pull_step(p, boxes, last, swaps, step_bits, open_dirs, deltas):
  """One reverse-play move of every walker: a random open direction (from
  ``step_bits``); moving away from an adjacent box pulls it into the
  vacated cell. Returns the walkers' cells, boxes, the box each last
  pulled and how many times the pulled box changed."""
  blocked = sum(
    jnp.any(boxes == (p + deltas[d])[:, None], axis=-1).astype(jnp.int32) << d
    for d in range(4)
  )
  feasible = open_dirs[p] & ~blocked
  count = jnp.asarray(_POPCOUNT)[feasible]
  pick = (step_bits % jnp.maximum(count, 1).astype(jnp.uint32)).astype(
    jnp.int32
  )
  delta = deltas[jnp.asarray(_KTH_DIRECTION)[feasible, pick]]
  moved = count > 0
  new_p = jnp.where(moved, p + delta, p)
  pulled = moved[:, None] & (boxes == (p - delta)[:, None])
  boxes = jnp.where(pulled, p[:, None], boxes)
  any_pull = jnp.any(pulled, axis=-1)
  which = jnp.argmax(pulled, axis=-1).astype(jnp.int32)
  swaps = swaps + (any_pull & (which != last))
  last = jnp.where(any_pull, which, last)
  return new_p, boxes, last, swaps


def _score(boxes, player, swaps, targets, cols: int) -> jax.Array:
  """Each walker's score ``[W]``: box swaps times the boxes' total
  displacement from their targets, 0 while a target is covered (by a box
  or the player)."""
  t_row, t_col = targets // cols, targets % cols
  displacement = jnp.sum(
    jnp.abs(boxes // cols - t_row) + jnp.abs(boxes % cols - t_col),
    axis=-1,
    dtype=jnp.int32,
  )
  targets_empty = ~jnp.any(
    boxes[:, :, None] == targets[None, None, :], axis=(1, 2)
  ) & ~jnp.any(player[:, None] == targets[None, :], axis=-1)
  return jnp.where(targets_empty, swaps * displacement, 0)


def _random_player_walk(
  key: jax.Array,
  walls: jax.Array,
  boxes: jax.Array,
  player: jax.Array,
  displacement: jax.Array,
  cols: int,
) -> jax.Array:
  """RAGEN's 1-3 random player steps onto fresh free cells."""
  deltas = jnp.asarray([dr * cols + dc for dr, dc in constants.MOVES])
  u = jax.random.uniform(key, (1 + _MAX_PLAYER_WALK * 5,))
  move_prob = jnp.where(displacement == 1, 0.8, 0.5)
  active = u[0] < move_prob
  visited = jnp.full((_MAX_PLAYER_WALK + 1,), player)
  size = walls.shape[0]
  for i in range(_MAX_PLAYER_WALK):
    noise, cont = u[1 + 5 * i : 5 + 5 * i], u[5 + 5 * i]
    nbr = jnp.clip(player + deltas, 0, size - 1)
    fresh = (
      ~walls[nbr] & ~boxes[nbr] & ~jnp.any(nbr[:, None] == visited, axis=-1)
    )
    choice = jnp.argmax(jnp.where(fresh, noise, -1.0))
    step = active & jnp.any(fresh)
    player = jnp.where(step, nbr[choice], player)
    visited = visited.at[i + 1].set(player)
    # Stop when stuck, or with probability 0.5 after each step.
    active = step & (cont <= 0.5)
  return player


def _retry(step, key):
  """Draws ``step(key)`` until its last output says it succeeded.

  The body is traced once: the loop starts from a placeholder marked as
  failed. Under vmap a while_loop runs until its slowest lane is done, so
  each retried step is kept as cheap as possible.
  """
  shapes = jax.eval_shape(step, key)
  placeholder = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

  def body(carry):
    key, _ = carry
    key, sub = jax.random.split(key)
    return key, step(sub)

  return jax.lax.while_loop(lambda c: ~c[1][-1], body, (key, placeholder))[1]


@functools.partial(
  jax.jit,
  static_argnames=("rows", "cols", "num_boxes", "search_depth", "num_walkers"),
)
def generate(
  key: jax.Array,
  *,
  rows: int,
  cols: int,
  num_boxes: int,
  search_depth: int,
  num_walkers: int,
) -> Level:
  """One solvable level; ``vmap`` over keys for a batch.

  Args:
    key: the level's PRNG key; the same key gives the same level.
    rows, cols: room size, border walls included.
    num_boxes: boxes (and targets) in the room.
    search_depth: reverse moves per walker, the difficulty knob.
    num_walkers: independent reverse-play walks per attempt.

  Returns:
    The level, boxes displaced from their targets.
  """
  walk_steps = int(1.7 * (rows + cols))

  def candidate(key):
    k_room, k_place = jax.random.split(key)
    floor = _topology(k_room, rows, cols, walk_steps)
    players, targets = _place(k_place, floor, num_boxes, _PLACEMENTS)
    ok = _can_start(floor, players, targets, rows, cols, num_boxes)
    first = jnp.argmax(ok)
    return floor, players[first], targets[first], ok[first]

  def attempt(key):
    k_room, k_play, k_walk = jax.random.split(key, 3)
    floor, player, targets, _ = _retry(candidate, k_room)
    walls = ~floor
    score, player, box_cells = _reverse_play(
      k_play, walls, player, targets, cols, num_walkers, search_depth
    )
    boxes = jnp.zeros_like(floor).at[box_cells].set(True)
    target_mask = jnp.zeros_like(floor).at[targets].set(True)
    displacement = jnp.sum(
      jnp.abs(box_cells // cols - targets // cols)
      + jnp.abs(box_cells % cols - targets % cols)
    )
    player = _random_player_walk(
      k_walk, walls, boxes, player, displacement, cols
    )
    return Level(walls, target_mask, boxes, player, displacement), score > 0

  # The prechecks make a failed search rare (never, with one box).
  return _retry(attempt, key)[0]
