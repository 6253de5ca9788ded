"""Tunix's side of the logit check, run in Tunix's own environment:
its Qwen2 model loaded with its own safetensors loader from a checkpoint
directory (``config.json`` + ``model.safetensors``, as ``hf.save``
writes), applied to ``tokens.npy`` (``[B, L]`` int32), logits written to
``--out`` (``[B, L, V]`` float32).

  .venv/bin/python benchmarks/compare/tunix/logits.py CKPT tokens.npy out.npy

Imports nothing from starpo_jax (this environment does not have it).
"""

from __future__ import annotations

import json
import os
import sys

import jax.numpy as jnp
import numpy as np
from tunix.models.qwen2 import model as qwen2
from tunix.models.qwen2 import params as qwen2_params


def model_config(ckpt: str) -> qwen2.ModelConfig:
  """Tunix's config for a Hugging Face Qwen2 ``config.json``."""
  with open(os.path.join(ckpt, "config.json")) as f:
    hf = json.load(f)
  if hf["model_type"] != "qwen2":
    raise SystemExit(f"{ckpt}: model_type {hf['model_type']!r}, not qwen2")
  return qwen2.ModelConfig(
    num_layers=hf["num_hidden_layers"],
    vocab_size=hf["vocab_size"],
    embed_dim=hf["hidden_size"],
    hidden_dim=hf["intermediate_size"],
    num_heads=hf["num_attention_heads"],
    head_dim=hf["head_dim"],
    num_kv_heads=hf["num_key_value_heads"],
    rope_theta=int(hf["rope_theta"]),
    norm_eps=hf["rms_norm_eps"],
    use_tied_embedding=hf["tie_word_embeddings"],
  )


def main(ckpt: str, tokens_path: str, out: str) -> None:
  model = qwen2_params.create_model_from_safe_tensors(
    ckpt, model_config(ckpt), dtype=jnp.float32
  )
  tokens = jnp.asarray(np.load(tokens_path), jnp.int32)
  b, length = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(length), (b, length))
  causal = jnp.tril(jnp.ones((length, length), bool))
  mask = jnp.broadcast_to(causal, (b, length, length))
  logits, _ = model(tokens, positions, None, mask)
  np.save(out, np.asarray(logits, np.float32))


if __name__ == "__main__":
  main(*sys.argv[1:])
