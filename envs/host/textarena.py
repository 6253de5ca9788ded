"""TextArena's single-player games (the ``textarena`` package) as Python
environments (``envs.host``): ``--config.env.name=textarena
--config.env.kwargs.game=FrozenLake-v0``.

Each episode is the game TextArena registers under ``game``, made without
TextArena's observation and action wrappers (its ``-raw`` id), so its own
rules decide everything. The agent reads the game's messages since its
last turn (the first turn: the game's prompt and board; later turns: what
its move did and the board), and its answer goes to the game in the form
TextArena's players write, ``action_format`` (``"[{}]"``: ``[up]``). The
game's reward comes when it ends (TextArena rewards a single-player win
with 1, which is success here), and its own invalid-move rule stands: a
first invalid move is answered with a message (``valid`` false), the
next ends the game.

TextArena games draw from Python's global ``random``; each episode keeps
its own stream (saved and restored around its calls, one episode at a
time across the bridge's threads), so episodes stepped side by side play as
each would alone from its seed.

  envs.make("textarena", game="FrozenLake-v0", actions="up,down,left,right")
"""

from __future__ import annotations

import difflib
import functools
import random
import re
import threading
from typing import Any

from envs import tools as tools_lib
from envs.host import HostSpec

# The bridge steps episodes in threads: one at a time holds the global
# stream.
_STREAM = threading.Lock()


class TextArenaGame:
  """One episode of a TextArena single-player game
  (``envs.host.HostEnv``)."""

  def __init__(self, game: str, action_format: str, kwargs: dict[str, Any]):
    import textarena

    self.env = textarena.make(f"{game}-raw", **kwargs)
    self.action_format = action_format
    self.stream: Any = None

  def _own_stream(self, fn, *args: Any) -> Any:
    """``fn(*args)`` with this episode's ``random`` state, the caller's
    put back after."""
    with _STREAM:
      outer = random.getstate()
      if self.stream is not None:
        random.setstate(self.stream)
      try:
        return fn(*args)
      finally:
        self.stream = random.getstate()
        random.setstate(outer)

  def _observation(self) -> str:
    _, messages = self.env.get_observation()
    return "\n".join(message for _, message, _ in messages).strip()

  def reset(self, seed: int, level: Any = None) -> str:
    self.stream = None
    self._own_stream(lambda: self.env.reset(num_players=1, seed=seed))
    return self._observation()

  def step(self, answer: str) -> tuple[str, float, bool, dict[str, Any]]:
    action = self.action_format.format(answer)
    done, _ = self._own_stream(lambda: self.env.step(action=action))
    state = self.env.state
    reward, info = 0.0, {"valid": state.error_count == 0}
    if done:
      rewards, game_info = self.env.close()
      reward = float(rewards[0])
      info["success"] = reward >= 1.0
      info["valid"] = not game_info[0].get("invalid_move", False)
    return self._observation(), reward, bool(done), info


def textarena_game(
  game: str = "",
  actions: str = "",
  action_format: str = "[{}]",
  instructions: str = "",
  max_obs_tokens: int = 512,
  max_steps: int = 100,
  timeout_s: float = 10.0,
  tools: str = "",
  **kwargs: Any,
) -> HostSpec:
  """A TextArena single-player game as a Python environment.

  Args:
    game: its TextArena id (``FrozenLake-v0``, ``Sokoban-v0``,
      ``TowerOfHanoi-v0``, ``GuessTheNumber-v0``, ...).
    actions: comma-separated action names (the answer is one of them, one
      per action); empty: the answer's text is the action.
    action_format: how an answer becomes the game's action (``{}`` is the
      answer).
    instructions: the system prompt's task; empty: "You are playing GAME."
      (the game's own prompt opens the first observation).
    max_obs_tokens: an observation's budget in tokens.
    max_steps: actions after which an episode is truncated (the game's own
      turn limit may end it sooner).
    timeout_s: the longest a reset or turn may take.
    tools: tools the agent may call before it answers (``envs.tools``).
    **kwargs: the game's own arguments (``num_holes=3``, ...).

  Raises:
    ValueError: no game, an unknown or two-player game, a game whose data
      is not here, or an ``action_format`` without ``{}``.
  """
  _check(game, action_format, kwargs)
  names = tuple(a.strip() for a in actions.split(",") if a.strip())
  return HostSpec(
    name="textarena",
    make=functools.partial(TextArenaGame, game, action_format, kwargs),
    instructions=instructions or f"You are playing {game}.",
    action_names=names,
    max_obs_tokens=max_obs_tokens,
    max_steps=max_steps,
    timeout_s=timeout_s,
    tools=tools_lib.names(tools),
  )


def _check(game: str, action_format: str, kwargs: dict[str, Any]) -> None:
  """Raises ValueError for no game, an unknown or two-player one, or an
  ``action_format`` without ``{}``."""
  import textarena
  from textarena.envs.registration import ENV_REGISTRY

  if not game:
    raise ValueError(
      "textarena: set game to a TextArena id "
      "(--config.env.kwargs.game=FrozenLake-v0)"
    )
  if f"{game}-raw" not in ENV_REGISTRY:
    ids = sorted(i for i in ENV_REGISTRY if not i.endswith("-raw"))
    close = difflib.get_close_matches(game, ids, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"textarena: unknown game {game!r}{hint}")
  if "{}" not in action_format:
    raise ValueError(
      f"textarena: action_format={action_format!r} needs {{}} where the "
      "answer goes"
    )
  try:
    textarena.make(f"{game}-raw", **kwargs).reset(num_players=1, seed=0)
  except LookupError as e:
    # nltk's corpora: TextArena's word games download them as they load.
    found = re.search(r"Resource\W+(\w+)", str(e))
    data = f"nltk's {found.group(1)!r}" if found else "its data"
    raise ValueError(
      f"textarena: {game} needs {data}, which it downloads as it loads and "
      "is not on this machine: install it with nltk.download where there is "
      "a network, or pick another game"
    ) from None
  except AssertionError as e:
    raise ValueError(
      f"textarena: {game} is not a single-player game ({e})"
    ) from None
