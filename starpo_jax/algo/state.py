"""What training holds: the ``TrainState`` (parameters, optimizer states,
step, key) and the ``Learner`` (the models' definitions and optimizers),
and the split of a policy into what trains and what stays frozen (LoRA:
the adapters train, the base weights are the reference).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct


@struct.dataclass
class TrainState:
  step: jax.Array  # [] int32
  policy: Any  # nnx.State of the policy's parameters
  policy_opt: Any
  critic: Any  # nnx.State, or None without a critic
  critic_opt: Any
  reference: Any  # nnx.State of the frozen reference, or None
  key: jax.Array
  nonfinite: jax.Array  # [] int32 consecutive steps with a skipped update


@dataclasses.dataclass(frozen=True)
class Learner:
  """The models' graph definitions and their optimizers (static)."""

  policy_def: Any
  policy_tx: optax.GradientTransformation
  critic_def: Any = None  # None without a critic
  critic_tx: optax.GradientTransformation | None = None
  # Whether the policy trains only its LoRA adapters (models/lora.py) over
  # frozen weights, which are then also the reference.
  adapters: bool = False
  # Whether the critic is adapters and a value head on the policy's frozen
  # weights (its state holds only ``CRITIC_OWN``), not a model of its own.
  critic_shares_base: bool = False


# What a critic that shares the policy's frozen weights holds of its own.
CRITIC_OWN = nnx.Any(
  nnx.LoRAParam, nnx.PathContains("value_w"), nnx.PathContains("value_b")
)


def trainable(learner: Learner, params: Any) -> tuple[Any, Any]:
  """The policy's state split into what the optimizer updates and what
  stays frozen: (adapters, weights) with adapters, else (all, None)."""
  if not learner.adapters:
    return params, None
  return params.split(nnx.LoRAParam, ...)


def joined(part: Any, frozen: Any) -> Any:
  """``trainable``'s two parts as the policy's state again."""
  return part if frozen is None else nnx.merge_state(part, frozen)


def critic_base(learner: Learner, policy: Any) -> Any:
  """The frozen weights the critic runs on beside its own state: the
  policy's, when it shares them, else None."""
  return trainable(learner, policy)[1] if learner.critic_shares_base else None


def frozen_base(params: Any) -> Any:
  """An adapted policy's state with its adapters at zero: the frozen
  weights' model, exactly (B = 0 adds nothing), without a copy of them."""
  adapters, weights = params.split(nnx.LoRAParam, ...)
  return nnx.merge_state(jax.tree.map(jnp.zeros_like, adapters), weights)
