"""The run's config as one typed, frozen ``RunConfig``: the run's own
sections (``env``, ``optim``, ``train``, ``mesh``) are here; the others
live beside the code that reads them (``model``: ``models/presets.py``,
with ``model.lora``: ``models/config.py``; ``rollout``:
``agent/rollout.py``; ``algo``: ``algo/config.py``; ``filter``, ``sft``,
``diagnostics``; ``train.early_stop``: ``run/stopping.py``).
``configs/common.py`` takes every default from them; ``assembly.parse``
turns a config file's ``ConfigDict`` into a ``RunConfig``
(``starpo_jax/settings.py`` checks each field).
"""

from __future__ import annotations

import dataclasses
import typing

from starpo_jax import settings
from starpo_jax.agent.rollout import RolloutConfig
from starpo_jax.algo.config import AlgoConfig
from starpo_jax.algo.diagnostics import DiagnosticsConfig
from starpo_jax.algo.filtering import FilterConfig
from starpo_jax.algo.sft import SftConfig
from starpo_jax.models.presets import ModelSettings
from starpo_jax.run import metrics
from starpo_jax.run.stopping import StopConfig


@dataclasses.dataclass(frozen=True)
class EnvConfig:
  """The environment trained on and evaluated on."""

  name: str = "sokoban"  # a name envs.make knows
  kwargs: dict = dataclasses.field(default_factory=dict)  # for envs.make
  # What evaluation changes (the bandit's held-out arm names, QA's split);
  # the training environment is then also evaluated.
  eval_kwargs: dict = dataclasses.field(default_factory=dict)
  # Further held-out environments by tag, each evaluated beside ``eval``
  # with its own random player (RAGEN's validation list; the ``variants=``
  # config argument applies ``presets.EVAL_VARIANTS``): a tag's settings
  # override the training environment's, or, with ``env``, name another
  # registered environment built from the rest alone.
  eval_variants: dict = dataclasses.field(default_factory=dict)
  # Several environments in one run (RAGEN's es_manager tags): tag ->
  # {"env": NAME, "groups": N, ...NAME's settings}, played in their tags'
  # order along the batch (a config's dict keeps its keys sorted;
  # ``agent/mixture.py``); rollout.env_groups is then the
  # sum of the groups, and each part is evaluated by its tag (``eval`` pools
  # them). Empty: the one environment ``name`` with ``kwargs``.
  mixture: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self) -> None:
    settings.check(self, "env")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW with gradient clipping and linear warmup, for the RL phase (the
  warm start has its own rate: ``sft.lr``)."""

  lr: float = 1e-6
  critic_lr: float = 1e-5
  b1: float = 0.9
  b2: float = 0.999
  weight_decay: float = 0.01
  grad_clip: float = 1.0  # the gradients' global norm at most this
  warmup_steps: int = 0

  def __post_init__(self) -> None:
    settings.check(self, "optim")
    settings.within(self, "optim", b1=(0, 1), b2=(0, 1), weight_decay=(0, None))
    for name in ("lr", "critic_lr", "grad_clip"):
      if getattr(self, name) <= 0:
        raise ValueError(f"optim: {name}={getattr(self, name)} must be > 0")
    if self.warmup_steps < 0:
      raise ValueError(f"optim: warmup_steps={self.warmup_steps} must be >= 0")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The loop: how long, what it logs, evaluates and saves."""

  steps: int = 200  # RL steps, after the warm start's sft.steps
  log_every: int = 1
  eval_every: int = 10  # <= 0: no evaluation
  # Held-out episodes per evaluation (RAGEN validates on 512); the 95%
  # interval of a success rate near 50% is then about +-4 points.
  eval_episodes: int = 512
  eval_temperatures: tuple[float, ...] = (0.5, 0.0)  # RAGEN's, and greedy
  checkpoint_every: int = 20
  keep_checkpoints: int = 3  # the latest; the warm start's last is kept too
  # Consecutive steps with a non-finite loss (their updates skipped) that
  # stop the run, keeping the last good checkpoint.
  max_nonfinite_steps: int = 3
  transcripts: bool = True  # one held-out episode as text per evaluation
  # Start from the policy of another run's latest checkpoint (its workdir),
  # e.g. a warm start, instead of a fresh model; ignored when resuming.
  init_from: str = ""
  # "START:STOP": a jax.profiler trace of those steps (as logged, STOP
  # excluded) in workdir/profile; empty: none.
  profile: str = ""
  # Early stopping (run/stopping.py), off unless early_stop.enabled.
  early_stop: StopConfig = dataclasses.field(default_factory=StopConfig)

  def __post_init__(self) -> None:
    settings.check(self, "train")
    for name in ("steps", "eval_episodes", "max_nonfinite_steps"):
      if getattr(self, name) < 0:
        raise ValueError(f"train: {name}={getattr(self, name)} must be >= 0")
    for name in ("log_every", "checkpoint_every", "keep_checkpoints"):
      if getattr(self, name) < 1:
        raise ValueError(f"train: {name}={getattr(self, name)} must be >= 1")
    metrics.profile_range(self.profile)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """The device mesh's axes (data, fsdp, tensor); -1 fills the rest."""

  shape: tuple[int, ...] = (-1, 1, 1)

  def __post_init__(self) -> None:
    settings.check(self, "mesh")


# Which mesh axis shards each logical axis of the parameters.
LOGICAL_AXIS_RULES = (
  ("layers", None),
  ("vocab", "tensor"),
  ("embed", "fsdp"),
  ("mlp", "tensor"),
  ("heads", "tensor"),
  ("kv", "tensor"),
  ("head_dim", None),
)


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """A whole run's settings, typed and frozen: what the code reads once
  the config file and its overrides are parsed (``assembly.parse``).
  ``presets`` names the presets the config file applied
  (``run/presets.py``): parsing says which of their settings an explicit
  one overrides."""

  seed: int = 0
  env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
  model: ModelSettings = dataclasses.field(default_factory=ModelSettings)
  rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
  algo: AlgoConfig = dataclasses.field(default_factory=AlgoConfig)
  filter: FilterConfig = dataclasses.field(default_factory=FilterConfig)
  sft: SftConfig = dataclasses.field(default_factory=SftConfig)
  diagnostics: DiagnosticsConfig = dataclasses.field(
    default_factory=DiagnosticsConfig
  )
  optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
  train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  logical_axis_rules: tuple[tuple[str | None, ...], ...] = LOGICAL_AXIS_RULES
  presets: tuple[str, ...] = ()

  def __post_init__(self) -> None:
    settings.check(self, "config")


# Every section of a config, by its key.
SECTIONS = {
  name: hint
  for name, hint in typing.get_type_hints(RunConfig).items()
  if dataclasses.is_dataclass(hint)
}
