"""The device mesh and shardings, from the config.

The mesh has axes ``('data', 'fsdp', 'tensor')`` (``config.mesh.shape``, one
``-1`` filling the rest). Parameters carry logical axis names
(``models/logical.py``) and ``config.logical_axis_rules`` maps those to mesh
axes: FSDP shards over ``fsdp``, tensor parallelism over ``tensor``. The
episode batch is sharded over ``data`` x ``fsdp``. A dimension a mesh axis
does not divide stays replicated, so any model runs on any mesh.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXES = ("data", "fsdp", "tensor")
BATCH = ("data", "fsdp")

Rules = Sequence[tuple[str, Any]]


def mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Resolves one ``-1`` in ``shape``; checks it uses every device.

  Raises:
    ValueError: naming ``config.mesh.shape``.
  """
  shape = tuple(int(d) for d in shape)
  if len(shape) != len(AXES):
    raise ValueError(
      f"config.mesh.shape={shape} must have {len(AXES)} entries {AXES}"
    )
  if shape.count(-1) > 1 or any(d == 0 or d < -1 for d in shape):
    raise ValueError(
      f"config.mesh.shape={shape}: positive sizes and at most one -1"
    )
  known = math.prod(d for d in shape if d != -1)
  if -1 in shape:
    if num_devices % known:
      raise ValueError(
        f"config.mesh.shape={shape} does not divide {num_devices} devices"
      )
    shape = tuple(num_devices // known if d == -1 else d for d in shape)
  if math.prod(shape) != num_devices:
    raise ValueError(
      f"config.mesh.shape={shape} needs {math.prod(shape)} devices; "
      f"there are {num_devices}"
    )
  return shape


def make_mesh(
  shape: Sequence[int], devices: Sequence[Any] | None = None
) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(shape, len(devices))
  return Mesh(np.asarray(devices).reshape(shape), AXES)


def spec(
  names: Sequence[str | None],
  shape: Sequence[int],
  mesh: Mesh,
  rules: Rules,
) -> PartitionSpec:
  """Logical axis names of an array -> its ``PartitionSpec`` on ``mesh``.

  Each name maps through the first matching rule. A mesh axis is used once
  per array, and only where it divides the dimension.
  """
  table = dict(rules)
  used: set[str] = set()
  out = []
  for name, dim in zip(names, shape, strict=True):
    target = table.get(name) if name is not None else None
    axes = (target,) if isinstance(target, str) else tuple(target or ())
    axes = tuple(a for a in axes if a not in used and mesh.shape[a] > 1)
    size = math.prod(mesh.shape[a] for a in axes)
    if not axes or dim % size:
      out.append(None)
      continue
    used.update(axes)
    out.append(axes[0] if len(axes) == 1 else axes)
  return PartitionSpec(*out)


def state_shardings(abstract: nnx.State, mesh: Mesh, rules: Rules) -> Any:
  """``NamedSharding`` for every array of an (abstract) ``nnx.State``, in
  the state's own structure."""

  def one(leaf, logical):
    names = tuple(logical) if isinstance(logical, PartitionSpec) else ()
    if len(names) != len(leaf.shape):
      names = (None,) * len(leaf.shape)
    return NamedSharding(mesh, spec(names, leaf.shape, mesh, rules))

  return jax.tree.map(one, abstract, nnx.get_partition_spec(abstract))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def batch_constraint(mesh: Mesh | None, batch: int):
  """``constrain(tree)``: shards every leaf whose leading axis is the
  episode batch over ``data`` x ``fsdp`` (a no-op without a mesh)."""
  if mesh is None:
    return lambda tree: tree
  size = math.prod(mesh.shape[a] for a in BATCH)

  def leaf(x):
    if not hasattr(x, "shape") or not x.shape or x.shape[0] != batch:
      return x
    if batch % size or jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      return x
    rest = (None,) * (len(x.shape) - 1)
    return jax.lax.with_sharding_constraint(
      x, NamedSharding(mesh, PartitionSpec(BATCH, *rest))
    )

  return lambda tree: jax.tree.map(leaf, tree)


def bytes_per_device(tree: Any) -> int:
  """Bytes one device holds of a tree of sharded arrays (or abstract
  arrays with shardings)."""
  total = 0
  for x in jax.tree.leaves(tree):
    sharding = getattr(x, "sharding", None)
    shape = sharding.shard_shape(x.shape) if sharding is not None else x.shape
    total += math.prod(shape) * np.dtype(x.dtype).itemsize
  return total


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Host values (the same on every process) -> arrays replicated over
  ``mesh``, on one host or many."""
  target = replicated(mesh)

  def leaf(x):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, target, lambda i: x[i])

  return jax.tree.map(leaf, tree)


def local_value(x: jax.Array) -> np.ndarray:
  """The value of a replicated array, read from this host's first copy (a
  multi-host array cannot be fetched whole)."""
  return np.asarray(x.addressable_data(0))


def traced_for(mesh: Mesh | None, fn: Callable[..., Any]) -> Callable[..., Any]:
  """``fn``, traced for ``mesh`` (call the result inside ``jax.jit``).

  Code that asks which mesh it runs on (``jax.sharding.get_abstract_mesh``)
  sees this one: the attention kernels take their platform from it (so a
  step compiled for a TPU topology on a CPU host picks TPU kernels) and run
  per device in ``shard_map`` over its axes. Without a mesh, ``fn``.
  """
  if mesh is None:
    return fn

  @functools.wraps(fn)
  def traced(*args: Any, **kwargs: Any) -> Any:
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return fn(*args, **kwargs)

  return traced
