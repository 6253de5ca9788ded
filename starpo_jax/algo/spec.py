"""What one compiled step is made of besides its arguments (the train
state and the text tables): ``StepSpec``, static and closed over; and
``Distribution``, the distribution the policy samples from, which every
log-probability of the update must be taken under.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from starpo_jax.agent import mixture
from starpo_jax.agent.codec import Codec
from starpo_jax.agent.mixture import MixedCodec
from starpo_jax.agent.rollout import RolloutConfig
from starpo_jax.algo.config import AlgoConfig
from starpo_jax.algo.diagnostics import DiagnosticsConfig
from starpo_jax.algo.filtering import FilterConfig
from starpo_jax.algo.state import Learner
from starpo_jax.models.attention import TurnWindow


@dataclasses.dataclass(frozen=True)
class Distribution:
  """The policy's sampling distribution: logits divided by ``temperature``
  (0, greedy, counts as 1) over the ``allowed`` tokens (``[V]`` bool; None:
  all), each token seeing the last ``window`` turns (0: all;
  ``RolloutConfig.visible_turns``), re-rendered as prompts of at most
  ``width`` tokens where that is not 0 (``mixture.window_width``) over
  ``max_turns`` turns."""

  temperature: float
  allowed: jax.Array | None = None
  window: int = 0
  width: int = 0
  max_turns: int = 0

  @classmethod
  def of(cls, rollout: RolloutConfig, codec: Codec | MixedCodec):
    """How ``rollout`` samples with ``codec``'s allowed tokens."""
    return cls(
      rollout.temperature,
      codec.allowed,
      rollout.visible_turns,
      mixture.window_width(codec, rollout),
      rollout.max_turns,
    )

  def context(self, turns: jax.Array) -> TurnWindow | None:
    """What the tokens of episodes whose turns are ``turns [B, L]`` see
    (None: everything before them)."""
    if not self.window:
      return None
    return TurnWindow(turns, self.window, self.width, self.max_turns)


@dataclasses.dataclass(frozen=True)
class StepSpec:
  """The static pieces of the RL step: the environment it plays, how it
  plays (``rollout``), what it optimizes (``algo``), which groups it keeps
  (``filter``), the models' definitions and optimizers (``learner``), and
  the periodic diagnostics (None: none). ``env``: an environment
  ``envs.batched`` takes, or an ``agent.mixture.Mixture``."""

  env: Any
  rollout: RolloutConfig
  algo: AlgoConfig
  filter: FilterConfig
  learner: Learner
  diagnostics: DiagnosticsConfig | None = None

  def distribution(self, codec: Codec | MixedCodec) -> Distribution:
    """How the rollout samples with ``codec``'s allowed tokens."""
    return Distribution.of(self.rollout, codec)
