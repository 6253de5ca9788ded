"""Text environments for agents; nothing here imports ``starpo_jax``.

Two kinds, one protocol:

* ``envs.jax``: jittable environments, pure functions of one episode's
  pytree state (``envs.core.Env``), stepped inside the compiled rollout
  under ``vmap``.
* ``envs.host``: Python programs, an object per episode
  (``envs.host.HostSpec``), stepped on the host in one call per turn.

``make(name, **kwargs)`` builds a registered environment of either kind;
``batched(env)`` adapts it to ``envs.batch.BatchEnv``, the one interface
the rollout, the warm start and the evaluator use. ``envs.tools`` holds
the tools an agent may call before it answers.
"""

from __future__ import annotations

import difflib
from typing import Any

from envs.batch import BatchEnv, Turn, batched
from envs.core import Answer, Env, EnvSpec, TimeStep, check_kwargs, to_text
from envs.host import HostEnv, HostSpec
from envs.host.gym_sokoban import gym_sokoban
from envs.host.gymnasium_text import gymnasium_text
from envs.host.textarena import textarena_game
from envs.jax.bandit import Bandit
from envs.jax.countdown import Countdown
from envs.jax.frozen_lake import FrozenLake
from envs.jax.jumanji_text import GAMES, JumanjiText
from envs.jax.qa import QA
from envs.jax.sokoban import Sokoban
from envs.jax.sudoku import Sudoku4x4

# name -> (class, preset keyword arguments). RAGEN's LargerSokoban is an 8x8
# room with two boxes.
REGISTRY: dict[str, tuple[Any, dict[str, Any]]] = {
  "sokoban": (Sokoban, {}),
  "sokoban_larger": (Sokoban, {"dim_room": (8, 8), "num_boxes": 2}),
  "frozen_lake": (FrozenLake, {}),
  "bandit": (Bandit, {}),
  "countdown": (Countdown, {}),
  # SPA's 4x4 Sudoku (Jumanji's 9x9 is "sudoku" below).
  "sudoku_4x4": (Sudoku4x4, {}),
  # Questions from a dataset read through tensorflow-datasets (envs/qa).
  "qa": (QA, {}),
  # RAGEN's Sokoban, the gym-sokoban package, stepped on the host
  # (envs/host/gym_sokoban.py).
  "gym_sokoban": (gym_sokoban, {}),
  # Any gymnasium environment that speaks text (envs/host/gymnasium_text.py).
  "gymnasium": (gymnasium_text, {}),
  # TextArena's single-player games (envs/host/textarena.py).
  "textarena": (textarena_game, {}),
  # Jumanji's puzzles as text environments (envs/jax/jumanji_text.py).
  **{game: (JumanjiText, {"game": game}) for game in GAMES},
}


def make(name: str, **kwargs: Any) -> Env | HostSpec:
  """Builds a registered environment; kwargs override its preset.

  Raises:
    ValueError: for an unknown name or argument, or a bad setting.
  """
  if name not in REGISTRY:
    close = difflib.get_close_matches(name, list(REGISTRY), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(
      f"unknown environment {name!r}{hint}; registered: {sorted(REGISTRY)}"
    )
  cls, preset = REGISTRY[name]
  check_kwargs(name, cls, kwargs)
  return cls(**{**preset, **kwargs})


__all__ = [
  "REGISTRY",
  "Answer",
  "BatchEnv",
  "Env",
  "EnvSpec",
  "HostEnv",
  "HostSpec",
  "TimeStep",
  "Turn",
  "batched",
  "make",
  "to_text",
]
