"""The text-environment protocol: pure, jittable functions over pytrees.

Every environment is a Python object holding only static settings; its
methods are pure functions of pytree states, so they ``jit`` and ``vmap``:

  state, ts = env.reset(key)           # the level is a function of ``key``
  state, ts = env.step(state, action)  # action: int32 [] index into
                                       # ``env.spec.action_names``, or an
                                       # ``Answer`` (``spec.text_answers``)
  pieces, n = env.render(state)        # int32 [max_obs_pieces], int32 []

``render`` emits ids into the environment's own piece table
(``env.spec.pieces``); environments know nothing of tokenizers.

Every state carries ``key``, the RNG of its stochastic dynamics (slippery
ice, a risky arm). Episodes reset from one key play the same level with the
same dynamics; a rollout that wants group members to share a level but not
their luck replaces ``state.key`` after ``reset``.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class TimeStep:
  """What one environment step reports. All fields are scalars.

  ``terminated`` and ``truncated`` are kept apart: ``terminated`` means the
  episode reached a terminal state (solved, or fell in a hole), ``truncated``
  that its step budget ran out first. ``success`` means it ended by reaching
  the goal.
  """

  reward: jax.Array  # [] float32
  terminated: jax.Array  # [] bool
  truncated: jax.Array  # [] bool
  success: jax.Array  # [] bool
  valid: jax.Array  # [] bool: the action named an action available here
  effective: jax.Array  # [] bool: the action changed the state

  @property
  def done(self) -> jax.Array:
    return self.terminated | self.truncated

  @classmethod
  def first(cls) -> TimeStep:
    """What ``reset`` reports of an episode that cannot have ended yet."""
    false = jnp.zeros((), bool)
    return cls(
      reward=jnp.zeros((), jnp.float32),
      terminated=false,
      truncated=false,
      success=false,
      valid=jnp.ones((), bool),
      effective=false,
    )


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """Static description of an environment, read by prompts and codecs.

  Attributes:
    name: registry name.
    pieces: the text pieces ``render`` emits ids into.
    action_names: action id -> name; parsed answers are matched to these
      case-insensitively.
    instructions: the task description shown in the system prompt.
    legend: (symbol, meaning) pairs describing a grid observation; empty when
      the observation explains itself.
    list_actions: whether prompts list ``action_names`` (the bandit names its
      two arms in the observation instead, out of 40 possible names).
    max_obs_pieces: length of the array ``render`` returns.
    max_steps: actions after which an episode is truncated.
    piece_limits: optionally, the most times each piece appears in one
      observation (a tighter bound on its length in tokens).
    text_answers: the answer is free text (an expression, a number), not
      action names: ``step`` takes an ``Answer`` instead of an action id,
      and the environment has ``random_answer(state, key) -> Answer``, a
      well-formed answer that ignores what it is asked (the baseline a
      policy must beat); optionally ``solution(state)``, a correct answer
      as ids into ``answer_pieces`` (``-1`` after its end), which the warm
      start imitates.
    answer_pieces: for a text-answer environment, the strings answers are
      made of (a vocabulary restricted to answers allows them). For one
      with action names, the parts its names are spelled from: a compact
      vocabulary then has a token per part rather than one per name
      (Sudoku's ``r2c3=4`` is ``r2c3=`` then ``4``: the cell, then the
      digit given the cell).
    token_observations: ``render`` returns token ids of the run's
      tokenizer, not ids into ``pieces`` (a Python environment's text,
      tokenized on the host: ``envs.batch.host``).
    tools: names of the tools (``envs.tools``) the agent may call before
      it answers.
    tool_tokens: a tool result's budget in tokens; longer ones are cut (and
      counted with the observations cut).
  """

  name: str
  pieces: tuple[str, ...]
  action_names: tuple[str, ...]
  instructions: str
  legend: tuple[tuple[str, str], ...]
  list_actions: bool
  max_obs_pieces: int
  max_steps: int
  piece_limits: tuple[int, ...] | None = None
  text_answers: bool = False
  answer_pieces: tuple[str, ...] = ()
  token_observations: bool = False
  tools: tuple[str, ...] = ()
  tool_tokens: int = 32

  @property
  def num_actions(self) -> int:
    return len(self.action_names)


@struct.dataclass
class Answer:
  """A free-text answer: the bytes between ``<answer>`` and ``</answer>``
  (chat markers removed), as integers."""

  data: jax.Array  # [N] int32 bytes, 0 after `length`
  length: jax.Array  # [] int32


class Env(Protocol):
  """What the rollout needs of an environment."""

  spec: EnvSpec

  def reset(self, key: jax.Array) -> tuple[Any, TimeStep]: ...

  def step(
    self, state: Any, action: jax.typing.ArrayLike
  ) -> tuple[Any, TimeStep]: ...

  def render(self, state: Any) -> tuple[jax.Array, jax.Array]: ...


@struct.dataclass
class Status:
  terminated: jax.Array  # [] bool
  truncated: jax.Array  # [] bool
  success: jax.Array  # [] bool


class TextEnv(abc.ABC):
  """Shared step logic: invalid actions and finished episodes are no-ops.

  Subclasses define ``spec``, ``reset``, ``render`` and four pure hooks:
  ``_available(state, action)`` (is this in-range action legal now),
  ``_transition(state, action) -> (state, reward)`` for a legal action,
  ``_status(state) -> Status`` and ``_effective(old, new)``.
  """

  spec: EnvSpec

  def step(
    self, state: Any, action: jax.typing.ArrayLike
  ) -> tuple[Any, TimeStep]:
    action = jnp.asarray(action, jnp.int32)
    in_range = (action >= 0) & (action < self.spec.num_actions)
    safe_action = jnp.where(in_range, action, 0)
    valid = in_range & self._available(state, safe_action)
    before = self._status(state)
    act = valid & ~(before.terminated | before.truncated)
    moved, reward = self._transition(state, safe_action)
    new_state = jax.tree.map(lambda a, b: jnp.where(act, a, b), moved, state)
    after = self._status(new_state)
    ts = TimeStep(
      reward=jnp.where(act, reward, 0.0).astype(jnp.float32),
      terminated=after.terminated,
      truncated=after.truncated,
      success=after.success,
      valid=valid,
      effective=act & self._effective(state, new_state),
    )
    return new_state, ts

  def _first_timestep(self, state: Any) -> TimeStep:
    status = self._status(state)
    false = jnp.zeros((), bool)
    return TimeStep(
      reward=jnp.zeros((), jnp.float32),
      terminated=status.terminated,
      truncated=status.truncated,
      success=status.success,
      valid=jnp.ones((), bool),
      effective=false,
    )

  def _available(self, state: Any, action: jax.Array) -> jax.Array:
    del state, action
    return jnp.ones((), bool)

  @abc.abstractmethod
  def _transition(self, state: Any, action: jax.Array) -> tuple[Any, Any]:
    """The next state and reward of a legal action."""

  @abc.abstractmethod
  def _status(self, state: Any) -> Status:
    """Whether ``state`` is terminal, truncated, a success."""

  @abc.abstractmethod
  def _effective(self, old: Any, new: Any) -> jax.Array:
    """Whether a step from ``old`` to ``new`` changed anything that counts."""


def to_text(spec: EnvSpec, pieces: Any, n: Any) -> str:
  """Host-side: rendered piece ids -> the observation string."""
  return "".join(spec.pieces[int(i)] for i in list(pieces)[: int(n)])


def check_kwargs(name: str, cls: Any, kwargs: dict[str, Any]) -> None:
  """Rejects keyword arguments the constructor (a class, or a function
  that builds the environment) does not take, by name."""
  params = inspect.signature(
    cls.__init__ if isinstance(cls, type) else cls
  ).parameters
  if any(p.kind is p.VAR_KEYWORD for p in params.values()):
    return  # the constructor names what it does not take
  known = [p for p in params if p != "self"]
  for key in kwargs:
    if key not in known:
      raise ValueError(
        f"{name}: unknown argument {key!r}; expected one of {known}"
      )
