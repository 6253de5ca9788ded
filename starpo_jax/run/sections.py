"""The run's own config sections: ``env``, ``model`` (with ``model.lora``),
``optim``, ``train`` and ``mesh``. The step's sections live beside the
code that reads them (``rollout``: ``agent/rollout.py``; ``algo``:
``algo/config.py``; ``filter``, ``sft``, ``diagnostics``; ``train.early_stop``:
``run/stopping.py``). ``SECTIONS`` names them all; ``configs/common.py``
takes every default from them, ``assembly.build`` checks a config through
them (``starpo_jax/settings.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from starpo_jax import settings
from starpo_jax.agent.rollout import RolloutConfig
from starpo_jax.algo.config import AlgoConfig
from starpo_jax.algo.diagnostics import DiagnosticsConfig
from starpo_jax.algo.filtering import FilterConfig
from starpo_jax.algo.sft import SftConfig
from starpo_jax.run import metrics
from starpo_jax.run.stopping import StopConfig

Dtype = Literal["float32", "bfloat16"]


@dataclasses.dataclass(frozen=True)
class EnvConfig:
  """The environment trained on and evaluated on."""

  name: str = "sokoban"  # a name envs.make knows
  kwargs: dict = dataclasses.field(default_factory=dict)  # for envs.make
  # What evaluation changes (the bandit's held-out arm names, QA's split);
  # the training environment is then also evaluated.
  eval_kwargs: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self) -> None:
    settings.check(self, "env")


@dataclasses.dataclass(frozen=True)
class LoraSettings:
  """LoRA adapters (``models/lora.py``): ``rank > 0`` trains only low-rank
  adapters on each layer's projections named by ``targets`` (a regular
  expression over a layer's modules: "attn" is q, k, v, o; "mlp" is gate,
  up, down), the weights frozen and serving as the reference policy
  (adapters off)."""

  rank: int = 0
  alpha: float = 16.0  # adapters scale by alpha / rank
  targets: str = "attn|mlp"
  # The critic, where used: its own adapters and value head on the policy's
  # frozen weights ("adapters": no second model, nor its moments), or a
  # whole model of its own, trained whole ("full").
  critic: Literal["adapters", "full"] = "adapters"
  # QLoRA: the targeted weights stored quantized (qwix), in tiles of
  # tile_size along the contracted axis (0: per channel); "": not quantized.
  quantize: Literal["", "int8", "int4", "nf4"] = ""
  tile_size: int = 0

  def __post_init__(self) -> None:
    settings.check(self, "model.lora")


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  """The policy (and critic) model: a Hugging Face checkpoint, or a preset
  (``models/transformer.py``; "tiny" takes the shape below and trains on a
  CPU). Named apart from ``transformer.ModelConfig``, the architecture
  these settings resolve to."""

  preset: Literal[
    "tiny",
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen2.5-3b",
    "qwen2.5-7b",
    "llama-3.2-1b",
    "llama-3.2-3b",
    "smollm2-135m",
  ] = "tiny"
  # A Hugging Face directory or a GGUF file; empty: random weights, or for
  # a packaged preset (smollm2-135m) the file its package installed.
  ckpt: str = ""
  # A tokenizer.json directory; empty: the checkpoint's, or for "tiny" a
  # compact tokenizer of the environment's words.
  tokenizer: str = ""
  dtype: Dtype = "float32"  # activations
  param_dtype: Dtype = "float32"
  # What the backward pass recomputes instead of storing: nothing, matmul
  # outputs are kept ("dots"), or only each layer's input ("full").
  remat: Literal["none", "dots", "full"] = "none"
  # The training attention kernel: the platform's fused one ("auto"), the
  # CPU's query-block kernel, cuDNN (GPU, bfloat16), splash (TPU) or XLA's.
  attention: Literal["auto", "xla", "blockwise", "cudnn", "splash"] = "auto"
  lora: LoraSettings = dataclasses.field(default_factory=LoraSettings)
  # The tiny model's shape (preset "tiny" only).
  hidden_size: int = 128
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 32
  intermediate_size: int = 384

  def __post_init__(self) -> None:
    settings.check(self, "model")


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
    for name in ("lr", "critic_lr"):
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


# Every section of a config, by its key.
SECTIONS = {
  "env": EnvConfig,
  "model": ModelSettings,
  "rollout": RolloutConfig,
  "algo": AlgoConfig,
  "filter": FilterConfig,
  "sft": SftConfig,
  "diagnostics": DiagnosticsConfig,
  "optim": OptimConfig,
  "train": TrainConfig,
  "mesh": MeshConfig,
}
