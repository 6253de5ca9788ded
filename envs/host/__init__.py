"""Environments that are Python programs: an object per episode, stepped on
the host between the compiled rollout's turns (``envs.batch`` steps a batch
of them in one host call).

  observation = env.reset(seed)                       # str
  observation, reward, done, info = env.step(answer)  # str, float, bool, dict

``answer`` is one action name (an environment with ``action_names``: the
rollout plays a reply's ``<answer>A || B</answer>`` one name at a time) or
the whole answer text (free-text answers). ``info`` may say ``success``,
``truncated`` (the episode ran out of steps rather than ended),
``valid`` (the action was available) and ``effective`` (it changed the
state); missing keys read False, False, True, True.

A Python environment is registered as a function returning its
``HostSpec``: how to build one episode's object, its instructions, its
action names and its limits. Faults end an episode, never the run: a
``reset`` or ``step`` that raises, returns the wrong types, or takes longer
than ``timeout_s`` ends its episode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax


class HostEnv(Protocol):
  """One episode of a Python environment."""

  def reset(self, seed: int, level: Any = None) -> str: ...

  def step(self, answer: str) -> tuple[str, float, bool, dict[str, Any]]: ...


@dataclasses.dataclass(frozen=True)
class HostSpec:
  """A Python environment as the rollout sees it.

  Attributes:
    name: registry name.
    make: builds one episode's environment object (called once per batch
      slot, and again for a slot whose object failed).
    instructions: the task description shown in the system prompt.
    action_names: the names an answer is made of; empty for free text.
    pieces: strings observations are made of (a compact tokenizer learns
      them as tokens; any other text still encodes byte by byte).
    legend: (symbol, meaning) pairs the system prompt explains.
    max_obs_tokens: an observation's budget in tokens; longer ones are cut
      (and counted). The turn's prompt holds that many, so a loose budget
      costs compute on every turn.
    max_obs_pieces: where an observation is made of at most this many of
      ``pieces`` (a grid's cells and newlines), its budget is fixed when
      the tokenizer is bound: this many times the longest piece in
      tokens, in place of ``max_obs_tokens``.
    max_steps: actions (or answers) after which an episode is truncated.
    timeout_s: the longest one episode's reset or turn may take.
    levels: optionally, a jittable function from a reset key to a dict of
      arrays describing a level (e.g. a jittable environment's generator):
      the compiled step draws each episode's level with it and ``reset``
      receives it as ``level`` (a dict of NumPy arrays), so a Python
      environment can play the very levels a jittable one does.
    tools: tools (``envs.tools``) the agent may call before it answers.
  """

  name: str
  make: Callable[[], HostEnv]
  instructions: str
  action_names: tuple[str, ...] = ()
  pieces: tuple[str, ...] = ()
  legend: tuple[tuple[str, str], ...] = ()
  max_obs_tokens: int = 128
  max_obs_pieces: int = 0
  max_steps: int = 100
  timeout_s: float = 10.0
  levels: Callable[[jax.Array], dict[str, jax.Array]] | None = None
  tools: tuple[str, ...] = ()

  def __post_init__(self) -> None:
    if self.max_obs_tokens < 1:
      raise ValueError(
        f"{self.name}: max_obs_tokens={self.max_obs_tokens} must be >= 1"
      )
    if self.max_obs_pieces < 0 or (self.max_obs_pieces and not self.pieces):
      raise ValueError(
        f"{self.name}: max_obs_pieces={self.max_obs_pieces} needs pieces "
        "to count (and must be >= 0)"
      )
    if not self.timeout_s > 0:
      raise ValueError(f"{self.name}: timeout_s={self.timeout_s} must be > 0")
