"""Early stopping: end a run whose training has collapsed, before it costs
the rest of its budget.

Three rules, all off unless ``config.train.early_stop.enabled`` is set (a
rule whose patience is 0 stays off then), each counted over RL steps only
(the warm start is imitation, whose reward is not the policy's):

- reward collapse (RAGEN's echo trap): the in-group reward standard
  deviation stays below ``reward_std_fraction`` of its mean over the first
  ``baseline_steps`` RL steps for ``reward_std_patience`` steps in a row.
  With no spread inside any group, group-relative advantages are zero and
  the filter keeps nothing useful: the policy has stopped exploring.
- failed validation: held-out success below ``min_success`` for
  ``success_patience`` evaluations in a row;
- nothing to train on: the filter keeps no episode for ``empty_patience``
  steps in a row.

The driver checks the rules after each RL step, logs and prints the reason
and writes a checkpoint of the step it stopped at. Counters live in this
process: a resumed run starts them afresh.
"""

from __future__ import annotations

import dataclasses

from starpo_jax import settings

# The per-step metrics the rules read (diagnostics.step_metrics).
REWARD_STD = "rollout/in_group_reward_std"
RELATIVE_STD = "rollout/in_group_reward_std_vs_early"
KEPT = "filter/kept_ratio"


@dataclasses.dataclass(frozen=True)
class StopConfig:
  """The rules' settings (the defaults are the issue's: 10% of the first
  10 steps' reward std for 10 steps, 1% success for 5 validations, 5 empty
  steps); ``enabled`` turns them on, a patience of 0 turns one rule off."""

  enabled: bool = False
  reward_std_fraction: float = 0.1
  baseline_steps: int = 10
  reward_std_patience: int = 10
  min_success: float = 0.01
  success_patience: int = 5
  empty_patience: int = 5

  def __post_init__(self) -> None:
    settings.check(self, "train.early_stop")
    settings.within(
      self, "train.early_stop", reward_std_fraction=(0, 1), min_success=(0, 1)
    )
    for name in (
      "baseline_steps",
      "reward_std_patience",
      "success_patience",
      "empty_patience",
    ):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 0:
        raise ValueError(
          f"train.early_stop: {name} must be an integer >= 0, got {value!r}"
        )
    if self.baseline_steps < 1:
      raise ValueError("train.early_stop: baseline_steps must be >= 1")


class EarlyStop:
  """Feeds on a run's metrics; says why to stop, or ``None``."""

  def __init__(self, cfg: StopConfig) -> None:
    self.cfg = cfg
    self._early_std: list[float] = []
    self._low_std = 0
    self._low_success = 0
    self._empty = 0

  def after_step(self, metrics: dict[str, float]) -> str | None:
    """One RL step's metrics. Once the first ``baseline_steps`` are in,
    adds ``rollout/in_group_reward_std_vs_early`` to ``metrics`` (the
    step's in-group reward std over their mean; logged whether or not the
    rules are on: the echo trap shows as it falling toward 0)."""
    c = self.cfg
    if REWARD_STD in metrics:
      std = metrics[REWARD_STD]
      if len(self._early_std) < c.baseline_steps:
        self._early_std.append(std)
      else:
        base = sum(self._early_std) / len(self._early_std)
        if base > 0:
          metrics[RELATIVE_STD] = std / base
    if not c.enabled:
      return None
    if c.reward_std_patience and len(self._early_std) == c.baseline_steps:
      low = metrics.get(RELATIVE_STD, 1.0) < c.reward_std_fraction
      self._low_std = self._low_std + 1 if low else 0
      if self._low_std >= c.reward_std_patience:
        base = sum(self._early_std) / len(self._early_std)
        return (
          f"in-group reward std {metrics[REWARD_STD]:.4g} has been below "
          f"{c.reward_std_fraction:g} x its mean over the first "
          f"{c.baseline_steps} RL steps ({base:.4g}) for "
          f"{self._low_std} steps in a row"
        )
    if c.empty_patience and KEPT in metrics:
      self._empty = self._empty + 1 if metrics[KEPT] == 0 else 0
      if self._empty >= c.empty_patience:
        return f"the filter kept no episode for {self._empty} steps in a row"
    return None

  def after_eval(self, success: float) -> str | None:
    """One held-out evaluation's success rate."""
    c = self.cfg
    if not (c.enabled and c.success_patience):
      return None
    self._low_success = self._low_success + 1 if success < c.min_success else 0
    if self._low_success >= c.success_patience:
      return (
        f"held-out success {success:.1%} has been below {c.min_success:.1%} "
        f"for {self._low_success} evaluations in a row"
      )
    return None
