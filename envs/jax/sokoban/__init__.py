"""Sokoban: push every box onto a target."""

from envs.jax.sokoban.env import Sokoban, State
from envs.jax.sokoban.solver import solve

__all__ = ["Sokoban", "State", "solve"]
