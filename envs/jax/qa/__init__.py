"""Question answering over a dataset loaded with tensorflow-datasets."""

from envs.jax.qa.env import QA

__all__ = ["QA"]
