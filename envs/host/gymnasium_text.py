"""Any gymnasium environment that speaks text, as a Python environment
(``envs.host``): ``--config.env.name=gymnasium --config.env.kwargs.id=ID``.

The agent reads the observation when it is text (a ``spaces.Text``
observation), else what ``render()`` returns (make the environment with
``render_mode="ansi"``: FrozenLake, Taxi, CliffWalking; ANSI colour codes
included, they are how those mark the player). Its answer is one of
``actions`` (comma-separated names for a ``Discrete`` action space, in
order) or, with no names, free text (a ``spaces.Text`` action space).
Success is ``info["success"]`` where the environment sets it, else
``terminated`` with a positive reward. Other keyword arguments go to
``gymnasium.make``:

  envs.make("gymnasium", id="FrozenLake-v1", actions="Left,Down,Right,Up",
            render_mode="ansi", is_slippery=False)
"""

from __future__ import annotations

import functools
from typing import Any

from envs import tools as tools_lib
from envs.host import HostSpec


class GymnasiumText:
  """One episode of a gymnasium environment (``envs.host.HostEnv``)."""

  def __init__(
    self, env_id: str, actions: tuple[str, ...], kwargs: dict[str, Any]
  ):
    import gymnasium

    self.env = gymnasium.make(env_id, **kwargs)
    self.actions = {name.lower(): i for i, name in enumerate(actions)}
    self.id = env_id

  def _text(self, observation: Any) -> str:
    if isinstance(observation, str):
      return observation
    text = self.env.render()
    if not isinstance(text, str):
      raise TypeError(
        f"{self.id}: its observation is {type(observation).__name__} and "
        f"render() returns {type(text).__name__}; make it with "
        "render_mode='ansi' or give it a Text observation space"
      )
    return text

  def reset(self, seed: int, level: Any = None) -> str:
    observation, _ = self.env.reset(seed=seed)
    return self._text(observation)

  def step(self, answer: str) -> tuple[str, float, bool, dict[str, Any]]:
    action = self.actions[answer.lower()] if self.actions else answer
    observation, reward, terminated, truncated, info = self.env.step(action)
    success = info.get("success", terminated and reward > 0)
    return (
      self._text(observation),
      float(reward),
      bool(terminated or truncated),
      {
        "success": bool(success),
        "truncated": bool(truncated and not terminated),
      },
    )


def gymnasium_text(
  id: str = "",
  actions: str = "",
  instructions: str = "",
  max_obs_tokens: int = 128,
  max_steps: int = 0,
  timeout_s: float = 10.0,
  tools: str = "",
  **kwargs: Any,
) -> HostSpec:
  """A gymnasium environment as a Python environment.

  Args:
    id: the gymnasium id (``FrozenLake-v1``, or one you registered).
    actions: comma-separated action names for a ``Discrete`` action space,
      in its order; empty: free-text answers (a ``Text`` action space).
    instructions: the task description for the system prompt; empty: "You
      are playing ID."
    max_obs_tokens: an observation's budget in tokens.
    max_steps: actions after which an episode is truncated; 0: the
      environment's own limit (``max_episode_steps``), else 100.
    timeout_s: the longest a reset or turn may take.
    tools: tools the agent may call before it answers (``envs.tools``).
    **kwargs: for ``gymnasium.make`` (``render_mode="ansi"``, ...).

  Raises:
    ValueError: an unknown id, names that do not fit the action space, or
      an action space that needs names.
  """
  import gymnasium

  if not id:
    raise ValueError(
      "gymnasium: set id to a gymnasium environment id "
      "(--config.env.kwargs.id=FrozenLake-v1)"
    )
  try:
    probe = gymnasium.make(id, **kwargs)
  except gymnasium.error.Error as e:
    raise ValueError(f"gymnasium: {e}") from None
  names = _action_names(id, probe.action_space, actions)
  limit = max_steps or (probe.spec.max_episode_steps if probe.spec else 0)
  probe.close()
  return HostSpec(
    name="gymnasium",
    make=functools.partial(GymnasiumText, id, names, kwargs),
    instructions=instructions or f"You are playing {id}.",
    action_names=names,
    max_obs_tokens=max_obs_tokens,
    max_steps=limit or 100,
    timeout_s=timeout_s,
    tools=tools_lib.names(tools),
  )


def _action_names(id: str, space: Any, actions: str) -> tuple[str, ...]:
  """``actions`` split into names, checked against the action space: a
  ``Discrete`` space's actions in order, or none for a ``Text`` space.

  Raises:
    ValueError: names that do not fit the space, or a space that needs
      them.
  """
  from gymnasium import spaces

  names = tuple(a.strip() for a in actions.split(",") if a.strip())
  if names:
    if not isinstance(space, spaces.Discrete) or space.n != len(names):
      raise ValueError(
        f"gymnasium: {id}'s action space is {space}; actions={actions!r} "
        "names a Discrete space's actions in order, one name each"
      )
  elif not isinstance(space, spaces.Text):
    raise ValueError(
      f"gymnasium: {id}'s action space is {space}, not Text: name its "
      "actions (actions='Left,Down,Right,Up')"
    )
  return names
