"""FrozenLake: cross the ice to the goal without falling into a hole."""

from envs.jax.frozen_lake.env import FrozenLake, State

__all__ = ["FrozenLake", "State"]
