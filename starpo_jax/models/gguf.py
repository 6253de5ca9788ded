"""GGUF checkpoints (llama.cpp's format): a Llama model, its byte-level
BPE tokenizer and its chat template in one file.

  model = gguf.load("SmolLM2-135M-Instruct.Q4_1.gguf")
  tok = gguf.tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf")

Read with ``gguf``, llama.cpp's own reader: each tensor is dequantized
(Q4_1, Q8_0, ... to float32) when a parameter is built from it, mapped to
its Hugging Face name and loaded as ``hf.load`` loads a directory. Two
things differ from a Hugging Face checkpoint: llama.cpp's converter
reorders the rows of each head of the query and key projections (its
rotary embedding pairs neighbouring features, Hugging Face's pairs the
two halves of a head), which ``_unpermute`` undoes; and the tokenizer is
metadata (tokens, merges, token types, the pre-tokenizer's name), which
``tokenizer`` builds into a ``tokenizers`` BPE.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from starpo_jax.models import config as model_config
from starpo_jax.models import hf
from starpo_jax.models import tokenizer as tokenizer_lib
from starpo_jax.models.config import ModelConfig
from starpo_jax.models.hf import CheckpointError
from starpo_jax.models.transformer import Transformer

# GGUF tensor names and the Hugging Face names they stand for.
_GLOBAL = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
}
_PER_LAYER = {
  "attn_norm.weight": "input_layernorm.weight",
  "ffn_norm.weight": "post_attention_layernorm.weight",
  "attn_q.weight": "self_attn.q_proj.weight",
  "attn_k.weight": "self_attn.k_proj.weight",
  "attn_v.weight": "self_attn.v_proj.weight",
  "attn_output.weight": "self_attn.o_proj.weight",
  "ffn_gate.weight": "mlp.gate_proj.weight",
  "ffn_up.weight": "mlp.up_proj.weight",
  "ffn_down.weight": "mlp.down_proj.weight",
}

# llama.cpp's pre-tokenizers (``tokenizer.ggml.pre``) as ``tokenizers``
# builds them. "smollm" (and the StarCoder family's) splits every digit
# apart before GPT-2's split; "gpt2" / "default" is GPT-2's split alone.
PRE_TOKENIZERS = {
  "smollm": lambda: pre_tokenizers.Sequence(
    [
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ]
  ),
  "gpt2": lambda: pre_tokenizers.ByteLevel(
    add_prefix_space=False, use_regex=True
  ),
  "default": lambda: pre_tokenizers.ByteLevel(
    add_prefix_space=False, use_regex=True
  ),
}
# ``tokenizer.ggml.token_type``: llama.cpp's special ("control") tokens,
# matched whole and never split, and tokens a user added (also whole).
CONTROL, USER_DEFINED = 3, 4


def is_gguf(path: str) -> bool:
  return path.endswith(".gguf")


class GGUFFile:
  """A GGUF file's metadata and tensors, checked when opened.

  As a tensor source for ``hf.load_tensors`` it answers for Hugging Face
  names: ``shape(name)`` and ``get(name)`` (dequantized float32, rows in
  Hugging Face's order).
  """

  def __init__(self, path: str) -> None:
    import gguf

    self.path = path
    if not os.path.isfile(path):
      raise CheckpointError(f"{path}: no such file")
    try:
      self._reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises what numpy and struct do
      raise CheckpointError(f"{path}: not a readable GGUF file: {e}") from None
    self._dequantize = gguf.quants.dequantize
    self._tensors = {t.name: t for t in self._reader.tensors}
    arch = self.value("general.architecture")
    if arch != "llama":
      raise CheckpointError(
        f"{path}: architecture {arch!r} is not supported (llama only)"
      )
    self._names = self._hf_names()

  def value(self, key: str, default: Any = ...) -> Any:
    """The metadata value at ``key``; without a default, a missing key is
    an error naming it."""
    field = self._reader.get_field(key)
    if field is None:
      if default is ...:
        raise CheckpointError(f"{self.path}: missing metadata {key}")
      return default
    return field.contents()

  def config(self) -> ModelConfig:
    """The model's architecture, from the ``llama.*`` metadata."""
    v = lambda key, *d: self.value(f"llama.{key}", *d)
    scaling = v("rope.scaling.type", "none")
    if scaling != "none":
      raise CheckpointError(
        f"{self.path}: rope scaling {scaling!r} is not supported"
      )
    heads, hidden = int(v("attention.head_count")), int(v("embedding_length"))
    head_dim = int(v("attention.key_length", hidden // heads))
    if int(v("rope.dimension_count", head_dim)) != head_dim:
      raise CheckpointError(
        f"{self.path}: llama.rope.dimension_count rotates part of a head; "
        "only whole heads are supported"
      )
    try:
      return model_config.validate(
        ModelConfig(
          vocab_size=self.shape("model.embed_tokens.weight")[0],
          hidden_size=hidden,
          num_layers=int(v("block_count")),
          num_heads=heads,
          num_kv_heads=int(v("attention.head_count_kv", heads)),
          head_dim=head_dim,
          intermediate_size=int(v("feed_forward_length")),
          family="llama",
          qkv_bias=False,
          tie_embeddings="output.weight" not in self._tensors,
          rope_theta=_decimal(v("rope.freq_base", 10_000.0)),
          rms_norm_eps=_decimal(v("attention.layer_norm_rms_epsilon")),
          max_position_embeddings=int(v("context_length")),
          bos_token_id=self.value("tokenizer.ggml.bos_token_id", None),
          eos_token_id=self.value("tokenizer.ggml.eos_token_id", None),
        )
      )
    except ValueError as e:
      raise CheckpointError(f"{self.path}: {e}") from None

  def tensors(self) -> dict[str, GGUFFile]:
    """Hugging Face name -> this file, for ``hf.load_tensors``."""
    return {name: self for name in self._names}

  def shape(self, name: str) -> tuple[int, ...]:
    if name not in self._names:
      raise CheckpointError(f"{self.path}: tensor {name} is missing")
    # GGUF lists dimensions innermost first.
    return tuple(
      int(n) for n in reversed(self._tensors[self._names[name]].shape)
    )

  def get(self, name: str) -> np.ndarray:
    t = self._tensors[self._names[name]]
    try:
      w = self._dequantize(t.data, t.tensor_type).reshape(self.shape(name))
    except NotImplementedError:
      raise CheckpointError(
        f"{self.path}: tensor {t.name} is quantized as "
        f"{t.tensor_type.name}, which gguf cannot dequantize"
      ) from None
    except ValueError as e:  # too few bytes for its shape
      raise CheckpointError(f"{self.path}: tensor {t.name}: {e}") from None
    heads = {
      "self_attn.q_proj.weight": "llama.attention.head_count",
      "self_attn.k_proj.weight": "llama.attention.head_count_kv",
    }
    for suffix, key in heads.items():
      if name.endswith(suffix):
        n = self.value(key, None) or self.value("llama.attention.head_count")
        return _unpermute(w, int(n))
    return w

  def _hf_names(self) -> dict[str, str]:
    out = {}
    for name in self._tensors:
      if name in _GLOBAL:
        out[_GLOBAL[name]] = name
        continue
      parts = name.split(".", 2)
      if (
        len(parts) == 3
        and parts[0] == "blk"
        and parts[1].isdigit()
        and parts[2] in _PER_LAYER
      ):
        out[f"model.layers.{parts[1]}.{_PER_LAYER[parts[2]]}"] = name
        continue
      raise CheckpointError(f"{self.path}: unexpected tensor {name}")
    return out


def _decimal(value: float) -> float:
  """A float32 from the metadata as the decimal it was written from
  (9.9999997e-06 -> 1e-05): the shortest that rounds to it."""
  return float(str(np.float32(value)))


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
  """Rows of ``w`` ``[heads * head_dim, in]`` from llama.cpp's order back
  to Hugging Face's: within a head llama.cpp interleaves the two halves
  (row ``2i`` is Hugging Face's ``i``, row ``2i + 1`` its
  ``head_dim / 2 + i``)."""
  rows = w.shape[0]
  half = rows // heads // 2
  return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def open_file(path: str) -> GGUFFile:
  """``GGUFFile(path)``, opened once per process while the file is
  unchanged: gguf's reader parses every metadata field when it opens a
  file (SmolLM2's vocabulary and merges: seconds), and a run reads the
  config, the tokenizer and the weights."""
  stat = os.stat(path) if os.path.isfile(path) else None
  key = (stat.st_mtime_ns, stat.st_size) if stat else None
  return _opened(path, key) if key else GGUFFile(path)


@functools.lru_cache(maxsize=2)
def _opened(path: str, version: tuple[int, int]) -> GGUFFile:
  del version  # the cache's key: a rewritten file is opened again
  return GGUFFile(path)


def read_config(path: str) -> ModelConfig:
  return open_file(path).config()


def load(
  path: str,
  *,
  dtype: str = "float32",
  param_dtype: str | None = None,
  value_head: bool = False,
  shardings: Any = None,
) -> Transformer:
  """Reads a GGUF file into a ``Transformer``, as ``hf.load`` does a
  directory (the same arguments; parameters are float32 unless
  ``param_dtype`` says otherwise).

  Raises:
    CheckpointError: naming the file and the tensor or metadata key that
      is missing, unexpected, of the wrong shape, or not supported.
  """
  f = open_file(path)
  return hf.load_tensors(
    f.config(),
    f.tensors(),
    path,
    "its metadata",
    dtype=dtype,
    param_dtype=param_dtype,
    value_head=value_head,
    shardings=shardings,
  )


def tokenizer(path: str) -> tokenizer_lib.Tokenizer:
  """The file's tokenizer: a byte-level BPE from ``tokenizer.ggml.*``
  (tokens, merges, token types, the pre-tokenizer's name, end of text)
  and its chat template (``Tokenizer.chat_template``).

  Raises:
    CheckpointError: a tokenizer that is not byte-level BPE, an unknown
      pre-tokenizer, or missing metadata, naming the file and key.
  """
  f = open_file(path)
  kind = f.value("tokenizer.ggml.model")
  if kind != "gpt2":
    raise CheckpointError(
      f"{path}: tokenizer.ggml.model={kind!r}; only byte-level BPE "
      "('gpt2') is supported"
    )
  pre = f.value("tokenizer.ggml.pre", "default")
  if pre not in PRE_TOKENIZERS:
    raise CheckpointError(
      f"{path}: tokenizer.ggml.pre={pre!r} is not supported; supported: "
      f"{', '.join(sorted(PRE_TOKENIZERS))}"
    )
  tokens = f.value("tokenizer.ggml.tokens")
  types = f.value("tokenizer.ggml.token_type", [1] * len(tokens))
  merges = [tuple(m.split(" ", 1)) for m in f.value("tokenizer.ggml.merges")]
  eos = int(f.value("tokenizer.ggml.eos_token_id"))
  if not 0 <= eos < len(tokens):
    raise CheckpointError(
      f"{path}: tokenizer.ggml.eos_token_id={eos} is not one of its "
      f"{len(tokens)} tokens"
    )
  tok = tokenizers.Tokenizer(
    models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
  )
  tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
  tok.decoder = decoders.ByteLevel()
  if len(types) != len(tokens):
    raise CheckpointError(
      f"{path}: tokenizer.ggml.token_type has {len(types)} entries for "
      f"{len(tokens)} tokens"
    )
  kinds = list(zip(tokens, types, strict=True))
  special = [t for t, k in kinds if k == CONTROL]
  added = [t for t, k in kinds if k == USER_DEFINED]
  tok.add_special_tokens([AddedToken(t, normalized=False) for t in special])
  tok.add_tokens([AddedToken(t, normalized=False) for t in added])
  try:
    return tokenizer_lib.Tokenizer(
      tok, tokens[eos], path, f.value("tokenizer.chat_template", "")
    )
  except tokenizer_lib.TokenizerError as e:
    raise CheckpointError(str(e)) from None
