"""One host call for a batch inside a compiled function: the whole batch
at once, or, on a mesh that shards the batch, one call per shard, run by
the process that holds it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback


def reset_seeds(keys: jax.Array) -> jax.Array:
  """The seeds ``[B]`` (int32) host environments reset with, from reset
  keys ``[B]``."""
  return jax.vmap(
    lambda k: jax.random.randint(k, (), 0, np.iinfo(np.int32).max)
  )(keys)


def host_call(
  fn: Callable[..., tuple[np.ndarray, ...]],
  outs: tuple[jax.ShapeDtypeStruct, ...],
  batch_dims: tuple[int, ...],
  batch_axes: tuple[str, ...],
  *args: Any,
) -> tuple[jax.Array, ...]:
  """``fn(offset, *args)`` on the host, args as NumPy: ONE call for the
  whole batch, or, traced for a mesh that shards the batch (axis 0 of
  every arg) over ``batch_axes``, one per shard (its rows are slots
  ``offset`` on), run by the process holding the shard. Devices that
  hold a copy of a shard (other mesh axes) skip the call and take the
  stepping device's result.
  ``batch_dims``: each output's batch axis."""
  mesh = jax.sharding.get_abstract_mesh()
  axes = tuple(
    a
    for a in batch_axes
    if not mesh.empty and a in mesh.axis_names and mesh.shape[a] > 1
  )
  shards = math.prod(mesh.shape[a] for a in axes)
  b = jax.tree.leaves(args)[0].shape[0]
  on_host = lambda offset, *x: fn(int(offset), *jax.tree.map(np.asarray, x))
  if shards == 1 or b % shards:
    return io_callback(lambda *x: on_host(0, *x), outs, *args)
  rows = b // shards
  local = tuple(
    jax.ShapeDtypeStruct((*s.shape[:d], rows, *s.shape[d + 1 :]), s.dtype)
    for s, d in zip(outs, batch_dims, strict=True)
  )
  copies = tuple(
    a for a in mesh.axis_names if a not in axes and mesh.shape[a] > 1
  )

  def one_shard(offset, lead, *x):
    if not lead:
      return tuple(np.zeros(s.shape, s.dtype) for s in local)
    return on_host(offset, *x)

  def body(*x):
    offset = jax.lax.axis_index(axes) * rows
    lead = jnp.ones((), bool)
    for a in copies:
      lead &= jax.lax.axis_index(a) == 0
    got = io_callback(one_shard, local, offset, lead, *x)
    return _shared(got, copies) if copies else got

  spec = jax.sharding.PartitionSpec(axes)
  return jax.shard_map(
    body,
    mesh=mesh,
    in_specs=jax.tree.map(lambda _: spec, args),
    out_specs=tuple(
      jax.sharding.PartitionSpec(*([None] * d), axes) for d in batch_dims
    ),
    check_vma=False,
  )(*args)


def _shared(got: tuple[jax.Array, ...], copies: tuple[str, ...]):
  """The stepping device's results on every copy of its shard (the others
  returned zeros): a sum over the copies' mesh axes."""
  return tuple(
    jax.lax.psum(g.astype(jnp.int32), copies).astype(g.dtype)
    if g.dtype == jnp.bool_
    else jax.lax.psum(g, copies)
    for g in got
  )
