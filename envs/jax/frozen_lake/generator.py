"""FrozenLake maps inside ``jit``, as RAGEN's ``generate_random_map``.

Each cell is frozen with probability ``p``, else a hole; the start and the
goal are two distinct uniformly random cells; a map is kept only if a flood
fill from the start reaches the goal without crossing a hole, otherwise it
is drawn again.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from envs.jax import grid

# Maps drawn side by side per attempt. Under vmap a retry loop runs until its
# slowest lane succeeds, so several candidates per attempt keep the number
# of rounds near one even with a few percent of unsolvable draws.
_CANDIDATES = 8


@struct.dataclass
class Map:
  holes: jax.Array  # [N] bool, N = size * size, row-major
  start: jax.Array  # [] int32 flat cell
  goal: jax.Array  # [] int32 flat cell


def _candidates(key: jax.Array, size: int, p: float):
  n = size * size
  u = jax.random.uniform(key, (_CANDIDATES, n + 2))
  cells = jnp.arange(n)
  start = (u[:, n] * n).astype(jnp.int32)
  goal = (u[:, n + 1] * n).astype(jnp.int32)
  is_end = (cells == start[:, None]) | (cells == goal[:, None])
  holes = (u[:, :n] >= p) & ~is_end
  reach = grid.flood_fill(
    grid.to_rows(cells == start[:, None], size, size),
    grid.to_rows(~holes, size, size),
    n - 1,
  )
  reached = jnp.take_along_axis(
    grid.to_cells(reach, size), goal[:, None], axis=1
  )[:, 0]
  ok = (start != goal) & reached
  first = jnp.argmax(ok)
  return Map(holes[first], start[first], goal[first]), ok[first]


@functools.partial(jax.jit, static_argnames=("size", "p"))
def generate(key: jax.Array, *, size: int, p: float) -> Map:
  """A solvable ``size`` x ``size`` map; ``vmap`` over keys for a batch."""
  shapes = jax.eval_shape(lambda k: _candidates(k, size, p), key)
  placeholder = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

  def body(carry):
    key, _ = carry
    key, sub = jax.random.split(key)
    return key, _candidates(sub, size, p)

  _, (level, _) = jax.lax.while_loop(
    lambda c: ~c[1][1], body, (key, placeholder)
  )
  return level
