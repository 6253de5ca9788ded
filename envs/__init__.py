"""Pure JAX text environments; nothing here imports ``starpo_jax``.

``make(name, **kwargs)`` builds one by name; see ``envs.core`` for the
interface every environment implements.
"""

from __future__ import annotations

from typing import Any

from envs.bandit import Bandit
from envs.core import Answer, Env, EnvSpec, TimeStep, check_kwargs, to_text
from envs.countdown import Countdown
from envs.frozen_lake import FrozenLake
from envs.gym_sokoban import gym_sokoban
from envs.gymnasium_text import gymnasium_text
from envs.host import HostEnv, HostEnvironment, HostSpec
from envs.jumanji_text import GAMES, JumanjiText
from envs.qa import QA
from envs.sokoban import Sokoban
from envs.sudoku import Sudoku4x4

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
  # (envs/host.py).
  "gym_sokoban": (gym_sokoban, {}),
  # Any gymnasium environment that speaks text (envs/gymnasium_text.py).
  "gymnasium": (gymnasium_text, {}),
  # Jumanji's puzzles as text environments (envs/jumanji_text.py).
  **{game: (JumanjiText, {"game": game}) for game in GAMES},
}


def make(name: str, **kwargs: Any) -> Env:
  """Builds a registered environment; kwargs override its preset.

  Raises:
    ValueError: for an unknown name or argument, or a bad setting.
  """
  if name not in REGISTRY:
    raise ValueError(
      f"unknown environment {name!r}; registered: {sorted(REGISTRY)}"
    )
  cls, preset = REGISTRY[name]
  check_kwargs(name, cls, kwargs)
  return cls(**{**preset, **kwargs})


__all__ = [
  "REGISTRY",
  "Answer",
  "Env",
  "EnvSpec",
  "HostEnv",
  "HostEnvironment",
  "HostSpec",
  "TimeStep",
  "make",
  "to_text",
]
