"""What the PyTorch baseline plays and how it samples: its ``Config``
(read off the JAX run's setup, so both sides run one workload), the
log-probabilities of sampled tokens under the sampling distribution, and
the ``Clock`` that times the loop's parts."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class Config:
  """The shape of a rollout and the update rule (``starpo_jax`` names)."""

  env_groups: int
  group_size: int
  max_turns: int
  max_new_tokens: int
  max_actions_per_turn: int = 2
  max_actions_per_traj: int = 10
  enable_think: bool = True
  temperature: float = 1.0
  format_penalty: float = -0.1
  clip_low: float = 0.2
  clip_high: float = 0.28
  dual_clip: float = 3.0
  entropy_coef: float = 0.001
  minibatches: int = 4
  lr: float = 1e-3
  b1: float = 0.9
  b2: float = 0.999
  weight_decay: float = 0.0
  grad_clip: float = 1.0
  # StarPO-S's filter (RAGEN V1): the fraction of groups with the largest
  # in-group reward std that the update trains on; 1.0: every group.
  keep_fraction: float = 1.0

  @property
  def batch(self) -> int:
    return self.env_groups * self.group_size

  @classmethod
  def from_setup(cls, setup: Any) -> Config:
    """The settings of a ``starpo_jax.assembly.Setup``."""
    r, a, o = setup.config.rollout, setup.config.algo, setup.config.optim
    f = setup.config.filter
    if not f.keeps_everything and (
      (f.metric, f.strategy, f.largest, f.include_zero, f.loss_scaling)
      != ("reward_std", "top_k", True, True, "none")
    ):
      raise ValueError(
        "the PyTorch baseline filters only as StarPO-S does: top_k of "
        "groups by reward std, largest first"
      )
    if a.adv_estimator != "grpo" or a.uses_reference or a.epochs != 1:
      raise ValueError(
        "the PyTorch baseline implements GRPO without KL, one epoch"
      )
    if a.loss_agg != "token-mean" or r.prompt != "ragen":
      raise ValueError(
        "the PyTorch baseline implements the token-mean loss and RAGEN's prompt"
      )
    return cls(
      env_groups=r.env_groups,
      group_size=r.group_size,
      max_turns=r.max_turns,
      max_new_tokens=r.max_new_tokens,
      max_actions_per_turn=r.max_actions_per_turn,
      max_actions_per_traj=r.max_actions_per_traj,
      enable_think=r.enable_think,
      temperature=r.temperature,
      format_penalty=r.format_penalty,
      clip_low=a.clip_low,
      clip_high=a.clip_high,
      dual_clip=a.dual_clip,
      entropy_coef=a.entropy_coef,
      minibatches=a.minibatches,
      lr=o.lr,
      b1=o.b1,
      b2=o.b2,
      weight_decay=o.weight_decay,
      grad_clip=o.grad_clip,
      keep_fraction=1.0 if f.keeps_everything else f.value,
    )


# ----------------------------------------------------------------------------
# Losses (the JAX versions live in starpo_jax/losses.py, advantages.py).


def token_logprobs(
  logits: torch.Tensor,
  tokens: torch.Tensor,
  temperature: float,
  allowed: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
  """Log-probability and entropy of ``tokens [...]`` under ``logits``."""
  logits = logits / (temperature or 1.0)
  if allowed is not None:
    logits = logits.masked_fill(~allowed, float("-inf"))
  logp_all = torch.log_softmax(logits, dim=-1)
  logp = logp_all.gather(-1, tokens[..., None])[..., 0]
  p = logp_all.exp()
  entropy = -(p * torch.where(p > 0, logp_all, 0.0)).sum(-1)
  return logp, entropy


class Clock:
  """Seconds spent in each named part of the loop, summed over calls:
  ``with clock("prefill"): ...``. PyTorch runs synchronously on a CPU, so
  a host timer is exact there; on a GPU each part waits for the device
  (``torch.cuda.synchronize``) when it ends."""

  def __init__(self, device: Any = "cpu"):
    self.seconds: dict[str, float] = collections.Counter()
    self._sync = (
      torch.cuda.synchronize
      if torch.device(device).type == "cuda"
      else lambda: None
    )

  @contextlib.contextmanager
  def __call__(self, part: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
      yield
    finally:
      self._sync()
      self.seconds[part] += time.perf_counter() - start
