"""Advantage estimators as plain loops over one episode's tokens, written
from their papers (GAE: Schulman et al. 2016; RAGEN's bi-level GAE; verl's
whitening), in NumPy."""

from __future__ import annotations

import numpy as np


def whiten(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """(x - mean) / std over the masked entries, unbiased variance (verl)."""
  vals = x[mask]
  return np.where(mask, (x - vals.mean()) / np.sqrt(vals.var(ddof=1) + 1e-8), 0)


def gae(rewards, values, mask, gamma: float, lam: float) -> np.ndarray:
  """Raw GAE advantages ``[B, L]`` over each row's masked tokens, in order
  (unmasked positions are skipped, not stepped through)."""
  out = np.zeros_like(rewards)
  for b in range(rewards.shape[0]):
    last, next_value = 0.0, 0.0
    for p in np.flatnonzero(mask[b])[::-1]:
      delta = rewards[b, p] + gamma * next_value - values[b, p]
      last = delta + gamma * lam * last
      out[b, p] = last
      next_value = values[b, p]
  return out


def bi_level_gae(
  rewards, values, mask, turn_end, gamma: float, lam: float, turn_gamma: float
) -> np.ndarray:
  """RAGEN's two loops: GAE over the turns' last tokens with
  ``turn_gamma``, whose returns become each turn's reward; then GAE over
  the tokens inside each turn with ``gamma``, restarting at turn ends."""
  out = np.zeros_like(rewards)
  for b in range(rewards.shape[0]):
    ends = np.flatnonzero(turn_end[b])
    turn_adv = np.zeros(rewards.shape[1])
    last = 0.0
    for i in range(len(ends) - 1, -1, -1):
      nxt = values[b, ends[i + 1]] if i + 1 < len(ends) else 0.0
      delta = rewards[b, ends[i]] + turn_gamma * nxt - values[b, ends[i]]
      last = delta + turn_gamma * lam * last
      turn_adv[ends[i]] = last
    reward = np.where(turn_end[b], turn_adv + values[b], 0.0)
    last, nxt = 0.0, 0.0
    for p in np.flatnonzero(mask[b])[::-1]:
      if turn_end[b, p]:
        last, nxt = 0.0, 0.0
      delta = reward[p] + gamma * nxt - values[b, p]
      last = delta + gamma * lam * last
      out[b, p] = last
      nxt = values[b, p]
  return out
