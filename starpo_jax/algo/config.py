"""The algorithm's settings (``config.algo``): estimator, losses, clipping,
KL, minibatches, micro-batches, length buckets.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from starpo_jax import settings
from starpo_jax.algo import advantages as adv_lib
from starpo_jax.algo import losses


@dataclasses.dataclass(frozen=True)
class AlgoConfig:
  """The update rule (RAGEN / verl defaults where they have them)."""

  adv_estimator: Literal[
    "gae",
    "bi_level_gae",
    "grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
  ] = "gae"
  gamma: float = 1.0
  lam: float = 1.0
  turn_gamma: float = 0.95  # bi-level GAE's turn-level discount
  norm_adv_by_std: bool = True  # GRPO; False is Dr.GRPO
  use_turn_scores: bool = False
  clip_low: float = 0.2
  clip_high: float = 0.28
  dual_clip: float = 3.0
  entropy_coef: float = 0.001
  loss_agg: losses.Aggregation = "token-mean"
  kl_coef: float = 0.0
  kl_estimator: losses.KlEstimator = "k3"
  kl_in_reward: bool = False
  value_clip: float = 0.5
  epochs: int = 1
  minibatches: int = 4
  # Tokens a forward and backward pass may hold at once: each minibatch is
  # cut into as many micro-batches as that needs, their gradients summed
  # (the same update, less memory); scoring and the collapse diagnostics
  # run over rows in the same budget. 0: the whole minibatch at once.
  micro_batch_tokens: int = 0
  logits_chunk: int = 512  # sequence chunk for log-probabilities
  # Scoring and the update run at the shortest of this many static lengths
  # (evenly spaced up to rollout.max_context, multiples of 128) that holds
  # the longest kept episode; each length is one more compile of them. 1:
  # always max_context.
  length_buckets: int = 4
  # Passes over a batch (scoring, the update, the warm start) compute the
  # prompt a group's episodes share once per group (algo/prefix.py), each
  # episode's own tokens at the shortest of length_buckets suffix lengths
  # (+1) that holds them. "auto": for models of 10M parameters or more
  # (the tiny model's step measured level), wherever the attention kernel
  # takes a shared prefix (the CPU's, a float32 GPU's; not cuDNN's or
  # splash) and the whole context is seen; "on": at any size, refused
  # where it cannot; "off": every episode whole.
  share_prefix: Literal["auto", "on", "off"] = "auto"

  def __post_init__(self) -> None:
    settings.check(self, "algo")
    settings.within(
      self,
      "algo",
      gamma=(0, 1),
      lam=(0, 1),
      turn_gamma=(0, 1),
      clip_low=(0, 1),
      clip_high=(0, None),
      dual_clip=(1, None),
      entropy_coef=(0, None),
      kl_coef=(0, None),
      value_clip=(0, None),
    )
    for name in ("epochs", "minibatches", "logits_chunk", "length_buckets"):
      if getattr(self, name) < 1:
        raise ValueError(f"algo: {name} must be >= 1")
    if self.micro_batch_tokens < 0:
      raise ValueError("algo: micro_batch_tokens must be >= 0 (0: no limit)")

  @property
  def uses_critic(self) -> bool:
    return self.adv_estimator in adv_lib.NEEDS_CRITIC

  @property
  def uses_reference(self) -> bool:
    return self.kl_coef > 0
