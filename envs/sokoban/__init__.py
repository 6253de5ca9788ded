"""Sokoban: push every box onto a target."""

from envs.sokoban.env import Sokoban, State
from envs.sokoban.solver import solve

__all__ = ["Sokoban", "State", "solve"]
