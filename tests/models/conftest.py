"""Tiny Hugging Face checkpoints made by ``transformers`` (nothing is
downloaded), shared by the model tests."""

from __future__ import annotations

import pytest
import torch
import transformers

VOCAB = 97


def _save(model, path) -> str:
  model.save_pretrained(path)
  return str(path)


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory) -> str:
  """Qwen2 with q/k/v biases and an untied head, random weights."""
  torch.manual_seed(0)
  cfg = transformers.Qwen2Config(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rope_theta=1_000_000.0,
    tie_word_embeddings=False,
    initializer_range=0.3,
  )
  model = transformers.Qwen2ForCausalLM(cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias"):
        p.normal_(0.0, 0.3)
  return _save(model, tmp_path_factory.mktemp("qwen2"))


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> str:
  """Llama with tied embeddings, Llama 3 RoPE scaling and head_dim != D/H."""
  torch.manual_seed(1)
  cfg = transformers.LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=True,
    rope_theta=500_000.0,
    rope_scaling={
      "rope_type": "llama3",
      "factor": 8.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 32,
    },
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    initializer_range=0.3,
  )
  model = transformers.LlamaForCausalLM(cfg).eval()
  return _save(model, tmp_path_factory.mktemp("llama"))


@pytest.fixture(params=["qwen2", "llama"])
def hf_dir(request, qwen2_dir, llama_dir) -> str:
  return {"qwen2": qwen2_dir, "llama": llama_dir}[request.param]


def torch_logits(path: str, tokens) -> torch.Tensor:
  model = transformers.AutoModelForCausalLM.from_pretrained(
    path, dtype=torch.float32
  ).eval()
  with torch.no_grad():
    return model(torch.as_tensor(tokens)).logits.numpy()
