"""The QA environment's rules in plain Python (RAGEN's MetaMathQA, with
trimmed answers compared exactly): a reference for ``envs.jax.qa``."""

from __future__ import annotations

import re

# The last "The answer is:" (greedy ``.*`` before it), else the last "####".
_MARKERS = (
  re.compile(r".*The answer is:(.*)", re.DOTALL),
  re.compile(r".*####(.*)", re.DOTALL),
)


def label(text: str) -> str:
  """The answer a dataset's answer text gives."""
  for marker in _MARKERS:
    if m := marker.fullmatch(text):
      return m.group(1).strip()
  return text.strip()


def rewards(answers: list[bytes], text: str, turns: int) -> list[float]:
  """Rewards of an episode's answers, in order, until one is right or
  ``turns`` are given: ``1/2**k`` for a right answer after ``k`` wrong.
  Right means equal after trimming ASCII whitespace and ASCII case folding
  (``bytes.strip``, ``bytes.lower``)."""
  want = label(text).encode().lower()
  out = []
  for k, answer in enumerate(answers[:turns]):
    right = answer.strip().lower() == want
    out.append(0.5**k if right else 0.0)
    if right:
      break
  return out
