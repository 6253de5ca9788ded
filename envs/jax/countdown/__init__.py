"""Countdown: reach the target with the given numbers and + - * /."""

from envs.jax.countdown.env import Countdown, State

__all__ = ["Countdown", "State"]
