"""Context windows (RAGEN's ``context_window_mode``) in plain Python: which
tokens of an episode each token sees, and the prompt a turn is re-rendered
as, cut from the episode by its replies alone (a turn runs from the end of
the previous reply to the end of its own): references for
``rollout.context_window`` and ``rollout.context_method``.
"""

from __future__ import annotations

import numpy as np


def turns_by_replies(generated: np.ndarray, system: int) -> np.ndarray:
  """Each token's turn from which tokens were generated (``[L]`` bool):
  the system prompt's ``system`` tokens -1, then turn i from the end of
  reply i - 1 to the end of reply i; -1 after the last reply."""
  generated = np.asarray(generated, bool)
  ends = [
    i + 1
    for i in range(len(generated) - 1)
    if generated[i] and not generated[i + 1]
  ]
  out = np.full(len(generated), -1)
  for i, (start, end) in enumerate(
    zip([system, *ends[:-1]], ends, strict=True)
  ):
    out[start:end] = i
  return out


def visible(turns: np.ndarray, window: int) -> np.ndarray:
  """``[L, L]`` bool: token i sees token j (causal; the system prompt and
  the last ``window`` turns, its own included; 0: all)."""
  seen = np.tri(len(turns), dtype=bool)
  if window:
    q, k = turns[:, None], turns[None, :]
    seen &= (k < 0) | (k > q - window)
  return seen


def rendered(turns: np.ndarray, turn: int, window: int) -> np.ndarray:
  """The places of the prompt turn ``turn`` is re-rendered as, through its
  reply: the system prompt, then the last ``window`` turns (0: all) in
  order."""
  oldest = turn - window + 1 if window else 0
  shown = (turns < 0) | ((turns >= oldest) & (turns <= turn))
  places = np.flatnonzero(shown)
  return places[places <= np.flatnonzero(turns == turn)[-1]]
