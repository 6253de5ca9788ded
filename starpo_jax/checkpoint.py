"""Orbax checkpoints of the train state: save, find the latest, restore.

Checkpoints are written atomically (a checkpoint directory appears only
once complete), so a run killed mid-save resumes from the previous one.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from starpo_jax.step import TrainState


def _is_key(x: Any) -> bool:
  return hasattr(x, "dtype") and jax.dtypes.issubdtype(
    x.dtype, jax.dtypes.prng_key
  )


def _to_saveable(state: TrainState) -> dict[str, Any]:
  """Every field of the state as plain arrays: model states as pure
  dicts, PRNG keys as their data."""
  out = {}
  for field in dataclasses.fields(state):
    value = getattr(state, field.name)
    if isinstance(value, nnx.State):
      value = nnx.to_pure_dict(value)
    elif _is_key(value):
      value = jax.random.key_data(value)
    out[field.name] = value
  return out


def _from_saveable(saved: dict[str, Any], like: TrainState) -> TrainState:
  values = {}
  for field in dataclasses.fields(like):
    template, value = getattr(like, field.name), saved[field.name]
    if isinstance(template, nnx.State):
      nnx.replace_by_pure_dict(template, value)
      value = template
    elif _is_key(template):
      value = jax.random.wrap_key_data(value)
    values[field.name] = value
  return TrainState(**values)


class Checkpointer:
  def __init__(self, directory: str, keep: int) -> None:
    self.manager = ocp.CheckpointManager(
      directory,
      options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
    )

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: TrainState) -> None:
    self.manager.save(step, args=ocp.args.StandardSave(_to_saveable(state)))

  def restore(self, step: int, like: TrainState) -> TrainState:
    """Restores onto the structure, dtypes and shardings of ``like``."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _to_saveable(like))
    saved = self.manager.restore(step, args=ocp.args.StandardRestore(abstract))
    return _from_saveable(saved, like)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


def load_policy(
  directory: str, step: int | None = None
) -> tuple[int, dict[str, Any]]:
  """The policy parameters (a pure dict) of the checkpoint at ``step``
  (default: the latest) in ``directory`` (a run's workdir or its
  ``checkpoints`` folder), read without touching it.

  Raises:
    FileNotFoundError: no checkpoint there, or none at ``step`` (the
      message lists the steps there are).
  """
  for where in (os.path.join(directory, "checkpoints"), directory):
    if not os.path.isdir(where):
      continue
    manager = ocp.CheckpointManager(
      where, options=ocp.CheckpointManagerOptions(create=False)
    )
    steps = sorted(manager.all_steps())
    if not steps:
      manager.close()
      continue
    if step is not None and step not in steps:
      manager.close()
      raise FileNotFoundError(
        f"no checkpoint at step {step} in {where!r}; it has steps {steps}"
      )
    chosen = steps[-1] if step is None else step
    saved = manager.restore(chosen, args=ocp.args.StandardRestore())
    manager.close()
    return chosen, saved["policy"]
  raise FileNotFoundError(f"no checkpoint in {directory!r}")
