"""A decoder's architecture and numerics as frozen dataclasses
(``ModelConfig``, with ``LoraConfig`` for adapters), and their checks.
``presets.py`` names the shapes of known checkpoints; ``transformer.py``
builds the model a config describes."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax

from starpo_jax import settings
from starpo_jax.models import attention, lora


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Low-rank adapters on each layer's projections (``lora.py``), the
  config's ``model.lora`` section: ``rank > 0`` trains only low-rank
  adapters on the projections ``targets`` names (a regular expression
  over a layer's modules: ``attn`` is q, k, v, o; ``mlp`` is gate, up,
  down), the weights frozen and serving as the reference policy (adapters
  off). ``rank=0``: no adapters (``ModelConfig.lora`` is then None)."""

  rank: int = 0
  alpha: float = 16.0  # adapters scale by alpha / rank
  targets: str = "attn|mlp"
  # The critic, where used: its own adapters and value head on the policy's
  # frozen weights ("adapters": no second model, nor its moments), or a
  # whole model of its own, trained whole ("full").
  critic: Literal["adapters", "full"] = "adapters"
  # QLoRA: the targeted weights stored quantized (qwix), in tiles of
  # tile_size along the contracted axis (0: one scale per output channel);
  # "": not quantized.
  quantize: Literal["", "int8", "int4", "nf4"] = ""
  tile_size: int = 0

  def __post_init__(self) -> None:
    settings.check(self, "model.lora")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Rotary frequency scaling, as in Hugging Face's ``rope_scaling``.

  ``kind`` is ``"linear"`` (positions divided by ``factor``) or ``"llama3"``
  (Llama 3.1+ wavelength-dependent scaling).
  """

  kind: str
  factor: float
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shapes and numerics of a decoder.

  ``dtype`` is the compute dtype, ``param_dtype`` the storage dtype.
  """

  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  family: str = "qwen2"  # "qwen2" or "llama": the Hugging Face architecture
  qkv_bias: bool = False
  tie_embeddings: bool = False
  rope_theta: float = 10_000.0
  rope_scaling: RopeScaling | None = None
  rms_norm_eps: float = 1e-6
  max_position_embeddings: int = 32_768
  value_head: bool = False
  # What the backward pass recomputes instead of storing (REMAT_POLICIES):
  # "none" stores every intermediate of every layer; "full" stores only
  # each layer's input and recomputes the layer (about a third more
  # compute); "dots" also keeps the layer's projections (matmul outputs)
  # and recomputes only the elementwise work and attention.
  remat: str = "none"
  # The training attention kernel (attention.IMPLEMENTATIONS); "auto" picks
  # the platform's fused one.
  attention: str = "auto"
  dtype: str = "float32"
  param_dtype: str = "float32"
  bos_token_id: int | None = None
  eos_token_id: int | None = None
  # Trainable low-rank adapters over frozen weights (``lora.py``); None:
  # none.
  lora: LoraConfig | None = None

  def replace(self, **kwargs: Any) -> ModelConfig:
    return dataclasses.replace(self, **kwargs)

  def num_params(self) -> int:
    """Parameter count (the value head excluded)."""
    d, h, kv, hd = (
      self.hidden_size,
      self.num_heads,
      self.num_kv_heads,
      (self.head_dim),
    )
    attn = d * hd * (h + 2 * kv) + h * hd * d
    if self.qkv_bias:
      attn += hd * (h + 2 * kv)
    layer = attn + 3 * d * self.intermediate_size + 2 * d
    embed = self.vocab_size * d * (1 if self.tie_embeddings else 2)
    return self.num_layers * layer + embed + d


FAMILIES = ("qwen2", "llama")
DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = {
  "none": None,
  "full": jax.checkpoint_policies.nothing_saveable,
  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def validate(cfg: ModelConfig) -> ModelConfig:
  """Checks a config's consistency; raises ValueError naming the field."""
  positive = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
  )
  for name in positive:
    value = getattr(cfg, name)
    if not isinstance(value, int) or value < 1:
      raise ValueError(f"model: {name} must be a positive integer, got {value}")
  if cfg.num_heads % cfg.num_kv_heads:
    raise ValueError(
      f"model: num_heads={cfg.num_heads} is not a multiple of "
      f"num_kv_heads={cfg.num_kv_heads}"
    )
  if cfg.head_dim % 2:
    raise ValueError(f"model: head_dim={cfg.head_dim} must be even for RoPE")
  if cfg.family not in FAMILIES:
    raise ValueError(
      f"model: family={cfg.family!r}; expected one of {FAMILIES}"
    )
  for name in ("dtype", "param_dtype"):
    if getattr(cfg, name) not in DTYPES:
      raise ValueError(
        f"model: {name}={getattr(cfg, name)!r}; expected one of {DTYPES}"
      )
  if cfg.remat not in REMAT_POLICIES:
    raise ValueError(
      f"model: remat={cfg.remat!r}; expected one of {tuple(REMAT_POLICIES)}"
    )
  if cfg.attention not in attention.IMPLEMENTATIONS:
    raise ValueError(
      f"model: attention={cfg.attention!r}; expected one of "
      f"{attention.IMPLEMENTATIONS}"
    )
  if cfg.rope_scaling is not None and cfg.rope_scaling.kind not in (
    "linear",
    "llama3",
  ):
    raise ValueError(
      f"model: rope_scaling kind {cfg.rope_scaling.kind!r} is not supported; "
      "expected 'linear' or 'llama3'"
    )
  if cfg.lora is not None:
    lora.validate(cfg)
  return cfg
