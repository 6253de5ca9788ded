"""Orbax checkpoints of the train state: save, find the latest, restore.

Checkpoints are written atomically (a checkpoint directory appears only
once complete), so a run killed mid-save resumes from the previous one.
"""

from __future__ import annotations

from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from starpo_jax.step import TrainState


def _to_saveable(state: TrainState) -> dict[str, Any]:
  pure = lambda s: None if s is None else nnx.to_pure_dict(s)
  return {
    "step": state.step,
    "policy": pure(state.policy),
    "policy_opt": state.policy_opt,
    "critic": pure(state.critic),
    "critic_opt": state.critic_opt,
    "reference": pure(state.reference),
    "key": jax.random.key_data(state.key),
    "nonfinite": state.nonfinite,
  }


def _from_saveable(saved: dict[str, Any], like: TrainState) -> TrainState:
  def state_of(pure, template):
    if template is None:
      return None
    nnx.replace_by_pure_dict(template, pure)
    return template

  return TrainState(
    step=saved["step"],
    policy=state_of(saved["policy"], like.policy),
    policy_opt=saved["policy_opt"],
    critic=state_of(saved["critic"], like.critic),
    critic_opt=saved["critic_opt"],
    reference=state_of(saved["reference"], like.reference),
    key=jax.random.wrap_key_data(saved["key"]),
    nonfinite=saved["nonfinite"],
  )


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
