"""Sudoku on a 4x4 board (SPA's), as a pure, jittable text environment."""

from envs.jax.sudoku.env import State, Sudoku4x4

__all__ = ["State", "Sudoku4x4"]
