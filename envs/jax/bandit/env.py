"""A two-armed bandit whose arm names hint at their risk (RAGEN's Bandit)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from envs import core
from envs.jax import render
from envs.jax.bandit import constants

# What the pull paid, indexing the reward pieces.
_LOW, _HIGH_WIN, _HIGH_LOSS = range(3)


@struct.dataclass
class State:
  low: jax.Array  # [] int32 action id of the low-risk arm
  high: jax.Array  # [] int32 action id of the high-risk arm
  high_first: jax.Array  # [] bool, the order the arms are shown in
  pulled: jax.Array  # [] int32 action id pulled, -1 before the pull
  payout: jax.Array  # [] int32 one of _LOW, _HIGH_WIN, _HIGH_LOSS
  key: jax.Array  # PRNG key of the risky arm


class Bandit(core.TextEnv):
  """One turn, one pull: the low-risk arm pays ``low_risk_reward``; the
  high-risk arm pays ``high_risk_reward`` with probability
  ``high_risk_prob``, else 0. Success means the high-risk arm was pulled.
  """

  def __init__(
    self,
    split: str = "train",
    low_risk_reward: float = 0.1,
    high_risk_reward: float = 1.0,
    high_risk_prob: float = 0.25,
  ) -> None:
    """Validates the settings before anything compiles.

    Args:
      split: ``"train"`` or ``"test"``, the list arm-name pairs come from.
      low_risk_reward: the sure payout.
      high_risk_reward: the risky payout.
      high_risk_prob: probability of the risky payout.
    """
    _check(split, low_risk_reward, high_risk_reward, high_risk_prob)
    self.split = split
    self.rewards = (float(low_risk_reward), float(high_risk_reward), 0.0)
    self.high_risk_prob = float(high_risk_prob)
    offset = 0
    for name, pairs in constants.SPLITS.items():
      if name == split:
        break
      offset += 2 * len(pairs)
    pairs = constants.SPLITS[split]
    self._low_ids = jnp.asarray([offset + 2 * i for i in range(len(pairs))])
    table = render.PieceTable()
    c = constants
    self._name_ids = table.add_all(c.ACTIONS)
    (
      self._intro,
      self._and,
      self._rules,
      self._format,
      self._or,
      self._end,
      self._colon,
      self._points,
    ) = table.add_all(
      [c.INTRO, c.AND, c.RULES, c.FORMAT, c.OR, c.END, c.COLON, c.POINTS]
    )
    # RAGEN prints rewards with Python's str(float).
    self._reward_ids = table.add_all([str(r) for r in self.rewards])
    # An observation shows each arm name three times, " and " twice and
    # every other piece at most once.
    limits = [1] * len(table.pieces)
    limits[int(self._and)] = 2
    for i in self._name_ids:
      limits[int(i)] = 3
    self.spec = _spec(table, tuple(limits))

  def reset(self, key: jax.Array) -> tuple[State, core.TimeStep]:
    k_pair, k_order, k_dynamics = jax.random.split(key, 3)
    low = jax.random.choice(k_pair, self._low_ids)
    state = State(
      low=low,
      high=low + 1,
      high_first=jax.random.bernoulli(k_order),
      pulled=jnp.asarray(-1, jnp.int32),
      payout=jnp.asarray(_LOW, jnp.int32),
      key=k_dynamics,
    )
    return state, self._first_timestep(state)

  def _available(self, state: State, action: jax.Array) -> jax.Array:
    return (action == state.low) | (action == state.high)

  def _transition(self, state: State, action: jax.Array):
    key, sub = jax.random.split(state.key)
    win = jax.random.uniform(sub) < self.high_risk_prob
    payout = jnp.where(
      action == state.high, jnp.where(win, _HIGH_WIN, _HIGH_LOSS), _LOW
    )
    reward = jnp.asarray(self.rewards, jnp.float32)[payout]
    return state.replace(pulled=action, payout=payout, key=key), reward

  def _status(self, state: State) -> core.Status:
    pulled = state.pulled >= 0
    return core.Status(
      terminated=pulled,
      truncated=jnp.zeros((), bool),
      success=pulled & (state.pulled == state.high),
    )

  def _effective(self, old: State, new: State) -> jax.Array:
    return new.pulled >= 0

  def render(self, state: State) -> tuple[jax.Array, jax.Array]:
    names = jnp.asarray(self._name_ids)
    first = names[jnp.where(state.high_first, state.high, state.low)]
    second = names[jnp.where(state.high_first, state.low, state.high)]
    intro = jnp.stack(
      [
        self._intro,
        first,
        self._and,
        second,
        self._rules,
        first,
        self._and,
        second,
        self._format,
        first,
        self._or,
        second,
        self._end,
      ]
    ).astype(jnp.int32)
    result = jnp.stack(
      [
        names[jnp.maximum(state.pulled, 0)],
        self._colon,
        jnp.asarray(self._reward_ids)[state.payout],
        self._points,
      ]
    ).astype(jnp.int32)
    pulled = state.pulled >= 0
    pieces = jnp.where(
      pulled, jnp.pad(result, (0, intro.shape[0] - result.shape[0])), intro
    )
    return pieces, jnp.where(pulled, result.shape[0], intro.shape[0]).astype(
      jnp.int32
    )


def _check(split, low_risk_reward, high_risk_reward, high_risk_prob) -> None:
  """Raises ``ValueError`` naming a bad setting."""
  if split not in constants.SPLITS:
    raise ValueError(
      f"bandit: split={split!r}; expected one of {tuple(constants.SPLITS)}"
    )
  if not isinstance(high_risk_prob, (int, float)) or not (
    0.0 <= high_risk_prob <= 1.0
  ):
    raise ValueError(
      f"bandit: high_risk_prob must be in [0, 1], got {high_risk_prob!r}"
    )
  for name, value in (
    ("low_risk_reward", low_risk_reward),
    ("high_risk_reward", high_risk_reward),
  ):
    if not isinstance(value, (int, float)):
      raise ValueError(f"bandit: {name} must be a number, got {value!r}")


def _spec(table: render.PieceTable, limits: tuple[int, ...]) -> core.EnvSpec:
  """The bandit's spec: its pieces, arm names and observation bound."""
  return core.EnvSpec(
    name="bandit",
    pieces=table.pieces,
    action_names=constants.ACTIONS,
    instructions="",
    legend=(),
    list_actions=False,
    max_obs_pieces=13,
    max_steps=1,
    piece_limits=tuple(limits),
  )
