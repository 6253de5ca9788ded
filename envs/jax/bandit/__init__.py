"""Bandit: pick the arm whose name suggests the higher expected reward."""

from envs.jax.bandit.env import Bandit, State

__all__ = ["Bandit", "State"]
