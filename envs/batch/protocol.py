"""The batched environment protocol (see ``envs.batch``)."""

from __future__ import annotations

from typing import Any, Protocol

import jax
from flax import struct

from envs.core import Env, EnvSpec


@struct.dataclass
class Turn:
  """What one turn of environment steps did, per episode ``[B]``
  (``executed [A, B]``: the actions played, -1 where none was).
  ``stepped``: the environment took at least one step (``success`` and
  ``terminated`` are then its last step's)."""

  states: Any
  used: jax.Array  # [B] int32 actions taken in the episode so far
  done: jax.Array  # [B] bool the episode ended this turn
  reward: jax.Array  # [B] float32 the turn's reward
  effective: jax.Array  # [B] bool some action changed the state
  stepped: jax.Array  # [B] bool
  success: jax.Array  # [B] bool
  terminated: jax.Array  # [B] bool
  unavailable: jax.Array  # [B] int32 actions not available where played
  executed: jax.Array  # [A, B] int32


class BatchEnv(Protocol):
  """A batch of episodes as the compiled rollout steps them."""

  @property
  def spec(self) -> EnvSpec: ...

  @property
  def jittable(self) -> Env | None:
    """The per-episode jittable environment, or None (a Python one)."""

  def bind(self, encode: Any, batch_axes: tuple[str, ...] = ()) -> BatchEnv: ...

  def reset(self, keys: jax.Array) -> Any: ...

  def render(self, states: Any) -> tuple[jax.Array, jax.Array]: ...

  def act(
    self,
    states: Any,
    actions: jax.Array,
    answer: Any,
    active: jax.Array,
    used: jax.Array,
    budget: int,
  ) -> Turn: ...

  def failed(self, states: Any) -> jax.Array:
    """[B] bool: a fault ended the episode (Python environments)."""

  def cut(self, states: Any) -> jax.Array:
    """[B] int32: observations cut to their token budget."""

  def random_success(
    self, states: Any, horizon: int, key: jax.Array
  ) -> jax.Array:
    """[B] bool: a random valid player's success from ``states``."""

  def errors(self) -> list[str | None]:
    """Each slot's last fault, host-side (empty: none can fail)."""
