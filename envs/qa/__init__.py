"""Question answering over a dataset loaded with tensorflow-datasets."""

from envs.qa.env import QA

__all__ = ["QA"]
